"""The sampling step (`sample_step.py`) as one Triton kernel: one program per row, the vocabulary
(<= 2048 wide) in registers.

The torch chain is ~45 small kernels (two sorts, a scatter, softmaxes, the race, a dozen state
updates); at one row each costs its launch, so they take about a third of a graphed T2S step.

No sort: both cuts are thresholds found by bisection over the float order (the top 19 bits of a
float32 key in float16, 32 in float32; top-p one block reduction a bit, top-k one a two bits, three
counts packed in an int64): top-p keeps the tokens whose
tail sum (the probabilities of tokens at or above them, torch's cumsum over the sorted row) is
<= top_p, the top token always; top-k keeps the temperature-scaled values >= the k-th largest kept
value scaled, as torch compares them. Differences from the definition, by construction:
- where tokens tie exactly at the top-p cut, torch keeps the ones its sort put first, this kernel
  all or none of them; such a step is a near-tie with boundary margin 0 (`decode.boundary_margin`);
- sums (softmaxes, the tail sums) add in another order than torch's kernels; every value torch
  stores in the logits' dtype is rounded to it here too (`.to(dtype).to(tl.float32)`), so results
  in float16 differ only where a rounding lands on the other side of a cut or a race (near-ties).
Divisions are correctly rounded (`div_rn`) as torch's are; exp is Triton's.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from voicehub.runtime.sampling import SamplingBuffers

MAX_VOCAB = 2048  # one program holds a row's logits and probabilities in registers
# float32 bits that can differ between values stored in the dtype (sign, exponent, mantissa): the
# bisections over the float order only search these
KEY_BITS = {torch.float32: 32, torch.float16: 19, torch.bfloat16: 16}


@triton.jit
def _key(x):
    # float32 -> int64 in [0, 2**32) with the float order (-0.0 is made +0.0 first)
    bits = (x + 0.0).to(tl.int32, bitcast=True)
    return tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF).to(tl.int64) + 2147483648


@triton.jit
def _kth_largest(x, valid, k, KEY_BITS: tl.constexpr):
    # the (k+1)-th largest valid entry of x: the largest kappa with #(keys >= kappa) > k, searched
    # over the top KEY_BITS bits (rounded up to even; the others are equal for every value of the
    # dtype) two bits a round: the counts of the round's three candidates past lo (each <= MAX_VOCAB,
    # 16 bits of one int64) in one block reduction, the next two bits the number of them > k (the
    # counts fall as the candidate grows); then the smallest entry at or above it
    keys = tl.where(valid, _key(x), -1)  # an invalid entry is below every candidate
    lo = tl.zeros((), tl.int64)
    for i in tl.static_range((KEY_BITS + 1) // 2):
        step = tl.full((), 1 << (30 - 2 * i), tl.int64)
        packed = (
            (keys >= (lo | step)).to(tl.int64)
            + ((keys >= (lo | 2 * step)).to(tl.int64) << 16)
            + ((keys >= (lo | 3 * step)).to(tl.int64) << 32)
        )
        counts = tl.sum(packed, axis=0)
        above = ((counts & 0xFFFF) > k).to(tl.int64) + (((counts >> 16) & 0xFFFF) > k).to(tl.int64)
        lo = lo | ((above + ((counts >> 32) > k).to(tl.int64)) * step)
    return tl.min(tl.where(keys >= lo, x, float("inf")), axis=0)


@triton.jit
def _nucleus_key(keys, probs, top_p, KEY_BITS: tl.constexpr, dtype: tl.constexpr):
    # the smallest key whose tail sum (probabilities of keys >= it, rounded to dtype) is <= top_p;
    # 0 (keep all) when even the whole sum is
    lo = tl.zeros((), tl.int64)
    for i in tl.static_range(KEY_BITS):
        cand = lo | (1 << (31 - i))
        tail = tl.sum(tl.where(keys >= cand, probs, 0.0), axis=0).to(dtype).to(tl.float32)
        lo = tl.where(tail > top_p, cand, lo)
    whole = tl.sum(probs, axis=0).to(dtype).to(tl.float32)
    return tl.where(whole > top_p, lo + (1 << (32 - KEY_BITS)), 0)


@triton.jit
def _sample_step_kernel(
    logits_ptr, q_ptr, seen_ptr, top_k_ptr, top_p_ptr, temp_ptr, pen_ptr,
    tokens_ptr, audio_pos_ptr, step_ptr, cap_ptr, stop_step_ptr, forced_ptr, done_ptr, stop_eos_ptr,
    out_ptr, len_ptr, n_vocab, eos, n_blocked, max_steps, max_out, s_logits, s_q, s_seen, s_out,
    HAS_EOS: tl.constexpr, ADVANCE: tl.constexpr, BLOCK_V: tl.constexpr, KEY_BITS: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0)
    dtype = logits_ptr.dtype.element_ty
    cols = tl.arange(0, BLOCK_V)
    valid = cols < n_vocab
    step = tl.load(step_ptr + b)
    forced = tl.load(forced_ptr + b) != 0
    done = tl.load(done_ptr + b) != 0
    blocked = forced | (step < n_blocked)
    x = tl.load(logits_ptr + b * s_logits + cols, mask=valid, other=float("-inf")).to(tl.float32)
    if HAS_EOS:
        x = tl.where((cols == eos) & blocked, float("-inf"), x)
    # repetition penalty: float32 math rounded to the logits' dtype, as a half tensor times a float one
    p = tl.load(pen_ptr + b)
    seen = tl.load(seen_ptr + b * s_seen + cols, mask=valid, other=0) != 0
    scaled = tl.where(x < 0, x * p, tl.math.div_rn(x, p)).to(dtype).to(tl.float32)
    pen = tl.where(seen, scaled, x)
    pen_top = tl.argmax(pen, axis=0, tie_break_left=True)
    # top-p: the tail sums of the sorted probabilities (torch's cumsum) by bisection over the keys
    keys = _key(pen)
    e = tl.exp(pen - tl.max(pen, axis=0))
    p_all = (e / tl.sum(e, axis=0)).to(dtype).to(tl.float32)
    top_p = tl.load(top_p_ptr + b)
    cut = tl.zeros((), tl.int64)
    if top_p < 1.0:
        cut = tl.minimum(_nucleus_key(keys, p_all, top_p.to(dtype).to(tl.float32), KEY_BITS, dtype),
                         tl.max(keys, axis=0))  # fmt: skip
    kept = tl.where(keys >= cut, pen, float("-inf"))
    # top-k on the temperature-scaled values, whose k-th largest is the k-th largest kept value scaled
    # (rounding may tie scaled values: torch compares those, and so does this)
    temp = tl.load(temp_ptr + b)
    k = tl.minimum(tl.load(top_k_ptr + b).to(tl.int32), n_vocab) - 1
    kth = tl.max(kept, axis=0)
    if k > 0:
        kth = _kth_largest(kept, valid, k, KEY_BITS)
    kth = tl.math.div_rn(kth, temp).to(dtype).to(tl.float32)
    t = tl.math.div_rn(kept, temp).to(dtype).to(tl.float32)
    t = tl.where(t >= kth, t, float("-inf"))
    e = tl.exp(t - tl.max(t, axis=0))
    probs = (e / tl.sum(e, axis=0)).to(dtype).to(tl.float32)
    # the race in q's dtype
    q = tl.load(q_ptr + b * s_q + cols, mask=valid, other=1.0)
    r = tl.math.div_rn(probs, q.to(tl.float32)).to(q_ptr.dtype.element_ty).to(tl.float32)
    token = tl.argmax(tl.where(valid, r, -1.0), axis=0, tie_break_left=True)
    # stop decisions and bookkeeping (static.sample_step, cache.advance, the audio position)
    is_eos = ~blocked & ((token == eos) | (pen_top == eos))
    cap = tl.load(cap_ptr + b)
    hit_cap = tl.where(forced, step + 1 >= cap, (step + 1 > cap) | (step == max_steps - 1))
    active = ~done
    newly_done = active & (is_eos | hit_cap)
    tl.store(out_ptr + b * s_out + tl.minimum(step, max_out - 1), token.to(tl.int64), mask=active)
    tl.store(stop_step_ptr + b, step, mask=newly_done)
    tl.store(stop_eos_ptr + b, is_eos, mask=newly_done)
    done_after = done | newly_done
    tl.store(done_ptr + b, done_after)
    tl.store(seen_ptr + b * s_seen + token, 1)
    tl.store(tokens_ptr + b, token.to(tl.int64))
    tl.store(step_ptr + b, step + tl.where(done_after, 0, 1))
    if ADVANCE:
        live = tl.where(active, 1, 0)
        tl.store(len_ptr + b, tl.load(len_ptr + b) + live)
        tl.store(audio_pos_ptr + b, tl.load(audio_pos_ptr + b) + live)


def sample_step_triton(
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
    """The `triton` backend (see `sample_step.py`): logits [B, V'], q [B, >= V'] -> state.tokens [B]."""
    n_rows, n_vocab = logits.shape
    if n_vocab > MAX_VOCAB or q.shape[0] != n_rows or q.shape[1] < n_vocab or buf.seen.shape[1] < n_vocab:
        raise ValueError(
            f"sample_step_triton: logits {tuple(logits.shape)} (at most {MAX_VOCAB} wide), noise "
            f"{tuple(q.shape)} and seen {tuple(buf.seen.shape)} must cover the same rows and vocabulary"
        )
    if logits.stride(1) != 1 or q.stride(1) != 1 or buf.seen.stride(1) != 1 or state.out.stride(1) != 1:
        raise ValueError("sample_step_triton: logits, noise, seen and out need a unit last stride")
    lens = lengths if lengths is not None else state.step  # not read without ADVANCE
    _sample_step_kernel[(n_rows,)](
        logits, q, buf.seen, buf.top_k, buf.top_p, buf.temperature, buf.repetition_penalty,
        state.tokens, state.audio_pos, state.step, state.cap, state.stop_step, state.forced, state.done,
        state.stop_eos, state.out, lens, n_vocab, eos, n_blocked, max_steps, state.out.shape[1],
        logits.stride(0), q.stride(0), buf.seen.stride(0), state.out.stride(0),
        HAS_EOS=eos < n_vocab, ADVANCE=lengths is not None, BLOCK_V=triton.next_power_of_2(n_vocab),
        KEY_BITS=KEY_BITS[logits.dtype],
        num_warps=8 if n_vocab > 1024 else 4,
    )  # fmt: skip
    return state.tokens
