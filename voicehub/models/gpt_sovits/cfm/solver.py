"""Fixed-step Euler solver of the v3 flow matching, as free functions.

`euler_step` is the unit a runtime can graph-capture: tensors in, tensor out, no Python branch
on tensor values. `solve` is the loop upstream's `CFM.inference` runs (classifier-free
guidance off, as every v3 inference path calls it): the prompt frames are zero in x before the
first step and after every step, the text embedding is computed once and the step-size
embedding once per distinct step size. The step sizes come from the estimator's schedule
(cfm/schedule.py): upstream's equal steps unless an optimization changed it.

`solve_bucketed` is `solve` right-padded to a multiple of FRAME_BUCKET frames and masked: cuDNN builds
its convolution and attention plans per input shape (a DiT forward at a never-seen length cost the H200
~200 ms more than at a seen one, benchmarks/results/dit_length_probe_h200.json), so eager solves of
every length reach it at a few shapes, those of the streamed path's CFM graphs (acoustic_graphs.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from voicehub.models.gpt_sovits.cfm.dit import DiT
from voicehub.models.gpt_sovits.cfm.schedule import BlockReuse
from voicehub.runtime.kv_cache import round_up

FRAME_BUCKET = 64  # frames: bucketed solves, and the streamed path's CFM graphs, pad to a multiple


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
    reuse: BlockReuse | None = None,
) -> torch.Tensor:
    """One step x <- (x + dt * v(x, t)) * keep.

    x, prompt_x: [B, mel, N]; text_emb: [B, N, text_dim]; d_emb: [B, dim]; t: [B] current time;
    dt: [] or [B, 1, 1] step size; keep: [1 or B, 1, N], 0 on prompt frames and 1 elsewhere;
    mask: [B, N] valid frames or None when all are; reuse: the solve's step-cache state or None.
    Returns the new x [B, mel, N].
    """
    v = estimator(x.transpose(1, 2), prompt_x.transpose(1, 2), text_emb, t, d_emb, mask, reuse)
    return (x + dt * v.transpose(1, 2)) * keep


def solve(
    estimator: DiT,
    mu: torch.Tensor,
    prompt: torch.Tensor,
    noise: torch.Tensor,
    n_steps: int,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Integrate from noise at t=0 to a normalised mel at t=1 on the estimator's schedule.

    mu: [B, N, text_dim] condition features; prompt: [B, mel, P] normalised prompt mel that
    occupies the first P frames; noise: [B, mel, N] standard normal (times the temperature).
    `n_steps` is the requested count: `estimator.schedule` (uniform unless an optimization changed
    it) turns it into the step sizes, and `estimator.step_cache` (None unless an optimization set
    it) says which steps reuse deep-block work. Returns [B, mel, N]; its first P frames are zero.
    """
    n, p = noise.shape[-1], prompt.shape[-1]
    prompt_x = torch.zeros_like(noise)
    prompt_x[..., :p] = prompt[..., :p]
    keep = torch.ones(1, 1, n, device=noise.device, dtype=noise.dtype)
    keep[..., :p] = 0
    return solve_padded(estimator, mu, prompt_x, keep, noise, n_steps, mask)


def padded_frames(n_frames: int, bucket: int = FRAME_BUCKET) -> int:
    """The frame bucket of an n_frames solve: the next multiple of `bucket` (no largest bucket)."""
    return round_up(n_frames, bucket)


def solve_bucketed(
    estimator: DiT,
    mu: torch.Tensor,
    prompt: torch.Tensor,
    noise: torch.Tensor,
    n_steps: int,
    bucket: int = FRAME_BUCKET,
) -> torch.Tensor:
    """`solve` (same arguments, same result up to float rounding) run at `padded_frames(N)` frames: mu
    and noise are right-padded with zeros, and the mask keeps the padding out of every valid frame
    (cfm/dit.py). The caller draws the noise at N frames, so a seed gives `solve`'s draws. The mask is
    passed even when N is a bucket multiple, so every call takes the masked kernels, as the graphs do.
    Returns [B, mel, N]."""
    # mu: [B, N, text_dim]; prompt: [B, mel, P] with P < N; noise: [B, mel, N]
    b, n, p = noise.shape[0], noise.shape[-1], prompt.shape[-1]
    width = padded_frames(n, bucket)
    prompt_x = noise.new_zeros(b, noise.shape[1], width)
    prompt_x[..., :p] = prompt[..., :p]
    keep = noise.new_zeros(1, 1, width)
    keep[..., p:n] = 1
    mask = (torch.arange(width, device=noise.device) < n).repeat(b, 1)  # [B, width]
    mu, noise = F.pad(mu, (0, 0, 0, width - n)), F.pad(noise, (0, width - n))
    return solve_padded(estimator, mu, prompt_x, keep, noise, n_steps, mask)[..., :n]


def solve_padded(
    estimator: DiT,
    mu: torch.Tensor,
    prompt_x: torch.Tensor,
    keep: torch.Tensor,
    noise: torch.Tensor,
    n_steps: int,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """`solve` with the layout given per row, so rows with other prompt lengths (and right padding)
    share a batch: prompt_x [B, mel, N] holds each row's normalised prompt mel in its prompt frames
    and 0 elsewhere; keep [1 or B, 1, N] is 0 on prompt frames and padding, 1 on the frames to
    solve; mask [B, N] marks the valid frames (None: all). Returns x [B, mel, N], 0 where keep is 0.
    """
    if n_steps < 1:
        raise ValueError(f"sample_steps must be >= 1, got {n_steps}")
    b = noise.shape[0]
    x = noise.masked_fill(keep == 0, 0.0)
    steps = estimator.schedule(n_steps)
    text_emb, by_size = _step_embeddings(estimator, mu, steps, b, mask)
    cache = estimator.step_cache
    reuse = BlockReuse(cache.start_block(len(estimator.transformer_blocks))) if cache is not None else None
    reuses = cache.reuses(len(steps)) if cache is not None else (False,) * len(steps)
    t = 0.0
    for d, is_reusing in zip(steps, reuses, strict=True):
        # t accumulates as a Python float, like upstream, so step times match bit for bit.
        t_tensor = torch.full((b,), t, device=x.device, dtype=mu.dtype)
        dt = torch.full((), d, device=x.device, dtype=x.dtype)  # a fill, not a host copy: capturable
        if reuse is not None:
            reuse.is_reusing = is_reusing
        x = euler_step(estimator, x, prompt_x, text_emb, by_size[d], t_tensor, dt, keep, mask, reuse)
        t = t + d
    return x


def _step_embeddings(
    estimator: DiT, mu: torch.Tensor, steps: tuple[float, ...], b: int, mask: torch.Tensor | None
) -> tuple[torch.Tensor, dict[float, torch.Tensor]]:
    """The text embedding [B, N, text_dim] and one step-size embedding [B, dim] per distinct size."""
    sizes = list(dict.fromkeys(steps))
    fill = lambda d: torch.full((b,), d, device=mu.device, dtype=mu.dtype)  # noqa: E731
    text_emb, first = estimator.condition(mu, fill(sizes[0]), mask)
    return text_emb, {sizes[0]: first} | {d: estimator.d_embed(fill(d)) for d in sizes[1:]}
