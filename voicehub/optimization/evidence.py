"""Evidence files: the recorded measurements that let `auto` turn a technique on.

One JSON file per (family, feature, technique, dtype, platform) measurement, kept in
voicehub/optimization/evidence/. Two kinds:
- "exactness" (exact techniques only): output tensors' relative L2 error against eager within
  the rule's tolerance (<= 1e-2 fp16/bf16, <= 1e-3 fp32) and no token mismatch at any step where
  eager's top-1/top-2 margin exceeds `margin_epsilon`; where the file also records `timing`
  (eager_ms, optimized_ms of the same work), the technique must not be slower than eager_ms's run
  (eager, or for compile what auto runs without it: the file's timing.what says which);
- "quality" (any technique; the only kind for approximate ones): the quality gate's reports of a
  fixed-seed comparison on a real checkpoint, under the gate's fixed thresholds.
A file is loaded only if its recorded decision follows from its own numbers; otherwise
EvidenceError. Reading files is the only thing this module does: no state is kept between calls.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from datetime import date
from importlib import resources
from pathlib import Path
from typing import Any

from voicehub.choices import parse_choice
from voicehub.optimization.config import DType, Feature
from voicehub.optimization.errors import EvidenceError
from voicehub.optimization.families import TechniqueKind

SCHEMA = "voicehub.optimization.evidence/1"
EXACTNESS, QUALITY = "exactness", "quality"
VALIDATED, REJECTED = "validated", "rejected"
# The exactness rule of the GPU runtime issue: the loosest tolerance a file may claim per dtype.
MAX_REL_L2 = {DType.FLOAT16: 1e-2, DType.BFLOAT16: 1e-2, DType.FLOAT32: 1e-3}
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_REQUIRED = (
    "schema", "model_type", "feature", "technique", "kind", "dtype", "platform", "device_name",
    "command", "created", "versions", "checkpoint", "measurements", "decision",
)  # fmt: skip


def _fail(where: str, why: str) -> EvidenceError:
    return EvidenceError(f"evidence file {where}: {why}")


def _check_header(data: dict[str, Any], where: str) -> None:
    missing = [k for k in _REQUIRED if k not in data]
    if missing:
        raise _fail(where, f"missing field(s) {', '.join(missing)}")
    if data["schema"] != SCHEMA:
        raise _fail(where, f"schema {data['schema']!r} is not {SCHEMA!r}")
    try:
        parse_choice(Feature, data["feature"], "feature")
        parse_choice(DType, data["dtype"], "dtype")
        date.fromisoformat(str(data["created"])[:10])
    except ValueError as exc:
        raise _fail(where, str(exc)) from None
    if data["kind"] not in (EXACTNESS, QUALITY):
        raise _fail(where, f"kind {data['kind']!r} is not {EXACTNESS!r} or {QUALITY!r}")
    if data["decision"] not in (VALIDATED, REJECTED):
        raise _fail(where, f"decision {data['decision']!r} is not {VALIDATED!r} or {REJECTED!r}")
    if not str(data["command"]).strip():
        raise _fail(where, "the command that produced it is empty")
    versions = data["versions"]
    if not isinstance(versions, dict) or not {"voicehub", "torch"} <= versions.keys():
        raise _fail(where, "versions must record at least 'voicehub' and 'torch'")
    ckpt = data["checkpoint"]
    if not isinstance(ckpt, dict) or ckpt.get("kind") not in ("real", "random"):
        raise _fail(where, "checkpoint.kind must be 'real' or 'random'")
    files = ckpt.get("sha256")
    if not isinstance(files, dict) or not files or not all(_SHA256.match(str(h)) for h in files.values()):
        raise _fail(where, "checkpoint.sha256 must map each checkpoint file to its sha256 (64 hex digits)")


def _exactness_passes(data: dict[str, Any], where: str) -> bool:
    m = data["measurements"]
    tol, eps = float(m["tolerance_rel_l2"]), float(m["margin_epsilon"])
    limit = MAX_REL_L2[DType(data["dtype"])]
    if not 0 < tol <= limit:
        raise _fail(where, f"tolerance_rel_l2 {tol} is outside (0, {limit}] for {data['dtype']}")
    if eps <= 0:
        raise _fail(where, f"margin_epsilon must be > 0, got {eps}")
    outputs, tokens = m.get("outputs", []), m.get("tokens", [])
    if not outputs and not tokens:
        raise _fail(where, "no outputs or tokens were compared")
    passes = all(float(o["rel_l2"]) <= tol for o in outputs)
    for t in tokens:
        n_steps, n_compared, n_bad = int(t["n_steps"]), int(t["n_compared"]), int(t["n_mismatched"])
        if not 0 <= n_bad <= n_compared <= n_steps:
            raise _fail(where, f"tokens {t.get('name')!r}: need 0 <= n_mismatched <= n_compared <= n_steps")
        first = t.get("first_divergence")
        if n_bad > 0 and (first is None or float(first["margin"]) <= eps):
            raise _fail(
                where, f"tokens {t.get('name')!r}: a counted mismatch needs a first_divergence above epsilon"
            )
        passes = passes and n_bad == 0
    timing = m.get("timing")
    if timing is not None:  # optional: an exact technique that is slower than eager stays off
        eager_ms, optimized_ms = float(timing["eager_ms"]), float(timing["optimized_ms"])
        if not (eager_ms > 0 and optimized_ms > 0):
            raise _fail(where, "timing needs eager_ms > 0 and optimized_ms > 0")
        passes = passes and optimized_ms <= eager_ms
    return passes


def _quality_passes(data: dict[str, Any], where: str) -> bool:
    from voicehub.bench.quality import GATE_THRESHOLDS, QualityReport

    m = data["measurements"]
    if m.get("thresholds") != GATE_THRESHOLDS.to_dict():
        raise _fail(where, "thresholds differ from the quality gate's fixed thresholds")
    reports = [QualityReport.from_dict(r) for r in m.get("reports", [])]
    if not reports:
        raise _fail(where, "no quality reports")
    for raw, report in zip(m["reports"], reports, strict=True):
        if report.thresholds != GATE_THRESHOLDS:
            raise _fail(where, f"report for {report.text[:40]!r} used thresholds other than the gate's")
        if list(raw.get("reasons", [])) != list(report.judge()):
            raise _fail(
                where, f"report for {report.text[:40]!r}: recorded reasons do not follow from its metrics"
            )
    if data["checkpoint"]["kind"] != "real" and data["decision"] == VALIDATED:
        raise _fail(where, "a quality comparison validates a technique only on a real checkpoint")
    return all(r.accepted for r in reports)


def check_evidence(data: dict[str, Any], where: str = "<memory>") -> None:
    """Raise EvidenceError unless `data` is well formed and its decision follows from its numbers."""
    _check_header(data, where)
    try:
        passes = (_exactness_passes if data["kind"] == EXACTNESS else _quality_passes)(data, where)
    except (KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, EvidenceError):
            raise
        raise _fail(where, f"malformed measurements ({type(exc).__name__}: {exc})") from None
    expected = VALIDATED if passes else REJECTED
    if data["decision"] != expected:
        raise _fail(where, f"decision {data['decision']!r} but the numbers say {expected!r}")


@dataclass(frozen=True)
class Evidence:
    """One checked evidence file: `source` is how manifests cite it, `sha256` its content hash."""

    source: str
    sha256: str
    data: dict[str, Any]

    @property
    def key(self) -> tuple[str, str, str, str, str]:
        d = self.data
        return (d["model_type"], d["feature"], d["technique"], d["dtype"], d["platform"])

    @property
    def is_validated(self) -> bool:
        return self.data["decision"] == VALIDATED

    def can_validate(self, kind: TechniqueKind) -> bool:
        """Exact techniques accept either kind; approximate ones only a real-checkpoint quality run."""
        if kind is TechniqueKind.EXACT:
            return True
        return self.data["kind"] == QUALITY and self.data["checkpoint"]["kind"] == "real"

    def citation(self) -> dict[str, str]:
        return {"file": self.source, "sha256": self.sha256, "kind": self.data["kind"]}


def parse_evidence(text: str, source: str) -> Evidence:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _fail(source, f"not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise _fail(source, "top level must be an object")
    check_evidence(data, source)
    return Evidence(source, hashlib.sha256(text.encode()).hexdigest(), data)


@dataclass(frozen=True)
class EvidenceStore:
    """The evidence `auto` may use: every file checked when the store is built."""

    items: tuple[Evidence, ...] = ()

    @classmethod
    def from_directory(cls, directory: str | Path) -> EvidenceStore:
        paths = sorted(Path(directory).glob("*.json"))
        return cls(tuple(parse_evidence(p.read_text(encoding="utf-8"), str(p)) for p in paths))

    @classmethod
    def packaged(cls) -> EvidenceStore:
        """The files shipped in voicehub/optimization/evidence/ (cited by that relative path)."""
        folder = resources.files("voicehub.optimization") / "evidence"
        if not folder.is_dir():
            return cls()
        files = sorted((f for f in folder.iterdir() if f.name.endswith(".json")), key=lambda f: f.name)
        return cls(
            tuple(
                parse_evidence(f.read_text(encoding="utf-8"), f"voicehub/optimization/evidence/{f.name}")
                for f in files
            )
        )

    def find(
        self, model_type: str, feature: str, technique: str, dtype: str, platform: str
    ) -> Evidence | None:
        """The newest record for this key (a rejection wins a tie), or None."""
        key = (model_type, str(feature), technique, str(dtype), platform)
        matches = [e for e in self.items if e.key == key]
        if not matches:
            return None
        return max(matches, key=lambda e: (str(e.data["created"]), not e.is_validated))
