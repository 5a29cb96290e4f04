"""Kernel benchmark on a CUDA GPU: each registered op's backends against its reference.

For every op and shape it checks the `torch` and `triton` backends against the reference on the
GPU (float32 and float16; rel. L2 <= 1e-3 and <= 1e-2), then times all three: `eager` is the
median of per-call CUDA-event times after warm-ups (launch overhead included), `graph` the median
replay time of a CUDA graph of several calls divided by the calls (GPU time, as in a captured
decode step). Shapes are the real ones: BigVGAN v2 24 kHz 256x activations for mel lengths
70/128/298/598, the T2S decoder's add+LayerNorm at [B, 512] and its attention (16 heads of 32)
over KV buckets of 256..2048 slots. With --vocoder it also times a full-size random-weight BigVGAN
forward with each activation backend (ms per second of audio). A failing variant prints its error
and the run goes on. Prints a table; writes JSON to --out.

    python benchmarks/kernels_bench.py --out results/kernels_h200.json --vocoder
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import socket
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any

import torch
from bench_meta import capture, event_ms

from voicehub.runtime.kernels import registry
from voicehub.runtime.kernels.registry import ADD_LAYER_NORM, ANTI_ALIAS_SNAKE, DECODE_ATTENTION

TOLERANCE = {"float32": 1e-3, "float16": 1e-2}  # rel. L2 against the reference
DTYPES = {"float32": torch.float32, "float16": torch.float16}
MEL_LENGTHS = (70, 128, 298, 598)  # mel frames
BATCHES = (1, 2, 4, 8, 16, 32, 64)
KV_BUCKETS = (256, 512, 1024, 2048)
N_LAYER, N_HEAD, HEAD_DIM, WIDTH = 24, 16, 32, 512  # the T2S decoder of v3
# bigvgan_v2_24khz_100band_256x (voicehub.models.gpt_sovits.bigvgan.checkpoint), written out so the
# kernel sections import no model package: upsample_initial_channel, upsample_rates, and
# 3 resblocks x 3 dilations x 2 activations (AMPBlock1) after each upsampler
BIGVGAN_CHANNELS, BIGVGAN_UPSAMPLE_RATES, BIGVGAN_ACTS_PER_STAGE = 1536, (4, 4, 2, 2, 2, 2), 18
GRAPH_CALLS = 24  # calls per captured graph (one per decoder layer for attention)


@dataclass
class Row:
    op: str
    shape: str
    dtype: str
    impl: str
    eager_ms: float | None = None
    graph_ms: float | None = None
    rel_l2: float | None = None
    passed: bool | None = None
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def rel_l2(got: torch.Tensor, want: torch.Tensor) -> float:
    if not torch.isfinite(got).all():
        return float("inf")
    got, want = got.double(), want.double()
    return ((got - want).norm() / want.norm().clamp_min(1e-30)).item()


def time_graph(calls: list[Callable[[], Any]], warmup: int, reps: int) -> float:
    """Median ms per call of a CUDA graph replaying `calls` in order (no launch overhead)."""

    def all_calls() -> None:
        for fn in calls:
            fn()

    return event_ms(capture(all_calls).replay, warmup, reps) / len(calls)


def run_variant(rows: list[Row], row: Row, body: Callable[[Row], None]) -> None:
    """Fill `row` with `body`; on any error record and print it and go on."""
    try:
        body(row)
    except Exception as exc:  # a broken variant must not stop the run
        row.error = f"{type(exc).__name__}: {exc}"
        print(f"  ERROR {row.op} {row.shape} {row.dtype} {row.impl}: {row.error}", file=sys.stderr)
        traceback.print_exc(limit=3)
        torch.cuda.synchronize()
    rows.append(row)
    print(format_row(row), flush=True)


def impls(op: str) -> list[tuple[str, Callable[..., Any]]]:
    """("reference", f), then each backend available on this GPU (a missing one is reported)."""
    found = [("reference", registry.reference(op))]
    for backend in registry.backends(op):
        reason = registry.available(op, backend, "cuda")
        if reason is None:
            found.append((backend.value, registry.get(op, backend)))
        else:
            print(f"  {op}: {backend.value} skipped: {reason}")
    return found


def bench_op(
    rows: list[Row],
    op: str,
    shape: str,
    dtype: str,
    make_calls: Callable[[], list[tuple]],
    args: argparse.Namespace,
) -> None:
    """Check and time every implementation of `op` on argument tuples from make_calls()[0..]."""
    try:
        calls = make_calls()
        first = calls[0]
        want = registry.reference(op)(*first)
        # float16 runs are also compared to the float32 reference on the same (rounded) inputs
        ref = registry.reference(op)
        want32 = ref(*(a.float() if _is_float(a) else a for a in first)) if dtype != "float32" else None
    except Exception as exc:  # inputs or the reference failed: record it, go on with the next shape
        run_variant(rows, Row(op, shape, dtype, "reference"), _raiser(exc))
        return
    for name, fn in impls(op):

        def body(row: Row, fn=fn) -> None:
            got = fn(*first)
            torch.cuda.synchronize()
            row.rel_l2 = rel_l2(got, want)
            row.passed = row.rel_l2 <= TOLERANCE[dtype]
            if want32 is not None:
                row.extra["rel_l2_vs_fp32_reference"] = rel_l2(got, want32)
            row.eager_ms = event_ms(lambda: fn(*first), args.warmup, args.reps)
            row.graph_ms = time_graph([lambda a=a: fn(*a) for a in calls], args.warmup, args.reps)

        run_variant(rows, Row(op, shape, dtype, name), body)


def _raiser(exc: Exception) -> Callable[[Row], None]:
    def body(row: Row) -> None:
        raise exc

    return body


def _is_float(a: Any) -> bool:
    return isinstance(a, torch.Tensor) and a.is_floating_point()


def snake_stages(mel_len: int) -> list[tuple[int, int, int]]:
    """(channels, samples, activations per forward) of each BigVGAN v2 24 kHz 256x stage."""
    ch, t, stages = BIGVGAN_CHANNELS, mel_len, []
    for rate in BIGVGAN_UPSAMPLE_RATES:
        ch, t = ch // 2, t * rate
        stages.append((ch, t, BIGVGAN_ACTS_PER_STAGE))
    stages.append((ch, t, 1))  # activation_post
    return stages


def lowpass_filter() -> torch.Tensor:
    """BigVGAN's 12-tap kaiser-windowed sinc (cutoff 0.25, half-width 0.3) [1, 1, 12]; designed here
    so this section does not import the model package (whose audio deps a GPU box may lack)."""
    half, delta_f = 6, 4 * 0.3
    attenuation = 2.285 * (half - 1) * math.pi * delta_f + 7.95
    window = torch.kaiser_window(12, beta=0.1102 * (attenuation - 8.7), periodic=False)
    filt = 0.5 * window * torch.sinc(0.5 * (torch.arange(-half, half) + 0.5))
    return (filt / filt.sum()).view(1, 1, 12)


def bench_snake(rows: list[Row], args: argparse.Namespace) -> None:
    filt = lowpass_filter().cuda()
    for mel_len in args.mel_lengths:
        for ch, t, n_acts in snake_stages(mel_len):
            for dtype in args.dtypes:
                dt = DTYPES[dtype]

                def make(ch=ch, t=t, dt=dt) -> list[tuple]:
                    g = torch.Generator(device="cuda").manual_seed(ch + t)
                    x = torch.randn(1, ch, t, device="cuda", generator=g).to(dt)
                    alpha = (0.3 * torch.randn(ch, device="cuda", generator=g)).to(dt)
                    beta = (0.3 * torch.randn(ch, device="cuda", generator=g)).to(dt)
                    return [(x, filt.to(dt), filt.to(dt), alpha, beta, True)] * 4

                before = len(rows)
                bench_op(rows, ANTI_ALIAS_SNAKE, f"mel{mel_len} C{ch} T{t}", dtype, make, args)
                for row in rows[before:]:
                    row.extra.update(mel_len=mel_len, activations_per_forward=n_acts)


def bench_layer_norm(rows: list[Row], args: argparse.Namespace) -> None:
    for batch in BATCHES:
        for dtype in args.dtypes:
            dt = DTYPES[dtype]

            def make(batch=batch, dt=dt) -> list[tuple]:
                g = torch.Generator(device="cuda").manual_seed(batch)
                out = []
                for _ in range(GRAPH_CALLS):
                    x, r = (torch.randn(batch, WIDTH, device="cuda", generator=g).to(dt) for _ in range(2))
                    w, b = (torch.randn(WIDTH, device="cuda", generator=g).to(dt) for _ in range(2))
                    out.append((x, r, w, b, 1e-5))
                return out

            bench_op(rows, ADD_LAYER_NORM, f"B{batch} D{WIDTH}", dtype, make, args)


def bench_attention(rows: list[Row], args: argparse.Namespace) -> None:
    from voicehub.runtime.kv_cache import StaticKVCache

    for batch in (1, 64):
        for n_slots in KV_BUCKETS:
            for dtype in args.dtypes:
                dt = DTYPES[dtype]

                def make(batch=batch, n_slots=n_slots, dt=dt) -> list[tuple]:
                    # one call per layer of a real-size cache, so a graph reads 24 layers' KV as a step does
                    cache = StaticKVCache(N_LAYER, batch, N_HEAD, n_slots, HEAD_DIM, device="cuda", dtype=dt)
                    g = torch.Generator(device="cuda").manual_seed(batch * n_slots)
                    cache.k.normal_(generator=g)
                    cache.v.normal_(generator=g)
                    low = n_slots // 2 if batch > 1 else n_slots - 1
                    n_valid = torch.randint(low, n_slots + 1, (batch,), device="cuda", generator=g)
                    q = torch.randn(batch, N_HEAD, HEAD_DIM, device="cuda", generator=g).to(dt)
                    return [(q, *cache.view(i, n_slots), n_valid, None) for i in range(N_LAYER)]

                bench_op(rows, DECODE_ATTENTION, f"B{batch} H{N_HEAD} S{n_slots}", dtype, make, args)


def bench_vocoder(rows: list[Row], args: argparse.Namespace) -> None:
    from voicehub.models.gpt_sovits.bigvgan.checkpoint import load_bigvgan, make_bigvgan_folder

    with tempfile.TemporaryDirectory() as tmp:
        vocoder = load_bigvgan(make_bigvgan_folder(tmp, "full", seed=0)).cuda()
    mels = {}
    for mel_len in args.mel_lengths:
        g = torch.Generator(device="cuda").manual_seed(mel_len)
        mels[mel_len] = torch.randn(1, 100, mel_len, device="cuda", generator=g) * 2 - 6
    with torch.inference_mode():
        want32 = {n: vocoder(mel) for n, mel in mels.items()}  # float32 reference activations
        for dtype in args.dtypes:
            vocoder = vocoder.to(DTYPES[dtype])
            for mel_len, mel in mels.items():
                mel = mel.to(DTYPES[dtype])
                own_error = rel_l2(vocoder(mel), want32[mel_len])  # the reference's own rounding
                for name, fn in impls(ANTI_ALIAS_SNAKE):
                    row = Row("bigvgan_forward", f"mel{mel_len}", dtype, name)
                    row.extra["reference_rel_l2_vs_fp32"] = own_error
                    run_variant(rows, row, partial(_time_vocoder, vocoder=vocoder, kernel=fn, mel=mel,
                                                   want=want32[mel_len], args=args))  # fmt: skip


def _time_vocoder(row: Row, vocoder, kernel, mel: torch.Tensor, want: torch.Tensor, args) -> None:
    """rel_l2 is against the float32 reference; passes within the float32 tolerance (1e-3)
    or, in float16, no worse than 1.25x the float16 reference's own error (random full-size
    weights amplify rounding through ~100 layers, so the per-op tolerance does not carry over)."""
    audio_s = mel.shape[-1] * vocoder.conf.hop_size / vocoder.conf.sampling_rate
    previous = vocoder.set_activation_kernel(kernel)
    try:
        row.rel_l2 = rel_l2(vocoder(mel), want)
        allowed = TOLERANCE["float32"]
        if row.dtype != "float32":
            allowed = max(allowed, 1.25 * row.extra["reference_rel_l2_vs_fp32"])
        row.passed = row.rel_l2 <= allowed
        reps = max(3, args.reps // 5)
        row.eager_ms = event_ms(lambda: vocoder(mel), 2, reps)
        row.graph_ms = time_graph([lambda: vocoder(mel)], 2, reps)
        row.extra["ms_per_audio_second"] = row.eager_ms / audio_s
        row.extra["graph_ms_per_audio_second"] = row.graph_ms / audio_s
    finally:
        vocoder.set_activation_kernel(previous)


def format_row(r: Row) -> str:
    def ms(v: float | None) -> str:
        return f"{v * 1000:9.1f}" if v is not None else "        -"

    err = f"{r.rel_l2:.1e}" if r.rel_l2 is not None else "-"
    ok = {True: "ok", False: "FAIL", None: "-"}[r.passed] if r.error is None else "ERROR"
    per_s = r.extra.get("graph_ms_per_audio_second")
    note = f"  {per_s:.2f} ms/s audio (graph)" if per_s is not None else ""
    return f"{r.op:18} {r.shape:22} {r.dtype:8} {r.impl:10} {ms(r.eager_ms)} {ms(r.graph_ms)} {err:>8} {ok}{note}"


def summarize(rows: list[Row]) -> dict[str, Any]:
    """BigVGAN activation time per forward and per audio second, for each impl, mel length, dtype."""
    totals: dict[str, float] = {}
    for r in rows:
        if r.op == ANTI_ALIAS_SNAKE and r.graph_ms is not None:
            key = f"mel{r.extra['mel_len']} {r.dtype} {r.impl}"
            totals[key] = totals.get(key, 0.0) + r.graph_ms * r.extra["activations_per_forward"]
    return {"snake_ms_per_vocoder_forward(graph)": totals}


def environment(args: argparse.Namespace) -> dict[str, Any]:
    import triton

    props = torch.cuda.get_device_properties(0)
    return {
        "machine": {"host": socket.gethostname(), "gpu": props.name, "sm_count": props.multi_processor_count,
                    "capability": f"sm_{props.major}{props.minor}", "memory_gib": props.total_memory / 2**30},
        "versions": {"python": platform.python_version(), "torch": torch.__version__, "triton": triton.__version__,
                     "cuda": torch.version.cuda},
        "command": " ".join([sys.executable, *sys.argv]),
        "warmup_calls": args.warmup, "reps": args.reps, "graph_calls": GRAPH_CALLS,
        "timing": "eager: median of per-call CUDA-event times; graph: median replay / calls per graph",
        "tolerance_rel_l2": TOLERANCE,
        "tf32": False,
        "time_unit_in_table": "microseconds (JSON: *_ms in milliseconds)",
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="JSON results path")
    p.add_argument("--dtypes", default="float32,float16", help="comma list of float32, float16")
    p.add_argument(
        "--ops", default="snake,layer_norm,attention", help="comma list of snake, layer_norm, attention"
    )
    p.add_argument("--mel-lengths", default=",".join(map(str, MEL_LENGTHS)))
    p.add_argument("--warmup", type=int, default=10, help="untimed calls before timing")
    p.add_argument("--reps", type=int, default=50, help="timed calls (or graph replays)")
    p.add_argument("--vocoder", action="store_true", help="also time a full-size random BigVGAN forward")
    args = p.parse_args(argv)
    args.dtypes = [d for d in args.dtypes.split(",") if d]
    args.mel_lengths = [int(n) for n in args.mel_lengths.split(",") if n]
    if unknown := set(args.dtypes) - set(DTYPES):
        p.error(f"unknown dtypes {sorted(unknown)}; valid: {', '.join(DTYPES)}")
    if not torch.cuda.is_available():
        p.error("no CUDA GPU: this benchmark runs on a GPU (the CPU tests cover the interpreter)")
    # float32 means float32: TF32 convolutions/matmuls would put ~1e-3 rounding into the references
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    sections = {"snake": bench_snake, "layer_norm": bench_layer_norm, "attention": bench_attention}
    rows: list[Row] = []
    started = time.time()
    print(f"{'op':18} {'shape':22} {'dtype':8} {'impl':10} {'eager us':>9} {'graph us':>9} {'rel L2':>8}")
    for name in [s for s in args.ops.split(",") if s]:
        if name not in sections:
            p.error(f"unknown op section {name!r}; valid: {', '.join(sections)}")
        run_section_safely(sections[name], rows, args)
    if args.vocoder:
        run_section_safely(bench_vocoder, rows, args)
    summary = summarize(rows)
    for key, ms in summary["snake_ms_per_vocoder_forward(graph)"].items():
        print(f"snake total per forward {key}: {ms:.3f} ms")
    failures = [r for r in rows if r.error or r.passed is False]
    result = {**environment(args), "wall_s": time.time() - started, "summary": summary,
              "n_failures": len(failures), "rows": [asdict(r) for r in rows]}  # fmt: skip
    with open(args.out, "w") as fh:
        json.dump(result, fh, indent=1)
    print(f"wrote {args.out}: {len(rows)} rows, {len(failures)} failed or errored")
    return 1 if failures else 0


def run_section_safely(section: Callable[[list[Row], argparse.Namespace], None], rows, args) -> None:
    try:
        section(rows, args)
    except Exception:  # e.g. building the model failed: report and keep the rest of the results
        traceback.print_exc()
        rows.append(Row(section.__name__, "-", "-", "-", error=traceback.format_exc(limit=2)))


if __name__ == "__main__":
    sys.exit(main())
