"""A decode step's sampling and per-row bookkeeping after the logits, as one op.

Op signature (every backend): `f(logits, q, buf, state, lengths, *, eos, n_blocked, max_steps) -> tokens`:
- logits: [B, V'] in the model's dtype, V' the full vocabulary V, or V' = eos when the caller drops the
  EOS column (the first steps, forced rows: upstream's narrowed draw); a column eos < V' is EOS;
- q: [B, >= V'] Exp(1) noise for the race, drawn by the caller (only the first V' columns are read).
  The race runs in q's dtype: the logits' dtype for a generator draw (`torch.empty_like(probs)
  .exponential_`, so the RNG stream is the eager path's), float32 for per-row noise (`row_rng`);
- buf: `SamplingBuffers` (seen [B, V] bool, top_k, top_p, temperature, repetition_penalty per row);
- state: the per-row decode state, an object with tensors tokens, audio_pos, step, cap, stop_step
  (long [B]), forced, done, stop_eos (bool [B]) and out [B, max_out] long;
- lengths: [B] long KV lengths, or None. With lengths, rows live at the start of the step (not done)
  advance lengths and state.audio_pos by one (the whole tail of a decode step); without, neither;
- eos: the EOS id; n_blocked: steps with EOS blocked (a row is blocked when forced or step < n_blocked;
  blocked rows get EOS = -inf when the column is present); max_steps: the step loop's length.

Per row: repetition penalty on seen tokens, nucleus (top-p), temperature, top-k, softmax, the race
argmax(probs / q) (`runtime/sampling.py`), then stop decisions: EOS (the token, or the argmax of the
penalized logits, is EOS and the row is not blocked), the cap (forced rows after cap tokens, others
after cap + 1 or at the last step), out[row, step] written for live rows, stop_step / stop_eos /
done set where a live row stops, seen and tokens updated for every row, step advanced for rows not
done after it. `sample_step_reference` is the definition: `sampling`'s penalty, filters and race
followed by the T2S decoder's state update (`static.sample_step`, held equal to it by the tests).
"""

from __future__ import annotations

from typing import Any

import torch

from voicehub.runtime.sampling import SamplingBuffers, filtered_probs, penalize_repeats


def sample_step_reference(
    logits: torch.Tensor,
    q: torch.Tensor,
    buf: SamplingBuffers,
    state: Any,
    lengths: torch.Tensor | None,
    *,
    eos: int,
    n_blocked: int,
    max_steps: int,
) -> torch.Tensor:
    """The definition (see the module docstring). logits: [B, V']; q: [B, >= V'] -> tokens [B] long."""
    blocked = state.forced | (state.step < n_blocked)
    if eos < logits.shape[1]:
        logits = logits.clone()
        logits[:, eos] = logits[:, eos].masked_fill(blocked, float("-inf"))
    penalized = penalize_repeats(logits, buf.seen[:, : logits.shape[1]], buf.repetition_penalty)
    probs = filtered_probs(penalized, buf)
    q = q[:, : logits.shape[1]]
    # sampling.draw: probs / q in the draw's own dtype, or in float32 against row_rng's noise
    tokens = torch.argmax(probs.to(q.dtype) / q, dim=-1)
    active = ~state.done
    record_step(state, buf, tokens, penalized, blocked, eos=eos, max_steps=max_steps)
    if lengths is not None:
        lengths.add_(active.long())
        state.audio_pos.add_(active.long())
    return tokens


def record_step(
    state: Any,
    buf: SamplingBuffers,
    tokens: torch.Tensor,
    penalized: torch.Tensor,
    blocked: torch.Tensor,
    *,
    eos: int,
    max_steps: int,
    rows: torch.Tensor | None = None,
) -> None:
    """The per-row bookkeeping after a draw (see the module docstring): stop decisions, out, seen,
    tokens, step. tokens: [B] long; penalized: [B, V'] logits after the penalty; blocked: [B] bool,
    EOS blocked; rows: arange(B) when the caller keeps one (a captured step saves a kernel)."""
    is_eos = ~blocked & ((tokens == eos) | (penalized.argmax(dim=-1) == eos))
    n_sampled = state.step + 1
    hit_cap = torch.where(
        state.forced, n_sampled >= state.cap, (n_sampled > state.cap) | (state.step == max_steps - 1)
    )
    active = ~state.done
    if rows is None:
        rows = torch.arange(tokens.shape[0], device=tokens.device)
    col = state.step.clamp(max=state.out.shape[1] - 1)
    state.out[rows, col] = torch.where(active, tokens, state.out[rows, col])
    newly_done = active & (is_eos | hit_cap)
    state.stop_step.copy_(torch.where(newly_done, state.step, state.stop_step))
    state.stop_eos.copy_(torch.where(newly_done, is_eos, state.stop_eos))
    state.done.logical_or_(newly_done)
    buf.mark_seen(tokens)
    state.tokens.copy_(tokens)
    state.step.add_((~state.done).long())
