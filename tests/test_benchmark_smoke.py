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


def test_mma_grid_searches_only_the_named_fields_from_the_given_start(tmp_path):
    out = tmp_path / "grid.json"
    args = ["--size", "tiny", "--device", "cpu", "--rows", "2", "--length", "40", "--n-slots", "64",
            "--max-slots", "96", "--mma-grid", "--check-rows", "", "--grid-fields", "block_m",
            "--grid-start", "block_m=32", "--grid-budget-s", "120", "--out", str(out)]  # fmt: skip
    proc = subprocess.run([sys.executable, "t2s_layer_bench.py", *args], cwd=BENCH, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["grid"]["values"] == {"block_m": [16, 32, 64]}
    assert report["grid"]["start"] == {"block_m": 32}
    timed = [r for r in report["results"] if r["path"] == "mma_grid"]
    assert len(timed) == 3  # the table's entry (16 rows a program), then 32 and 64: nothing else varied
    assert all("error" not in r and r["rel_l2"] < 1e-2 for r in timed)


def test_launch_floor_probe_chains_dependent_kernels():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, "launch_floor_probe.py", "--device", "cpu"], cwd=BENCH, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "cpu smoke: ok" in proc.stdout


def test_t2s_batch_bench_reads_every_level(tmp_path):
    """The engine bench on tiny fp32 weights, round graphs on: every level's streams keep their tokens
    (greedy against eager, sampled against alone), and the breakdown's phases add up to the timed run."""
    out = tmp_path / "batch.json"
    args = ["--device", "cpu", "--size", "tiny", "--dtype", "float32", "--levels", "1,3", "--n-tokens", "20",
            "--reps", "1", "--round-graphs", "--out", str(out)]  # fmt: skip
    proc = subprocess.run([sys.executable, "t2s_batch_bench.py", *args], cwd=BENCH, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "DIVERGED" not in proc.stdout
    levels = json.loads(out.read_text())["levels"]
    assert [r["n_streams"] for r in levels] == [1, 3]
    for row in levels:
        assert row["tokens"] == 20 * row["n_streams"]
        assert all(x.get("passes_margin_rule", x.get("identical")) for x in row["identity"])
        assert all(x["against_alone_identical"] for x in row["identity"])  # fp32 on the CPU: bitwise
        b = row["breakdown"]
        phased = b["admission"]["s"] + b["steady"]["s"] + b["tail"]["s"]
        assert 0 < phased <= row["wall_s"] + 1e-9
        assert b["admission"]["steps"] + b["steady"]["steps"] + b["tail"]["steps"] <= row["n_steps"]
        assert b["replay"]["steps"] == 19
        # the first pumps, timed one by one: host times rising, steps counted, no device clock on the CPU
        (pumps,) = row["first_pumps_all"]
        assert pumps == row["first_pumps"] and 1 <= len(pumps) <= 3
        assert all(p["device_s"] is None for p in pumps)
        assert [p["host_s"] for p in pumps] == sorted(p["host_s"] for p in pumps) and pumps[0]["host_s"] > 0
        assert pumps[-1]["steps"] <= row["n_steps"]


def test_t2s_batch_bench_refuses_bucket_changes_that_change_values_or_override_its_change():
    # --mma-bucket-changes takes only RESULT_FREE fields (a row's numbers must not depend on its batch or KV
    # bucket): refused while the arguments are parsed, before a checkpoint is made
    def bench(*args):
        return subprocess.run([sys.executable, "t2s_batch_bench.py", "--device", "cpu", "--size", "tiny", *args],
                              cwd=BENCH, capture_output=True, text=True, timeout=120)  # fmt: skip

    proc = bench("--mma-bucket-changes", "33-64@512:gemm_stages=3,block_k=32")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "['block_k'], fields outside RESULT_FREE" in proc.stderr
    # a bucket change of the field --mma-change sets would time the bucket's value, not the change
    proc = bench("--mma-change", "gemm_stages=1", "--mma-bucket-changes", "2-4@64:gemm_stages=3")
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "--mma-change sets ['gemm_stages'], which a bucket change overrides" in proc.stderr


def test_t2s_repeat_probe_finds_where_two_runs_first_differ(tmp_path):
    """The level run twice is bitwise the same on the CPU; alone against among others, the PyTorch step (not
    batch-invariant) first differs at the first decode step's slot, never in the prompt's (one prefill row count)."""
    out = tmp_path / "repeat.json"
    args = ["--device", "cpu", "--size", "tiny", "--dtype", "float32", "--level", "3", "--n-tokens", "12",
            "--kernels", "native", "--out", str(out)]  # fmt: skip
    proc = subprocess.run([sys.executable, "t2s_repeat_probe.py", *args], cwd=BENCH, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    streams = json.loads(out.read_text())["streams"]
    assert [s["stream"] for s in streams] == [0, 1, 2]
    for s in streams:
        assert s["batch_b"] == {"tokens_first_divergence": None, "equal": True}
        alone = s["alone"]
        assert not alone["equal"] and not alone["in_prefill"]
        assert alone["slot"] == s["n_prompt"] + alone["step"] and alone["step"] >= 0
        assert 0 < alone["max_abs_diff"] < 1e-3
