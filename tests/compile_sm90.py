"""Compile the T2S step's Triton kernels for Hopper (sm_90) with no GPU: Triton's front end and ptxas.

The many-row stack (the v3 table's config, its GEMM kernels again at each pipelining depth its bucket
changes use; PDL early and late on one kernel; the ticketed FFN and attention + out-projection; its
embedding kernel), the one-row stack (its table's config at one row, layer 0 gathering the embedding or
not), the per-row noise and the fused sampler.

Run by `test_kernels_compile_sm90.py` in a process of its own (the CPU tests import these modules under
TRITON_INTERPRET=1, where `triton.jit` gives interpreted functions that do not compile). Prints one line
a kernel; any compile error raises.
"""

from __future__ import annotations

import inspect

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from voicehub.runtime.kernels import row_noise_triton as noise
from voicehub.runtime.kernels import sample_step_triton as sampler
from voicehub.runtime.kernels import t2s_ffn_ticket_triton as ticket
from voicehub.runtime.kernels import t2s_layer_mma_attention_triton as attention
from voicehub.runtime.kernels import t2s_layer_mma_triton as mma
from voicehub.runtime.kernels import t2s_layer_triton as one_row
from voicehub.runtime.kernels.t2s_layer_mma_config import BUCKET_CHANGES

DIM, FFN_DIM, N_HEAD, VOCAB = 512, 2048, 16, 1025  # v3's T2S
ONE_ROW_SLOTS = 2048  # the single-stream decoder's cache (max_seq_len): the attention merge's shape
FP32_PTRS = {"out_ptr", "o_ptr", "part_ptr", "part1_ptr", "part2_ptr", "m_ptr", "l_ptr", "opart_ptr"}
INT32_PTRS = {"count_ptr", "gcount_ptr", "rcount_ptr", "count1_ptr", "count2_ptr", "sync_ptr"}
# lengths; the one-row stack's fixed-point accumulators and token inputs; the noise's seeds and keys
INT64_PTRS = {"len_ptr", "acc_ptr", "acc_attn_ptr", "acc_ffn_ptr", "tok_ptr", "pos_ptr", "lo_ptr", "hi_ptr",
              "step_ptr", "vocab_ptr"}  # fmt: skip
FLOATS = {"eps", "scale"}
# what Triton's launcher marks divisible by 16 at v3's shapes and 64 rows: rows, widths, the KV bucket and
# cache length, the K spans of split GEMMs, the activations' and caches' strides
ALIGNED_INTS = {"n_rows", "dim", "ffn_dim", "n_in", "n_out", "n_slots", "max_slots", "k_span", "span1", "span2",
                "sxb", "skb", "skh", "sks", "svb", "svh", "svs"}  # fmt: skip


def signature(fn, constexprs: dict, overrides: dict) -> dict:
    """Triton's signature of `fn` as the stages call it: fp16 model tensors, fp32 partials, int32
    counters, int64 lengths, accumulators and seeds; `overrides` where a name means another type."""

    def kind(name: str) -> str:
        if name in constexprs:
            return "constexpr"
        if name in overrides:
            return overrides[name]
        if name.endswith("_ptr"):
            if name in INT64_PTRS:
                return "*i64"
            return "*i32" if name in INT32_PTRS else ("*fp32" if name in FP32_PTRS else "*fp16")
        return "fp32" if name in FLOATS else "i32"

    return {name: kind(name) for name in inspect.signature(fn.fn).parameters}


def aligned(fn, constexprs: dict) -> dict:
    """Triton's divisibility-by-16 attributes, as its launcher marks them: every pointer (torch's
    allocations) and the sizes and strides that are multiples of 16 (ALIGNED_INTS) (without them no
    vector loads and no cp.async pipelining are compiled)."""
    names = list(inspect.signature(fn.fn).parameters)
    return {(i,): [["tt.divisibility", 16]] for i, name in enumerate(names)
            if name not in constexprs and (name.endswith("_ptr") or name in ALIGNED_INTS)}  # fmt: skip


