"""Token sampling on the device with per-row parameters held in tensors (no host sync, no branches).

The math is the one GPT-SoVITS and gpt-fast use, in this order: repetition penalty over every token
seen so far (prompt included), nucleus (top-p) filtering, temperature, top-k, softmax, then the
exponential race `argmax(probs / q)`, q ~ Exp(1). A row with top_p >= 1 skips nucleus filtering,
exactly as a scalar `if top_p < 1` would. Arithmetic with a parameter is done in float32 and
rounded back to the logits' dtype, which is what a half tensor times a Python scalar does, so the
values match a scalar implementation in float16 as well as float32.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

TEMPERATURE_FLOOR = 1e-5  # temperature 0 means "as greedy as the floor allows", as in the scalar code


@dataclass
class SamplingBuffers:
    """Per-row sampling state, allocated once. top_k: [B] long; top_p, temperature,
    repetition_penalty: [B] float32; seen: [B, V] bool, tokens the repetition penalty applies to."""

    top_k: torch.Tensor
    top_p: torch.Tensor
    temperature: torch.Tensor
    repetition_penalty: torch.Tensor
    seen: torch.Tensor

    @classmethod
    def allocate(cls, batch: int, vocab_size: int, device: torch.device | str) -> SamplingBuffers:
        def f32(value: float) -> torch.Tensor:
            return torch.full((batch,), value, dtype=torch.float32, device=device)

        return cls(
            top_k=torch.full((batch,), vocab_size, dtype=torch.long, device=device),
            top_p=f32(1.0),
            temperature=f32(1.0),
            repetition_penalty=f32(1.0),
            seen=torch.zeros(batch, vocab_size, dtype=torch.bool, device=device),
        )

    def narrow(self, n_rows: int) -> SamplingBuffers:
        """A view of rows [0, n_rows) sharing storage."""
        return SamplingBuffers(*(getattr(self, f.name)[:n_rows] for f in fields(self)))

    def set_row(
        self,
        row: int,
        *,
        top_k: int,
        top_p: float,
        temperature: float,
        repetition_penalty: float,
        seen_tokens: torch.Tensor,
    ) -> None:
        """Load one request's parameters; seen_tokens: [L] long, tokens already in its context."""
        self.top_k[row] = max(1, min(int(top_k), self.seen.shape[1]))
        self.top_p[row] = top_p
        self.temperature[row] = max(temperature, TEMPERATURE_FLOOR)
        self.repetition_penalty[row] = repetition_penalty
        self.seen[row] = False
        self.seen[row, seen_tokens.to(self.seen.device).long()] = True

    def mark_seen(self, tokens: torch.Tensor) -> None:
        """tokens: [B] long, each row's newest token."""
        self.seen.scatter_(1, tokens.unsqueeze(1), True)


def penalize_repeats(logits: torch.Tensor, seen: torch.Tensor, penalty: torch.Tensor) -> torch.Tensor:
    """Divide positive / multiply negative logits of seen tokens by the row's penalty.
    logits: [B, V]; seen: [B, V] bool; penalty: [B] float32 -> [B, V] in logits.dtype."""
    p = penalty.unsqueeze(1)
    scaled = torch.where(logits < 0, logits * p, logits / p).to(logits.dtype)
    return torch.where(seen, scaled, logits)


def filtered_probs(logits: torch.Tensor, buf: SamplingBuffers) -> torch.Tensor:
    """Top-p, temperature, top-k, softmax. logits: [B, V] (already penalized) -> probs [B, V]."""
    neg_inf = float("-inf")
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    cum = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
    top_p = buf.top_p.unsqueeze(1)
    remove_sorted = (cum > top_p.to(cum.dtype)) & (top_p < 1.0)
    remove_sorted[:, 0] = False  # the most likely token always stays (no shift of the mask)
    logits = logits.masked_fill(remove_sorted.scatter(1, order, remove_sorted), neg_inf)
    logits = (logits / buf.temperature.unsqueeze(1)).to(logits.dtype)
    # k-th largest after temperature; sorting again keeps ties and -inf exactly as topk would
    k = buf.top_k.clamp(max=logits.shape[1]) - 1  # the vocabulary may be narrowed (see `sample`)
    kth = torch.sort(logits, dim=-1, descending=True).values.gather(1, k.unsqueeze(1))
    logits = torch.where(logits < kth, neg_inf, logits)
    return torch.softmax(logits, dim=-1)


def draw(
    probs: torch.Tensor, generator: torch.Generator | None = None, noise: torch.Tensor | None = None
) -> torch.Tensor:
    """Exponential race: argmax(probs / q), q ~ Exp(1), one draw per entry. probs: [B, V] -> [B] long.
    Equivalent to a multinomial draw but with no host sync and a fixed amount of RNG per call.
    noise: precomputed q [B, >= V] (per-row streams, `runtime/row_rng.py`); the race then runs in
    float32 and `generator` is not used."""
    if noise is not None:
        return torch.argmax(probs.float() / noise[:, : probs.shape[1]], dim=-1)
    q = torch.empty_like(probs).exponential_(1, generator=generator)
    return torch.argmax(probs / q, dim=-1)


def sample(
    logits: torch.Tensor,
    buf: SamplingBuffers,
    generator: torch.Generator | None = None,
    noise: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The whole chain. logits: [B, V'] -> (tokens [B] long, penalized logits [B, V']).

    V' may be smaller than the buffers' vocabulary (a caller that drops trailing ids); the noise
    draw is then V' wide, as it would be for a scalar implementation given the narrowed logits.
    noise: see `draw`. Does not update `buf.seen`; the caller marks tokens it keeps."""
    penalized = penalize_repeats(logits, buf.seen[:, : logits.shape[1]], buf.repetition_penalty)
    return draw(filtered_probs(penalized, buf), generator, noise), penalized
