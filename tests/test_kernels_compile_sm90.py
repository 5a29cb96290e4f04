"""The T2S step's Triton kernels compile for Hopper (sm_90) on a machine without a GPU.

The CPU tests run these kernels in Triton's interpreter, which skips the compiler: it accepts what a
compiled kernel refuses (a plain Python global read inside a kernel, session 13's first GPU run of the
ticketed FFN) and never reaches ptxas. `compile_sm90.py` compiles each kernel of the many-row stack
(the v3 table's config and its bucket changes' pipelining depths, PDL early / late, the ticketed FFN
and attention + out-projection),
of the one-row stack and the per-row noise through Triton's front end and ptxas, in a process of its
own (the other tests import the modules interpreted).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from voicehub.runtime.kernels.t2s_layer_mma_config import BUCKET_CHANGES, config_for

V3 = (512, 2048, 16, 1025)  # dim, ffn_dim, n_head, vocab


def test_step_kernels_compile_for_sm90_without_a_gpu():
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed (pip install triton): the kernels' compile is untested here")
    if importlib.util.find_spec("triton.backends.nvidia") is None:
        pytest.skip("this triton has no NVIDIA backend")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    script = Path(__file__).with_name("compile_sm90.py")
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = proc.stdout.splitlines()
    # many rows: three qkv (layer 0's, a later layer's, that one letting a pdl_attn attention launch), four
    # attentions (the tile loop plain, pipelined, pdl_attn's, the L2 prefetches'), ffn1, ffn2 (PDL off, early, late),
    # head, the ticketed FFN, and six GEMM kernels (two qkv, ffn2 PDL off) again at each other pipelining depth
    # of the bucket changes, the embedding; one row: three qkv, ffn, head, attention; the noise, the sampler
    entry = config_for(*V3)
    depths = {b.change.get("gemm_stages", entry.gemm_stages) for b in BUCKET_CHANGES.get(V3, ())}
    assert len(lines) == 13 + 6 * len(depths - {entry.gemm_stages}) + 1 + 6 + 2, proc.stdout
    assert all("B shared" in line for line in lines), proc.stdout