def compile_sm90(
    fn, constexprs: dict, num_warps: int, num_stages: int, fp_fusion: bool = True, **overrides: str
) -> str:
    src = ASTSource(
        fn=fn,
        signature=signature(fn, constexprs, overrides),
        constexprs=constexprs,
        attrs=aligned(fn, constexprs),
    )
    kernel = triton.compile(
        src,
        target=GPUTarget("cuda", 90, 32),
        options={"num_warps": num_warps, "num_stages": num_stages, "enable_fp_fusion": fp_fusion},
    )
    ptx = kernel.asm["ptx"]
    print(f"{fn.fn.__name__} {sorted(constexprs.items())}: {kernel.metadata.shared} B shared, "
          f"{ptx.count('cp.async.cg')} cp.async", flush=True)  # fmt: skip
    return ptx


def gemm_depths() -> list[int]:
    """The v3 entry's gemm_stages first, then each other depth its BUCKET_CHANGES give a step."""
    entry = mma.config_for(DIM, FFN_DIM, N_HEAD, VOCAB)
    changes = BUCKET_CHANGES.get((DIM, FFN_DIM, N_HEAD, VOCAB), ())
    others = {b.change["gemm_stages"] for b in changes if "gemm_stages" in b.change} - {entry.gemm_stages}
    return [entry.gemm_stages, *sorted(others)]


