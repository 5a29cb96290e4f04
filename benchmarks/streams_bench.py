"""Many GPT-SoVITS v3 streams on one GPU under open-loop load: the stream engine (models/gpt_sovits/serving.py)
at 1, 4, 16, 64 and 128 concurrent streams (issue 7).

Workload: full-size random v3 weights (`make_checkpoint_set`, written once under --set-dir), fp16, T2S
graphs (preset full) plus --profile triton's kernels, one voice (e2e_bench's 5 s synthetic reference),
e2e_bench's fast workload (fast preset, top_k 5, 4 CFM steps), windows of --chunk-tokens semantic tokens.
Texts are drawn (fixed seed) from e2e_bench's short / medium / long sentences with weights MIX; random
weights never sample EOS, so each decodes force_n_tokens = e2e_bench.n_tokens(text).
Open loop: per level L, arrivals are Poisson at rate L / E[audio seconds of a text] for --duration s:
a stream counts as active from its arrival until its playback ends (first chunk + its audio), so by
Little's law L streams are active on average when the engine keeps up (the measured time-average is
reported beside it: over the level's whole wall time, ramp and drain included, and over the second half of
its arrivals, when the longest text's streams, ~13 s of audio, have long reached their steady count). After the arrivals the level drains for at most --drain s; streams still running
then are cancelled and counted unfinished. The engine runs in its own thread, as in the server.
Per level:
- T2S tokens/s: all tokens the level decoded / its wall time (demand-bound: L streams need about
  L x 25 x speed tokens/s), and the engine's decode rate while stepping T2S (tokens / seconds inside
  T2S rounds) with the mean rows per step;
- first audio p50/p95/p99: arrival -> the chunk that brings the stream's audio to >= 0.25 s;
- continuity: playback starts when the first chunk arrives; chunk i is due at that time + the audio
  before it; an underrun is a chunk that arrives after it is due (count, streams with any, worst and
  total lateness);
- stage seconds (T2S, SoVITS encoder, CFM, vocoder) and mean encoder / CFM / vocoder rows per call.
- encoder and vocoder rows replayed from CUDA graphs, zero rows padding them, rows run eagerly by reason.

    python benchmarks/streams_bench.py --out benchmarks/results/streams_h200.json   # plot beside it
    python benchmarks/streams_bench.py --device cpu --size tiny --profile full --levels 1,2 \
        --duration 4 --drain 60 --max-tokens 12 --chunk-tokens 4 --mix short --out /tmp/streams_cpu.json
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from e2e_bench import (
    FAST,
    PRESET,
    PROMPT_TEXT,
    TEXTS,
    ensure_set,
    load_profile,
    meta,
    n_tokens,
    write_reference,
)

from voicehub.models.gpt_sovits import Voice
from voicehub.models.gpt_sovits.presets import apply_preset
from voicehub.models.gpt_sovits.serving import ServingConfig, StreamEngine
from voicehub.runtime.scheduler import QueueFullError
from voicehub.server.pool import freeze_long_lived

MIX = {"short": 0.4, "medium": 0.4, "long": 0.2}  # share of arrivals per text length
FIRST_AUDIO_S = 0.25  # first audio: the stream holds at least this much
SECONDS_PER_TOKEN = 0.04  # 25 Hz semantic tokens at speed 1


@dataclass
class Record:
    """One stream's timeline (perf_counter seconds), filled from the engine's thread."""

    kind: str
    arrival: float
    chunks: list[tuple[float, float]] = field(default_factory=list)  # (arrival time, audio seconds)
    end: float | None = None
    error: str | None = None
    is_rejected: bool = False
    stream: object = None

    def on_chunk(self, chunk) -> None:
        self.chunks.append((time.perf_counter(), chunk.duration))

    def on_end(self, error) -> None:
        self.end = time.perf_counter()
        self.error = None if error is None else type(error).__name__

    def first_audio(self) -> float | None:
        """Arrival -> the chunk that brings the audio to FIRST_AUDIO_S (the last one if it is shorter)."""
        heard = 0.0
        for at, seconds in self.chunks:
            heard += seconds
            if heard >= FIRST_AUDIO_S:
                return at - self.arrival
        return self.chunks[-1][0] - self.arrival if self.chunks else None

    def lateness(self) -> list[float]:
        """Per chunk after the first: arrival - due time (> 0 is an underrun)."""
        if not self.chunks:
            return []
        start, played, late = self.chunks[0][0], self.chunks[0][1], []
        for at, seconds in self.chunks[1:]:
            late.append(at - (start + played))
            played += seconds
        return late

    def active_until(self) -> float:
        """End of playback (or of the stream, if it ended later)."""
        if not self.chunks:
            return self.end or self.arrival
        playback_end = self.chunks[0][0] + sum(s for _, s in self.chunks)
        return max(playback_end, self.chunks[-1][0])


def percentile(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def mean_active(records: list[Record], t0: float, t1: float) -> float:
    """Time-average of streams between arrival and the end of playback, over [t0, t1]."""
    total = sum(max(0.0, min(r.active_until(), t1) - max(r.arrival, t0)) for r in records)
    return total / (t1 - t0)


def text_tokens(kind: str, args) -> int:
    return min(n_tokens(TEXTS[kind]), args.max_tokens) if args.max_tokens else n_tokens(TEXTS[kind])


def expected_seconds(args, mix: dict[str, float]) -> float:
    """Mean audio seconds of a drawn text (tokens / 25 Hz / speed)."""
    speed = apply_preset(PRESET).speed  # FAST leaves speed to the preset
    total = sum(mix.values())
    return sum(w / total * text_tokens(k, args) * SECONDS_PER_TOKEN / speed for k, w in mix.items())


def submit(engine: StreamEngine, voice: Voice, kind: str, seed: int, args) -> Record:
    record = Record(kind, time.perf_counter())
    params = dict(FAST, force_n_tokens=text_tokens(kind, args), stream_chunk_tokens=args.chunk_tokens)
    try:
        record.stream = engine.submit(
            TEXTS[kind], voice=voice, seed=seed, preset=PRESET, on_chunk=record.on_chunk,
            on_end=record.on_end, **params,
        )  # fmt: skip
    except QueueFullError:
        record.is_rejected = True
    return record


def run_level(engine: StreamEngine, voice: Voice, level: int, args, mix: dict[str, float]) -> dict:
    rng = np.random.default_rng(level)
    rate = level / expected_seconds(args, mix)  # arrivals per second (Little's law)
    kinds, weights = list(mix), np.array(list(mix.values())) / sum(mix.values())
    engine.stats.round_s_max = 0.0  # this level's longest round (the other counters are diffed)
    stats0, steps0 = dict(engine.stats.to_dict()), engine.scheduler.n_steps
    records: list[Record] = []
    t0 = time.perf_counter()
    at = rng.exponential(1 / rate)
    while at < args.duration:
        time.sleep(max(0.0, t0 + at - time.perf_counter()))
        kind = str(rng.choice(kinds, p=weights))
        records.append(submit(engine, voice, kind, seed=len(records), args=args))
        at += rng.exponential(1 / rate)
    deadline = t0 + args.duration + args.drain
    live = [r for r in records if r.stream is not None]
    while any(r.end is None for r in live) and time.perf_counter() < deadline:
        time.sleep(0.02)
    unfinished = [r for r in live if r.end is None]
    for r in unfinished:
        r.stream.cancel()
    idle_by = time.perf_counter() + 60
    while not engine.is_idle:
        if time.perf_counter() > idle_by:
            raise RuntimeError(
                f"level {level}: the engine still holds {engine.n_streams} streams after cancelling"
            )
        time.sleep(0.02)
    t1 = max([r.end for r in live if r.end is not None] + [t0 + 1e-3])
    return summarize(records, unfinished, level, rate, t0, t1, args.duration, engine, stats0, steps0)


def diff(now, before):
    """A counter's growth over a level (dict counters, such as eager vocoder windows by reason, per key)."""
    if isinstance(now, dict):
        return {k: v - before.get(k, 0) for k, v in now.items() if v - before.get(k, 0)}
    return now - before


