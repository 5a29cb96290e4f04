"""What every part of optimization_evidence.py shares: how an optimized output is compared with eager
(relative L2, median time), the checkpoint's hash, and the exactness evidence file, whose decision
follows from its numbers."""

from __future__ import annotations

import hashlib
import json
import platform
import shutil
import statistics
import sys
import time
from datetime import date
from importlib import metadata
from pathlib import Path

import numpy as np
import torch
from bench_meta import tree_commit

from voicehub.optimization.evidence import EXACTNESS, REJECTED, SCHEMA, VALIDATED, check_evidence

ROOT = Path(__file__).resolve().parent.parent
PACKAGE_EVIDENCE = ROOT / "voicehub" / "optimization" / "evidence"
SEED = 1234
MARGIN_EPSILON = 0.05  # logit units: greedy steps whose eager top-1/top-2 margin is larger must agree


def rel_l2(a: np.ndarray | torch.Tensor, b: np.ndarray | torch.Tensor) -> float:
    a, b = torch.as_tensor(a).double().flatten(), torch.as_tensor(b).double().flatten()
    if a.shape != b.shape:
        return float("inf")  # a length change is never within tolerance
    return float((a - b).norm() / b.norm())


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": sys.version.split()[0], "cuda": torch.version.cuda}
    for dist in ("voicehub", "torch", "triton", "numpy"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    # VOICEHUB_COMMIT where the copy's .git lags, else git's HEAD; a source tree (not installed): voicehub too
    out["voicehub_commit"] = tree_commit()
    out["voicehub"] = out["voicehub"] or out["voicehub_commit"]
    return out


def platform_of(device: str) -> tuple[str, str]:
    if device.startswith("cuda"):
        major, minor = torch.cuda.get_device_capability()
        return f"sm_{major}{minor}", torch.cuda.get_device_name()
    return "cpu", platform.processor() or platform.machine()


def median_s(fn, reps: int, device: str) -> float:
    times = []
    for _ in range(reps):
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def write_evidence(args, model_type, feature, technique, dtype, checkpoint, measurements) -> Path:
    plat, device_name = platform_of(args.device)
    ok = all(o["rel_l2"] <= measurements["tolerance_rel_l2"] for o in measurements["outputs"])
    ok = ok and all(t["n_mismatched"] == 0 for t in measurements.get("tokens", []))
    timing = measurements.get("timing")
    ok = ok and (timing is None or timing["optimized_ms"] <= timing["eager_ms"])
    data = {
        "schema": SCHEMA, "model_type": model_type, "feature": feature, "technique": technique,
        "kind": EXACTNESS, "dtype": dtype, "platform": plat, "device_name": device_name,
        "command": "python " + " ".join(sys.argv), "created": date.today().isoformat(),
        "versions": versions(), "checkpoint": checkpoint, "measurements": measurements,
        "decision": VALIDATED if ok else REJECTED,
    }  # fmt: skip
    check_evidence(data, "new evidence")  # the decision follows from the numbers, as the loader checks
    folder = args.evidence_dir or args.out / "evidence"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{model_type}__{feature}__{technique}__{dtype}__{plat}.json"
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    if args.install_evidence and plat != "cpu":
        shutil.copy(path, PACKAGE_EVIDENCE / path.name)
    print(f"evidence {path.name}: {data['decision']}", flush=True)
    return path
