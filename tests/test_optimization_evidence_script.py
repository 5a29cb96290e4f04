"""benchmarks/optimization_evidence.py: the margin rule it applies to tokens, and its evidence files."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from voicehub.optimization import check_evidence

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "optimization_evidence_gpt.py"


@pytest.fixture(scope="module")
def script():
    # the module imports its siblings, as it does when optimization_evidence.py runs from benchmarks/
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(SCRIPT.parent))
        spec = importlib.util.spec_from_file_location("optimization_evidence_gpt", SCRIPT)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return module


def _result(tokens, margins=None):
    tokens = torch.tensor(tokens)
    margins = torch.tensor(margins if margins is not None else [1.0] * len(tokens))
    return SimpleNamespace(tokens=tokens, decision_margins=margins, n_steps=len(tokens))


def test_tokens_are_compared_up_to_the_first_divergence(script):
    eps = script.MARGIN_EPSILON
    same = script._token_check(_result([1, 2, 3, 4]), _result([1, 2, 3, 4]))
    assert (same["n_compared"], same["n_mismatched"], same["first_divergence"]) == (4, 0, None)
    # A divergence at a near-tie is allowed; the steps after it are not compared (other history).
    tie = script._token_check(_result([1, 2, 3, 4], [1, 1, eps / 2, 1]), _result([1, 2, 9, 9]))
    assert tie["n_compared"] == 2 and tie["n_mismatched"] == 0 and tie["first_divergence"]["step"] == 2
    bad = script._token_check(_result([1, 2, 3, 4], [1, 1, 0.5, 1]), _result([1, 2, 9, 4]))
    assert bad["n_mismatched"] == 1 and bad["first_divergence"] == {"step": 2, "margin": 0.5}


def test_written_evidence_passes_the_loader_and_a_slowdown_is_rejected(script, tmp_path):
    args = SimpleNamespace(device="cpu", evidence_dir=tmp_path, out=tmp_path, install_evidence=False)
    m = {"tolerance_rel_l2": 1e-3, "margin_epsilon": 0.05, "outputs": [{"name": "audio", "rel_l2": 1e-6}],
         "timing": {"eager_ms": 10.0, "optimized_ms": 5.0}}  # fmt: skip
    ckpt = {"kind": "real", "sha256": {"voice.onnx": "ab" * 32}}
    path = script.write_evidence(args, "vits", "attention", "sdpa", "float32", ckpt, m)
    data = json.loads(path.read_text())
    check_evidence(data)
    assert (
        data["decision"] == "validated" and data["platform"] == "cpu" and data["command"].startswith("python")
    )
    m["timing"]["optimized_ms"] = 20.0
    path = script.write_evidence(args, "vits", "attention", "sdpa", "float32", ckpt, m)
    assert json.loads(path.read_text())["decision"] == "rejected"