def main() -> None:
    # one compile a kernel and path (ptxas is most of the ~2-3 s each): the v3 table's config (its GEMM
    # kernels again at each other pipelining depth its bucket changes use), and the linear kernel with PDL
    # early and late (the two branches of `_await_previous`)
    cfg = mma.config_for(DIM, FFN_DIM, N_HEAD, VOCAB)
    gemm = dict(BLOCK_M=cfg.block_m, BLOCK_K=cfg.block_k, BLOCK_D=DIM, IEEE=False, PDL=0)
    # the table's tile loop, a pipelined one, the first tile loaded before the wait (pdl_attn: PDL 4, the
    # qkv kernel before it 3), and the L2 prefetches of the next layer's K/V, the program's own and the next GEMMs'
    # weights (kv_prefetch, kv_prefetch_own, w_prefetch: one bulk prefetch each in its PTX, which ptxas must take)
    paths = {(cfg.attn_stages, False, False), (2, False, False), (cfg.attn_stages, True, False),
             (cfg.attn_stages, False, True)}  # fmt: skip
    for attn_stages, first, prefetch in sorted(paths):
        ptx = compile_sm90(attention._attention_kernel,
                           dict(N_HEAD=N_HEAD, HEAD_DIM=DIM // N_HEAD, DH=DIM // N_HEAD, BLOCK_S=cfg.attn_block,
                                TILES=cfg.attn_tiles, SPLITS=1, PDL=4 if first else 0, OUT=cfg.attn_out,
                                BLOCK_D=DIM, BLOCK_O=attention.ATTN_OUT_BLOCK, KV_POLICY=attention.kv_policy(cfg),
                                STAGES=attn_stages, FIRST=first, PREFETCH=prefetch, WPREFETCH=prefetch,
                                OWN=prefetch, LANES=32 * cfg.attn_warps), cfg.attn_warps, 3)  # fmt: skip
        if ptx.count("cp.async.bulk.prefetch.L2.global") != 3 * prefetch:
            raise AssertionError(
                f"the attention's PTX {'lacks' if prefetch else 'holds'} the L2 bulk prefetches"
            )
    warps = cfg.gemm_warps
    for depth, stages in enumerate(gemm_depths()):
        # layer 0's input, a later layer's (prenorm), and that letting a pdl_attn attention launch (PDL 3)
        qkv_paths = ((True, False, 0), (True, True, 0), (True, True, 3))
        for raw, stored, pdl in qkv_paths if depth == 0 else qkv_paths[:2]:
            compile_sm90(mma._qkv_kernel, dict(gemm, N_HEAD=N_HEAD, HEADS=N_HEAD, HEAD_DIM=DIM // N_HEAD,
                                               RAW=raw, STORED=stored, BLOCK_N=cfg.block_n,
                                               SPLITS=cfg.qkv_splits, PDL=pdl), warps, stages)  # fmt: skip
        compile_sm90(mma._ffn1_kernel, dict(gemm, BLOCK_F=cfg.ffn_block, SPLITS=cfg.ffn1_splits,
                                            PRENORM=cfg.prenorm), warps, stages)  # fmt: skip
        for pdl in (0, 1, 2) if depth == 0 else (0,):
            compile_sm90(mma._linear_kernel, dict(gemm, BLOCK_N=cfg.block_n, SPLITS=cfg.ffn2_splits,
                                                  NORM=cfg.prenorm, PDL=pdl), warps, stages)  # fmt: skip
        compile_sm90(mma._head_kernel, dict(gemm, BLOCK_N=cfg.block_n, PRENORM=cfg.prenorm), warps, stages)
        compile_sm90(ticket._ffn_ticket_kernel,
                     dict(BLOCK_M=cfg.block_m, BLOCK_F=cfg.ffn_block, BLOCK_N=cfg.block_n,
                          BLOCK_K=cfg.block_k, BLOCK_D=DIM, SPLITS1=cfg.ffn1_splits, SPLITS2=cfg.ffn2_splits,
                          IEEE=False, PDL=0, PRENORM=cfg.prenorm), warps, stages)  # fmt: skip

    # the one-row stack at one row (a single stream), PDL as its table says; qkv: layer 0 gathering the
    # embedding, layer 0 given x, a later layer
    one = one_row.config_for(DIM, FFN_DIM, N_HEAD, VOCAB)
    common = dict(BLOCK_D=DIM, PDL=1 if one.pdl else 0)
    for first, embed in ((True, True), (True, False), (False, False)):
        compile_sm90(one_row._qkv_kernel, dict(common, N_HEAD=N_HEAD, HEADS=N_HEAD, HEAD_DIM=DIM // N_HEAD,
                                               FIRST=first, EMBED=embed, BLOCK_N=one.qkv_block, ROWS=1),
                     one.qkv_warps, 3)  # fmt: skip
    compile_sm90(one_row._attention_kernel,
                 dict(common, N_HEAD=N_HEAD, HEAD_DIM=DIM // N_HEAD, DH=DIM // N_HEAD, BLOCK_S=one.attn_block,
                      SPLITS=triton.next_power_of_2(triton.cdiv(ONE_ROW_SLOTS, one.attn_block))),
                 one.attn_warps, 3)  # fmt: skip
    compile_sm90(one_row._ffn_kernel, dict(common, BLOCK_F=one.ffn_block, ROWS=1), one.ffn_warps, 3)
    # the one-row head stores the logits in the model dtype
    compile_sm90(one_row._head_kernel, dict(common, BLOCK_N=one.head_block, ROWS=1), one.head_warps, 3,
                 out_ptr="*fp16")  # fmt: skip
    compile_sm90(noise._row_noise_kernel, dict(BLOCK=noise.BLOCK_V), 4, 3)
    # launched without FP contraction: torch rounds the product before the sum, an fma.rn.f16 would not
    ptx = compile_sm90(
        mma._embed_kernel, dict(BLOCK_D=DIM), 4, 3, fp_fusion=False, table_ptr="*fp16", x_ptr="*fp16"
    )
    if "fma" in ptx or "mul.rn.f16" not in ptx:
        raise AssertionError(
            "the rows embedding kernel fuses alpha * pe into the sum (fma): not torch's rounding"
        )
    # the sampler as the row engine launches it: fp16 logits racing fp32 per-row noise, int64 / bool state
    i64, i1 = ("top_k tokens audio_pos step cap stop_step out".split(), "seen forced done stop_eos".split())
    compile_sm90(sampler._sample_step_kernel,
                 dict(HAS_EOS=True, ADVANCE=True, BLOCK_V=triton.next_power_of_2(VOCAB),
                      KEY_BITS=sampler.KEY_BITS[torch.float16]), 8, 3,
                 q_ptr="*fp32", top_p_ptr="*fp32", temp_ptr="*fp32", pen_ptr="*fp32",
                 **{f"{n}_ptr": "*i64" for n in i64}, **{f"{n}_ptr": "*i1" for n in i1})  # fmt: skip


if __name__ == "__main__":
    main()
