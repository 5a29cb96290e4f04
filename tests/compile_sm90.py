"""Compile the many-row T2S stack's kernels for Hopper (sm_90) with no GPU: Triton's front end and ptxas.

Run by `test_kernels_compile_sm90.py` in a process of its own (the CPU tests import these modules under
TRITON_INTERPRET=1, where `triton.jit` gives interpreted functions that do not compile). Prints one line
a kernel; any compile error raises.
"""

from __future__ import annotations

import dataclasses
import inspect

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from voicehub.runtime.kernels import t2s_ffn_ticket_triton as ticket
from voicehub.runtime.kernels import t2s_layer_mma_attention_triton as attention
from voicehub.runtime.kernels import t2s_layer_mma_triton as mma

DIM, FFN_DIM, N_HEAD, VOCAB = 512, 2048, 16, 1025  # v3's T2S
FP32_PTRS = {"out_ptr", "o_ptr", "part_ptr", "part1_ptr", "part2_ptr", "m_ptr", "l_ptr", "opart_ptr"}
INT32_PTRS = {"count_ptr", "gcount_ptr", "rcount_ptr", "count1_ptr", "count2_ptr", "sync_ptr"}
FLOATS = {"eps", "scale"}


def signature(fn, constexprs: dict) -> dict:
    """Triton's signature of `fn` as the stages call it (fp16 model, fp32 partials, int32 counters)."""

    def kind(name: str) -> str:
        if name in constexprs:
            return "constexpr"
        if name.endswith("_ptr"):
            if name == "len_ptr":
                return "*i64"
            return "*i32" if name in INT32_PTRS else ("*fp32" if name in FP32_PTRS else "*fp16")
        return "fp32" if name in FLOATS else "i32"

    return {name: kind(name) for name in inspect.signature(fn.fn).parameters}


def compile_sm90(fn, constexprs: dict, num_warps: int, num_stages: int) -> None:
    src = ASTSource(fn=fn, signature=signature(fn, constexprs), constexprs=constexprs)
    kernel = triton.compile(
        src, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps, "num_stages": num_stages}
    )
    print(f"{fn.fn.__name__} {sorted(constexprs.items())}: {kernel.metadata.shared} B shared", flush=True)


def main() -> None:
    base = mma.config_for(DIM, FFN_DIM, N_HEAD, VOCAB)
    variants = [base, dataclasses.replace(base, pdl=True), dataclasses.replace(base, pdl=True, pdl_late=True)]
    for cfg in variants:
        pdl = 0 if not cfg.pdl else (2 if cfg.pdl_late else 1)
        gemm = dict(BLOCK_M=cfg.block_m, BLOCK_K=cfg.block_k, BLOCK_D=DIM, IEEE=False, PDL=pdl)
        warps, stages = cfg.gemm_warps, cfg.gemm_stages
        for raw, stored in ((True, False), (True, True)):  # layer 0's input, a later layer's (prenorm)
            compile_sm90(mma._qkv_kernel, dict(gemm, N_HEAD=N_HEAD, HEADS=N_HEAD, HEAD_DIM=DIM // N_HEAD, RAW=raw,
                                               STORED=stored, BLOCK_N=cfg.block_n, SPLITS=cfg.qkv_splits),
                         warps, stages)  # fmt: skip
        compile_sm90(attention._attention_kernel,
                     dict(N_HEAD=N_HEAD, HEAD_DIM=DIM // N_HEAD, DH=DIM // N_HEAD, BLOCK_S=cfg.attn_block,
                          TILES=cfg.attn_tiles, SPLITS=1, PDL=pdl, OUT=cfg.attn_out, BLOCK_D=DIM,
                          BLOCK_O=attention.ATTN_OUT_BLOCK), cfg.attn_warps, 3)  # fmt: skip
        compile_sm90(mma._ffn1_kernel, dict(gemm, BLOCK_F=cfg.ffn_block, SPLITS=cfg.ffn1_splits, PRENORM=cfg.prenorm),
                     warps, stages)  # fmt: skip
        compile_sm90(mma._linear_kernel, dict(gemm, BLOCK_N=cfg.block_n, SPLITS=cfg.ffn2_splits, NORM=cfg.prenorm),
                     warps, stages)  # fmt: skip
        compile_sm90(mma._head_kernel, dict(gemm, BLOCK_N=cfg.block_n, PRENORM=cfg.prenorm), warps, stages)
    compile_sm90(ticket._ffn_ticket_kernel,
                 dict(BLOCK_M=base.block_m, BLOCK_F=base.ffn_block, BLOCK_N=base.block_n, BLOCK_K=base.block_k,
                      BLOCK_D=DIM, SPLITS1=base.ffn1_splits, SPLITS2=base.ffn2_splits, IEEE=False, PDL=0,
                      PRENORM=base.prenorm), base.gemm_warps, base.gemm_stages)  # fmt: skip


if __name__ == "__main__":
    main()
