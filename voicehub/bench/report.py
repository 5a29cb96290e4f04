"""Benchmark output: the JSON record, a Markdown table and a PNG plot."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from voicehub.errors import MissingDependencyError

MIB = 1024 * 1024


def _fmt(value: Any, spec: str, scale: float = 1.0) -> str:
    return "-" if value is None else format(value / scale, spec)


def _quality_cell(row: dict[str, Any]) -> str:
    q = row.get("quality")
    if q is None:
        return "-"
    verdict = "accepted" if q["accepted"] else "rejected: " + "; ".join(q["reasons"])
    e, c = q.get("eager") or {}, q.get("candidate") or {}
    facts = []
    if e.get("error_rate") is not None and c.get("error_rate") is not None:
        facts.append(f"{q.get('error_metric', 'wer').upper()} {c['error_rate'] - e['error_rate']:+.3f}")
    if q.get("speaker_similarity") is not None:
        facts.append(f"similarity {q['speaker_similarity']:.3f}")
    if e.get("loudness_lufs") is not None and c.get("loudness_lufs") is not None:
        facts.append(f"loudness {c['loudness_lufs'] - e['loudness_lufs']:+.2f} LU")
    return verdict + (f" ({', '.join(facts)})" if facts else "")


def markdown_table(record: dict[str, Any]) -> str:
    """The record as Markdown: the conditions first, then one row per profile."""
    s, env = record["settings"], record["environment"]
    versions = ", ".join(f"{k} {v}" for k, v in env["versions"].items() if v)
    lines = [
        f"Model: {s['model_type']} {s['model']}".rstrip()
        + f"; device {s['device']}"
        + (f" ({env['gpu']}, CUDA {env['cuda']})" if env.get("gpu") else "")
        + f"; precision {s['precision']}; seed {s['seed']}",
        f"Machine: {env['platform']}; Python {env['python']}; {versions}",
        f"Warm-ups: {s['n_warmup']} (the first is the cold latency); measured repetitions: {s['n_reps']}",
        f"Memory: {record['memory_definition']}",
        "",
        "| profile | status | cold s | warm median s | audio s | RTF | speedup | peak allocated MiB "
        "| peak reserved MiB | memory drop | quality |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in record["profiles"]:
        if r["status"] != "measured":
            lines.append(f"| {r['name']} | {r['status']}: {r['reason']} | | | | | | | | | |")
            continue
        lines.append(
            f"| {r['name']} | measured | {r['cold_latency_s']:.3f} | {r['warm_latency_median_s']:.3f} "
            f"| {r['audio_s']:.2f} | {r['rtf']:.4f} | {r['speedup_vs_eager']:.2f}x "
            f"| {_fmt(r['peak_allocated_bytes'], '.0f', MIB)} | {_fmt(r['peak_reserved_bytes'], '.0f', MIB)} "
            f"| {_fmt(r['memory_drop_ratio'], '.1%')} | {_quality_cell(r)} |"
        )
    return "\n".join(lines) + "\n"


def plot(record: dict[str, Any], path: str | Path) -> Path:
    """Warm latency per profile (bars: median, whiskers: min-max) and peak allocated memory."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise MissingDependencyError('plots need matplotlib: pip install "voicehub[quality]"') from exc
    rows = [r for r in record["profiles"] if r["status"] == "measured"]
    names = [r["name"] for r in rows]
    med = [r["warm_latency_median_s"] * 1000 for r in rows]
    low = [m - min(r["warm_latencies_s"]) * 1000 for m, r in zip(med, rows)]
    high = [max(r["warm_latencies_s"]) * 1000 - m for m, r in zip(med, rows)]
    has_memory = any(r["peak_allocated_bytes"] is not None for r in rows)
    fig = Figure(figsize=(max(6, 1.2 * len(rows)), 7 if has_memory else 4), layout="constrained")
    FigureCanvasAgg(fig)  # the Agg canvas, without pyplot's global figure state
    axes = fig.subplots(2 if has_memory else 1, 1, squeeze=False)[:, 0]
    axes[0].bar(names, med, yerr=[low, high], capsize=4)
    axes[0].set_ylabel("warm latency, ms")
    axes[0].set_title(
        f"{record['settings']['model_type']} on {record['settings']['device']}, {record['settings']['precision']}"
    )
    if has_memory:
        axes[1].bar(names, [(r["peak_allocated_bytes"] or 0) / MIB for r in rows], color="tab:orange")
        axes[1].set_ylabel("peak allocated GPU memory, MiB")
    for ax in axes:
        ax.tick_params(axis="x", rotation=30)
    path = Path(path)
    fig.savefig(path, dpi=100)
    return path


def write_reports(record: dict[str, Any], out_dir: str | Path, stem: str = "bench") -> dict[str, Path]:
    """bench.json, bench.md and bench.png in `out_dir`; returns their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / f"{stem}.json", "markdown": out / f"{stem}.md", "png": out / f"{stem}.png"}
    paths["json"].write_text(json.dumps(record, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    paths["markdown"].write_text(markdown_table(record), encoding="utf-8")
    plot(record, paths["png"])
    return paths