def summarize(records, unfinished, level, rate, t0, t1, duration, engine, stats0, steps0) -> dict:
    done = [r for r in records if r.end is not None and r.error is None and r not in unfinished]
    firsts = [f for r in done if (f := r.first_audio()) is not None]
    late = {id(r): r.lateness() for r in done}
    underruns = [x for v in late.values() for x in v if x > 0]
    tokens = sum(len(t) for r in records if r.stream is not None for t in r.stream.tokens)
    stats = {k: diff(v, stats0[k]) for k, v in engine.stats.to_dict().items()}
    n_steps = engine.scheduler.n_steps - steps0
    wall = t1 - t0
    return {
        "level": level,
        "arrival_rate_per_s": rate,
        "wall_s": wall,
        "streams": {
            "submitted": len(records), "finished": len(done), "rejected": sum(r.is_rejected for r in records),
            "unfinished_at_drain": len(unfinished),
            "failed": sum(1 for r in records if r.error not in (None, "StreamCancelledError")),
            "by_kind": {k: sum(r.kind == k for r in records) for k in TEXTS},
        },
        "mean_active_streams": mean_active(records, t0, t1),
        "mean_active_streams_steady": mean_active(records, t0 + duration / 2, t0 + duration),
        "t2s_tokens": tokens,
        "t2s_tokens_per_s": tokens / wall,
        "t2s_decode_tokens_per_s_while_stepping": tokens / stats["t2s_s"] if stats["t2s_s"] else None,
        "t2s_mean_rows_per_step": tokens / n_steps if n_steps else None,
        "first_audio_s": {"p50": percentile(firsts, 50), "p95": percentile(firsts, 95),
                          "p99": percentile(firsts, 99), "max": max(firsts, default=None)},
        "underruns": {"chunks": len(underruns), "chunks_total": sum(len(v) for v in late.values()),
                      "streams_with_any": sum(1 for v in late.values() if any(x > 0 for x in v)),
                      "worst_late_s": max(underruns, default=0.0), "total_late_s": sum(underruns)},
        "stage_s": {k: stats[k] for k in ("t2s_s", "encoder_s", "cfm_s", "vocoder_s")},
        "encoder_rows_per_call": stats["encoder_rows"] / stats["encoder_calls"] if stats["encoder_calls"] else None,
        "cfm_rows_per_call": stats["cfm_rows"] / stats["cfm_calls"] if stats["cfm_calls"] else None,
        "vocoder_rows_per_call": stats["vocoder_rows"] / stats["vocoder_calls"] if stats["vocoder_calls"] else None,
        "vocoder": {k: stats[k] for k in ("vocoder_calls", "vocoder_rows", "vocoder_replayed",
                                          "vocoder_padded_rows", "vocoder_off_grid", "vocoder_eager",
                                          "vocoder_flushes")},
        "encoder": {k: stats[k] for k in ("encoder_calls", "encoder_rows", "encoder_replayed",
                                          "encoder_padded_rows", "encoder_eager")},
        "rounds": stats["rounds"],
        # stalls: the longest round, rounds over SLOW_ROUND_S, graphs captured inside rounds, and the
        # slowest first audios with when their streams arrived (clustered arrivals point at one stall)
        "round_s_max": stats["round_s_max"],
        "slow_rounds": stats["slow_rounds"],
        "captures_in_rounds": stats["captures_in_rounds"],
        "slowest_first_audio": [
            {"arrival_s": r.arrival - t0, "first_audio_s": f, "kind": r.kind}
            for r, f in sorted(((r, r.first_audio()) for r in done if r.chunks), key=lambda x: -x[1])[:8]
        ],
    }  # fmt: skip


