"""Fixed-step Euler solver of the v3 flow matching, as free functions.

`euler_step` is the unit a runtime can graph-capture: tensors in, tensor out, no Python branch
on tensor values. `solve` is the eager loop upstream's `CFM.inference` runs (classifier-free
guidance off, as every v3 inference path calls it): the prompt frames are zero in x before the
first step and after every step, and the text and step-size embeddings are computed once.
"""

from __future__ import annotations

import torch

from voicehub.models.gpt_sovits.cfm.dit import DiT


def euler_step(
    estimator: DiT,
    x: torch.Tensor,
    prompt_x: torch.Tensor,
    text_emb: torch.Tensor,
    d_emb: torch.Tensor,
    t: torch.Tensor,
    dt: torch.Tensor,
    keep: torch.Tensor,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """One step x <- (x + dt * v(x, t)) * keep.

    x, prompt_x: [B, mel, N]; text_emb: [B, N, text_dim]; d_emb: [B, dim]; t: [B] current time;
    dt: [] or [B, 1, 1] step size; keep: [1 or B, 1, N], 0 on prompt frames and 1 elsewhere;
    mask: [B, N] valid frames or None when all are. Returns the new x [B, mel, N].
    """
    v = estimator(x.transpose(1, 2), prompt_x.transpose(1, 2), text_emb, t, d_emb, mask)
    return (x + dt * v.transpose(1, 2)) * keep


def solve(
    estimator: DiT,
    mu: torch.Tensor,
    prompt: torch.Tensor,
    noise: torch.Tensor,
    n_steps: int,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Integrate from noise at t=0 to a normalised mel at t=1 in `n_steps` equal steps.

    mu: [B, N, text_dim] condition features; prompt: [B, mel, P] normalised prompt mel that
    occupies the first P frames; noise: [B, mel, N] standard normal (times the temperature).
    Returns [B, mel, N]; its first P frames are zero (callers drop them).
    """
    if n_steps < 1:
        raise ValueError(f"sample_steps must be >= 1, got {n_steps}")
    b, _, n = noise.shape
    p = prompt.shape[-1]
    x = noise.clone()
    x[..., :p] = 0
    prompt_x = torch.zeros_like(x)
    prompt_x[..., :p] = prompt[..., :p]
    keep = torch.ones(1, 1, n, device=x.device, dtype=x.dtype)
    keep[..., :p] = 0
    d = 1 / n_steps
    d_tensor = torch.full((b,), d, device=x.device, dtype=mu.dtype)
    text_emb, d_emb = estimator.condition(mu, d_tensor)
    dt = torch.full((), d, device=x.device, dtype=x.dtype)  # a fill, not a host copy: capturable
    t = 0.0
    for _ in range(n_steps):
        # t accumulates as a Python float, like upstream, so step times match bit for bit.
        t_tensor = torch.full((b,), t, device=x.device, dtype=mu.dtype)
        x = euler_step(estimator, x, prompt_x, text_emb, d_emb, t_tensor, dt, keep, mask)
        t = t + d
    return x
