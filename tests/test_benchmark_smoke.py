"""The benchmarks' CPU smoke runs (each script's docstring names it) run every path.

t2s_layer_bench: the many-row config module once imported triton before the script set
TRITON_INTERPRET, and every Triton path of the smoke run failed with "Cannot call @triton.jit'd outside
of the scope of a kernel".
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
PATHS = {"torch_definition", "torch_embed+fused", "fused_embed", "fused", "mma"}


def test_cpu_smoke_run_measures_every_path(tmp_path):
    out = tmp_path / "smoke.json"
    args = ["--size", "tiny", "--device", "cpu", "--rows", "2", "--length", "40", "--n-slots", "64",
            "--max-slots", "96", "--no-sweep", "--out", str(out)]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # the script must set it
    proc = subprocess.run([sys.executable, "t2s_layer_bench.py", *args], cwd=BENCH, env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = json.loads(out.read_text())["results"]
    assert {r["path"] for r in results} == PATHS
    for row in results:
        assert "error" not in row, row
        assert row["step_us"] > 0
        assert row.get("rel_l2", 0.0) < 1e-2, row


def test_launch_floor_probe_chains_dependent_kernels():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, "launch_floor_probe.py", "--device", "cpu"], cwd=BENCH, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "cpu smoke: ok" in proc.stdout