def plot(result: dict, path: Path) -> str:
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        return "skipped: no matplotlib"
    rows = result["levels"]
    x = [r["level"] for r in rows]
    fig = Figure(figsize=(13, 4))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 3, 1)
    for q in ("p50", "p95", "p99"):
        ax.plot(x, [(r["first_audio_s"][q] or np.nan) * 1e3 for r in rows], marker="o", label=q)
    ax.axhline(250, color="grey", linestyle=":", label="250 ms")
    ax.set(xscale="log", yscale="log", xlabel="concurrent streams (offered)", ylabel="first audio (ms)")
    ax.legend()
    ax = fig.add_subplot(1, 3, 2)
    ax.plot(x, [r["t2s_tokens_per_s"] for r in rows], marker="o", label="offered load")
    ax.plot(
        x,
        [r["t2s_decode_tokens_per_s_while_stepping"] or np.nan for r in rows],
        marker="s",
        label="while stepping",
    )
    ax.set(xscale="log", yscale="log", xlabel="concurrent streams (offered)", ylabel="T2S tokens/s")
    ax.legend()
    ax = fig.add_subplot(1, 3, 3)
    frac = [r["underruns"]["streams_with_any"] / max(r["streams"]["finished"], 1) for r in rows]
    ax.plot(x, frac, marker="o", label="streams with an underrun")
    ax.plot(x, [r["mean_active_streams"] / r["level"] for r in rows], marker="s", label="active / offered")
    ax.set(xscale="log", xlabel="concurrent streams (offered)")
    ax.set_ylim(bottom=-0.05)
    ax.legend()
    fig.suptitle(f"GPT-SoVITS v3 stream engine, open loop ({result['machine'].get('gpu') or 'cpu'})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return str(path)


def warm_up(engine: StreamEngine, voice: Voice, args) -> float:
    """A few streams of each kind through the engine (reference features, allocator, kernels)."""
    t0 = time.perf_counter()
    records = [submit(engine, voice, kind, seed=i, args=args) for i, kind in enumerate([*MIX, *MIX])]
    # an engine sized for one stream queues four: the rest are refused and never end
    records = [r for r in records if not r.is_rejected]
    while not all(r.end is not None for r in records):
        if time.perf_counter() - t0 > 300:
            raise RuntimeError("the warm-up streams did not finish within 300 s")
        time.sleep(0.02)
    failed = [r.error for r in records if r.error is not None]
    if failed:
        raise RuntimeError(f"warm-up streams failed: {failed}")
    return time.perf_counter() - t0


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--levels", default="1,4,16,64,128")
    p.add_argument("--duration", type=float, default=20.0, help="seconds of arrivals per level")
    p.add_argument("--drain", type=float, default=10.0, help="most seconds a level waits for streams after")
    p.add_argument("--budget-s", type=float, default=420.0, help="skip levels that would end past this")
    p.add_argument("--device", default="cuda")
    p.add_argument("--size", default="full")
    p.add_argument("--dtype", default=None, help="default float16 on CUDA, float32 on the CPU")
    p.add_argument("--profile", default="triton", help="full (graphs) or triton (graphs + Triton kernels)")
    p.add_argument("--set-dir", type=Path, default=None, help="default /tmp/gpt_sovits_v3_SIZE (e2e_bench's)")
    p.add_argument("--chunk-tokens", type=int, default=25)
    p.add_argument("--max-tokens", type=int, default=0, help="cap force_n_tokens (smoke runs)")
    p.add_argument("--mix", default=",".join(MIX), help="text kinds to draw from (of short,medium,long)")
    p.add_argument("--max-cfm-batch", type=int, default=32)
    p.add_argument("--max-encoder-batch", type=int, default=64, help="1: the SoVITS encoder per stream")
    p.add_argument("--max-vocoder-batch", type=int, default=64)
    p.add_argument(
        "--vocoder-bucket",
        type=int,
        default=ServingConfig.vocoder_bucket_frames,
        help="vocoder window length multiple (frames)",
    )
    p.add_argument(
        "--no-hold-vocoder",
        action="store_true",
        help="vocode each CFM batch's windows right after it (ServingConfig.hold_vocoder False)",
    )
    p.add_argument("--urgent-s", type=float, default=0.5)
    p.add_argument(
        "--no-gc-freeze",
        action="store_true",
        help="leave the loaded model in the garbage collector's walks (the server freezes it after warm-up)",
    )
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--plot", type=Path, default=None, help="default: --out with .png")
    args = p.parse_args()
    args.dtype = args.dtype or ("float16" if args.device.startswith("cuda") else "float32")
    args.windows_arg = str(args.chunk_tokens)  # what e2e_bench.meta reads
    args.warmups = args.reps = 0
    return args


def main() -> None:
    args = parse_args()
    t_start = time.perf_counter()
    levels = [int(x) for x in args.levels.split(",")]
    mix = {k: MIX[k] for k in args.mix.split(",")}
    set_dir, set_s = ensure_set(args.set_dir or Path(f"/tmp/gpt_sovits_v3_{args.size}"), args.size)
    reference = write_reference(set_dir / "bench_reference.wav")
    t0 = time.perf_counter()
    model, manifest = load_profile(set_dir, args.device, args.dtype, args.profile, strict=False)
    load_s = time.perf_counter() - t0
    if manifest and "error" in manifest:
        print(f"--profile triton could not apply ({manifest['error']}): graphs only", file=sys.stderr)
    config = ServingConfig(
        max_streams=max(levels), max_queue=4 * max(levels), chunk_tokens=args.chunk_tokens,
        max_cfm_batch=args.max_cfm_batch, max_vocoder_batch=args.max_vocoder_batch,
        max_encoder_batch=args.max_encoder_batch,
        urgent_s=args.urgent_s, vocoder_bucket_frames=args.vocoder_bucket,
        hold_vocoder=not args.no_hold_vocoder,
    )  # fmt: skip
    t0 = time.perf_counter()
    engine = StreamEngine(model, config)
    engine_s = time.perf_counter() - t0
    engine.start()
    voice = Voice(reference, PROMPT_TEXT, "en")
    warm_s = warm_up(engine, voice, args)
    if not args.no_gc_freeze:
        freeze_long_lived()  # as the server's worker does after its preloads' warm-ups
    rows, skipped = [], []
    for level in levels:
        if time.perf_counter() - t_start + args.duration + args.drain > args.budget_s:
            skipped.append(level)
            continue
        row = run_level(engine, voice, level, args, mix)
        rows.append(row)
        print(
            json.dumps(
                {
                    k: row[k]
                    for k in (
                        "level",
                        "mean_active_streams",
                        "mean_active_streams_steady",
                        "t2s_tokens_per_s",
                        "first_audio_s",
                        "underruns",
                        "stage_s",
                        "vocoder_rows_per_call",
                        "vocoder",
                        "encoder",
                    )
                }
            )
        )
    engine.stop()
    gc.unfreeze()  # else objects frozen at exit are reported as leaks by Triton's bindings
    record = meta(args, set_s)
    record["benchmark"] = "gpt_sovits_v3_streams_open_loop"
    record["timing"] = "host wall clock (perf_counter) in the engine's callbacks; arrivals open loop"
    record["workload"].update(mix=mix, chunk_tokens=args.chunk_tokens, max_tokens=args.max_tokens or None,
                              duration_s=args.duration, drain_s=args.drain,
                              expected_audio_s_per_stream=expected_seconds(args, mix))  # fmt: skip
    record.update(
        profile=args.profile, optimization_manifest=manifest, engine_config=vars(config),
        gc_frozen_after_warm_up=not args.no_gc_freeze,
        t2s_graphs=len(engine.t2s.graphs.captured_buckets), vocoder_graphs_at_start=engine.vocoder_graphs_at_start,
        encoder_graphs_at_start=len(engine.encoder_graphs_at_start),
        setup_s={"set": set_s, "load": load_s,
        "engine": engine_s, "warm_up": warm_s}, levels=rows, skipped_levels_for_budget=skipped,
        total_s=time.perf_counter() - t_start,
    )  # fmt: skip
    if args.device.startswith("cuda"):
        record["peak_allocated_gib"] = torch.cuda.max_memory_allocated() / 2**30
    args.out.parent.mkdir(parents=True, exist_ok=True)
    record["plot"] = (
        plot(record, args.plot or args.out.with_suffix(".png")) if rows else "skipped: no level ran"
    )
    args.out.write_text(json.dumps(record, indent=1, default=str))
    print(
        f"wrote {args.out} ({record['plot']}); {len(rows)} levels, skipped {skipped}, {record['total_s']:.0f} s"
    )


if __name__ == "__main__":
    main()
