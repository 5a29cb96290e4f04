"""The end-to-end run's derived figures (ratios to eager, first-request penalties) and its printed table."""

from __future__ import annotations

from e2e_measure import TEXTS
from e2e_startup import KINDS


def derived(rows: list[dict], stream_mode: str) -> dict:
    """Per profile: warm first audio as a ratio of the eager `off` profile's, and the penalties of the
    first request after load, of a new voice and of a text length never seen, over the warm time of the
    same text in the same mode (ms; the first two in `stream_mode`)."""
    ok = {r["profile"]: r for r in rows if "error" not in r}
    out: dict = {}
    for name, row in ok.items():
        modes = row["first_audio"]
        warm_short = modes[stream_mode]["short"]["median_ms"]
        entry = {
            "first_request_penalty_ms": row["first_request"]["first_audio_ms"] - warm_short,
            "new_voice_penalty_ms": row["first_request_new_voice"]["first_audio_ms"] - warm_short,
            "new_length_penalty_ms": {
                m: {t: v["first_run_ms"] - v["median_ms"] for t, v in texts.items()}
                for m, texts in modes.items()
            },
        }
        if "off" in ok and name != "off":
            eager = ok["off"]["first_audio"]
            entry["speedup_vs_off"] = {
                m: {t: eager[m][t]["median_ms"] / v["median_ms"] for t, v in texts.items()}
                for m, texts in modes.items()
                if m in eager
            }
        out[name] = entry
    return out


def profile_lines(row: dict) -> list[str]:
    """Table rows of one profile: one per streaming mode."""
    if "error" in row:
        return [f"{row['profile']:8} error: {row['error'].strip().splitlines()[-1]}"]
    nan = float("nan")
    mem, loaded = row.get("memory") or {}, row.get("memory_after_load") or {}
    peak = " ".join(
        f"{m.get(k, nan):8.2f}" for m in (loaded, mem) for k in ("peak_allocated_gib", "peak_reserved_gib")
    )
    first = f"{row['first_request']['first_audio_ms']:9.1f} {row['first_request_new_voice']['first_audio_ms']:9.1f}"
    lines = []
    for mode, texts in row["first_audio"].items():
        ms = " ".join(f"{texts[n]['median_ms']:9.1f}" for n in TEXTS)
        lines.append(f"{row['profile']:8} {mode:9} {row['load_s']:6.1f} {first} {ms} {peak}")
    stages = row.get("first_chunk_stages") or {}
    if "first_audio_ms" in stages:
        parts = " ".join(f"{k.removesuffix('_ms')} {stages[k]:.1f}" for k in
                         ("t2s_and_text_ms", "encoder_ms", "cfm_ms", "vocoder_ms", "other_ms"))  # fmt: skip
        t2s = " ".join(f"{k.removesuffix('_ms')} {stages.get(k, nan):.1f}" for k in
                       ("text_ms", "prefill_ms", "first_window_ms", "t2s_other_ms"))  # fmt: skip
        lines.append(
            f"{'':8} first chunk, short, synced stages (ms): {parts}; total {stages['first_audio_ms']:.1f}"
        )
        lines.append(f"{'':8}   of which t2s_and_text (ms): {t2s}")
    return lines


def table(result: dict) -> str:
    head = " ".join(f"{n + ' ms':>9}" for n in TEXTS)
    lines = [
        "first audio, warm median ms per text; 1st req: the first request after load (voice warmed up at load), "
        "new voice: a voice never seen; GiB: peak allocated/reserved after load, then over the profile",
        f"{'profile':8} {'stream':9} {'load s':>6} {'1st req':>9} {'new voice':>9} {head} "
        f"{'load GiB':>8} {'load rsv':>8} {'peak GiB':>8} {'peak rsv':>8}",
    ]
    for row in result["profiles"]:
        lines += profile_lines(row)
    runs = [(start, kind) for start in result.get("startups") or () for kind in start if kind in KINDS]
    for st, kind in runs:
        row = st.get(kind) or {}
        value = row.get("process_start_to_first_audio_s")
        parts = " ".join(f"{k} {v:.2f}" for k, v in (row.get("breakdown_s") or {}).items())
        lines.append(f"process start to first audio ({st.get('profile')}, {kind} caches): "
                     + (f"{value:.2f} s ({parts})" if value is not None else "error"))  # fmt: skip
        if "second_request" in row:
            stages = row.get("third_request_stages") or {}
            split = " ".join(
                f"{k.removesuffix('_ms')} {v:.1f}" for k, v in stages.items() if k.endswith("_ms")
            )
            lines.append(f"{'':8} first request {row.get('first_audio_ms', float('nan')):.1f} ms, second "
                         f"{row['second_request']['first_audio_ms']:.1f} ms; third, synced: {split}")  # fmt: skip
    return "\n".join(lines)
