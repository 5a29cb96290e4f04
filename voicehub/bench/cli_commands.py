"""`voicehub bench | quality | support | listening-kit | listening-score`: parsers and handlers,
wired into voicehub/cli.py.

`add_parsers(subparsers)` adds the commands; `run(args)` runs one and returns the exit code
(quality: 0 accepted, 1 rejected).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

EXIT_REJECTED = 1
# About 15 s of speech from an English voice: the protocol needs >= 10 s of audio.
DEFAULT_TEXT = (
    "The old lighthouse keeper climbed the spiral stairs every evening at dusk. From the top he could "
    "see the fishing boats returning to the harbour, their lamps swaying over the dark water. He wrote "
    "the weather in a small notebook, and on quiet nights he read aloud to the gulls."
)
COMMANDS = ("bench", "quality", "support", "listening-kit", "listening-score")


def _text_args(p: argparse.ArgumentParser, default: str | None) -> None:
    p.add_argument(
        "--text",
        default=default,
        help="the text to speak" + (" (default: a built-in paragraph)" if default else ""),
    )
    p.add_argument("--text-file", type=Path, default=None, help="read the text from a UTF-8 file")
    p.add_argument(
        "--language", default="en", help="language of the text: en scores WER, zh/ja CER (default: en)"
    )


def add_parsers(subparsers: Any) -> None:
    """Add `bench`, `quality`, `support` and the listening-test commands to the CLI's subparsers."""
    bench = subparsers.add_parser("bench", help="benchmark eager against each optimization and auto")
    bench.add_argument(
        "--model", "-m", default=None, help="installed voice name or path (default: the embedded voice)"
    )
    bench.add_argument(
        "--model-type", default=None, help="model family; inferred from the files when omitted"
    )
    bench.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default: cpu)")
    bench.add_argument("--dtype", default="float32", help="float32, float16 or bfloat16 (default: float32)")
    bench.add_argument(
        "--cuda-graph-preset",
        default=None,
        help="full, minimal, lazy or off: engine configuration of every profile but eager, which loads "
        "with off; adds a cuda_graphs profile (recorded in the manifests)",
    )
    bench.add_argument("--seed", type=int, default=0)
    bench.add_argument(
        "--warmup", type=int, default=1, help="untimed warm-ups; the first is the cold latency"
    )
    bench.add_argument("--reps", type=int, default=3, help="measured repetitions (>= 3)")
    bench.add_argument("--profiles", default=None, help="comma-separated profile names (default: all)")
    bench.add_argument(
        "--quality", action="store_true", help="score each profile against eager with the quality gate"
    )
    bench.add_argument("--out", type=Path, default=None, help="output folder (default: bench-<model_type>)")
    bench.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a request parameter for every generate() call, e.g. force_n_tokens=110 (repeatable)",
    )
    bench.add_argument(
        "--ref-audio", type=Path, default=None, help="reference audio of a voice-cloning model"
    )
    bench.add_argument("--prompt-text", default=None, help="transcript of --ref-audio")
    bench.add_argument("--prompt-language", default="en", help="language of --prompt-text (default: en)")
    bench.add_argument(
        "--save-audio", action="store_true", help="also write each profile's audio under OUT/audio/"
    )
    _text_args(bench, DEFAULT_TEXT)

    quality = subparsers.add_parser("quality", help="score a candidate audio file against the eager one")
    quality.add_argument("eager", type=Path, help="the eager (reference) audio file")
    quality.add_argument("candidate", type=Path, help="the optimized audio file, same text and seed")
    quality.add_argument("--json", type=Path, default=None, help="also write the report here")
    quality.add_argument(
        "--whisper", default="base", help="Whisper size for intelligibility: base or tiny.en"
    )
    _text_args(quality, None)

    support = subparsers.add_parser("support", help="which optimizations each model family supports")
    support.add_argument("model_type", nargs="?", default=None, help="one family (default: all)")
    support.add_argument("--json", action="store_true", help="print JSON")
    support.add_argument("--device", default=None, help="also show what auto resolves to on this device")
    support.add_argument("--dtype", default="float16")
    support.add_argument("--gpu-arch", default=None, help="e.g. sm_90 (detected when --device is a CUDA GPU)")
    _add_listening_parsers(subparsers)


def _add_listening_parsers(subparsers: Any) -> None:
    kit = subparsers.add_parser(
        "listening-kit", help="a blinded A/B listening test (HTML page + key) from saved bench audio"
    )
    kit.add_argument(
        "bench_dirs",
        nargs="+",
        type=Path,
        metavar="BENCH_DIR",
        help="--out folder of `voicehub bench --save-audio`; each further run (other text or seed) adds items",
    )
    kit.add_argument("--out", type=Path, required=True, help="the kit folder to create (must not exist)")
    kit.add_argument(
        "--key", type=Path, default=None, help="the key file (default: KIT_DIR-key.json beside the folder)"
    )
    kit.add_argument(
        "--seed", type=int, default=None, help="shuffling seed (default: a random one, recorded in the key)"
    )
    kit.add_argument("--profiles", default=None, help="comma-separated profiles (default: all saved)")
    kit.add_argument("--reference", default="eager", help="the profile every other is paired with")
    kit.add_argument("--title", default="Listening test", help="the page's title (name no system in it)")

    score = subparsers.add_parser(
        "listening-score", help="count the preferences in a listening kit's answers"
    )
    score.add_argument("key", type=Path, help="the kit's key file")
    score.add_argument("answers", type=Path, nargs="+", help="answers files downloaded from the kit's page")
    score.add_argument("--json", action="store_true", help="print JSON")


def _read_text(args: argparse.Namespace) -> str:
    if args.text_file is not None:
        return args.text_file.read_text(encoding="utf-8")
    if not args.text:
        raise ValueError("give the text with --text or --text-file")
    return args.text


def cmd_support(args: argparse.Namespace) -> int:
    from voicehub.optimization import (
        OptimizationContext,
        TTSOptimizationConfig,
        get_tts_optimization_support,
        list_tts_optimization_support,
    )

    items = (
        [get_tts_optimization_support(args.model_type)]
        if args.model_type
        else list_tts_optimization_support()
    )
    plans = {}
    if args.device is not None:
        from voicehub.optimization.mixin import detect_gpu_arch

        arch = args.gpu_arch or (detect_gpu_arch(args.device) if args.device.startswith("cuda") else None)
        ctx = OptimizationContext("inference", args.device, args.dtype, arch)
        plans = {s.model_type: TTSOptimizationConfig().resolve(s.model_type, context=ctx) for s in items}
    if args.json:
        out = [
            {**s.to_dict(), **({"auto_plan": plans[s.model_type].to_dict()} if plans else {})} for s in items
        ]
        print(json.dumps(out, indent=2))
        return 0
    for s in items:
        print(f"{s.model_type}")
        for name in (
            "attention_implementations",
            "kernel_backends",
            "compile",
            "diffusion_cache",
            "diffusion_sampling",
        ):
            print(f"  {name}: {', '.join(getattr(s, name))}")
        print(f"  training: {'yes' if s.training else 'no'}")
        for note in s.notes:
            print(f"  - {note}")
        if plans:
            print(f"  auto on {args.device} {args.dtype}:")
            for d in plans[s.model_type].decisions:
                print(f"    {d.feature}: {d.selected} ({d.reason})")
    return 0


def cmd_quality(args: argparse.Namespace) -> int:
    from voicehub.audio.load import read_audio
    from voicehub.bench.quality import QualityGate

    text = _read_text(args)
    eager, rate = read_audio(args.eager)
    candidate, rate_c = read_audio(args.candidate)
    if rate != rate_c:
        raise ValueError(
            f"sample rates differ: {rate} Hz eager vs {rate_c} Hz candidate; compare audio of the same model"
        )
    report = QualityGate(args.language, whisper_size=args.whisper).compare(eager, candidate, rate, text)
    if args.json is not None:
        args.json.write_text(
            json.dumps(report.to_dict(), indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
        )
    e, c = report.eager, report.candidate
    metric = report.error_metric.upper()
    print(
        f"{metric}: eager {e.error_rate}, candidate {c.error_rate}; speaker similarity {report.speaker_similarity}"
    )
    print(
        f"loudness LUFS: eager {e.loudness_lufs}, candidate {c.loudness_lufs}; duration s: {e.duration_s:.3f} vs {c.duration_s:.3f}"
    )
    if report.accepted:
        print("accepted")
        return 0
    print("rejected: " + "; ".join(report.reasons))
    return EXIT_REJECTED


def parse_params(items: list[str]) -> dict[str, Any]:
    """NAME=VALUE pairs; a VALUE that reads as JSON (numbers, true, null) is taken as such."""
    params: dict[str, Any] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"--param {item!r} is not NAME=VALUE")
        try:
            params[name.strip()] = json.loads(value)
        except json.JSONDecodeError:
            params[name.strip()] = value
    return params


def _pick_profiles(model_type: str, names: str | None, cuda_graph_preset: str | None = None) -> list[Any]:
    from voicehub.bench.protocol import default_profiles

    profiles = default_profiles(model_type, cuda_graph_preset)
    if names is None:
        return profiles
    by_name = {p.name: p for p in profiles}
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in wanted if n not in by_name]
    if unknown:
        raise ValueError(f"unknown profile(s) {', '.join(unknown)}; valid: {', '.join(by_name)}")
    if "eager" not in wanted:
        wanted.insert(0, "eager")  # every figure is relative to eager
    return [by_name["eager"]] + [by_name[n] for n in wanted if n != "eager"]


def cmd_bench(args: argparse.Namespace) -> int:
    from voicehub.bench.protocol import BenchSettings, run_benchmark
    from voicehub.bench.report import markdown_table, write_reports
    from voicehub.hub import DEFAULT_MODEL, AutoModelForTextToSpeech
    from voicehub.models.registry import find_family
    from voicehub.optimization.mixin import detect_gpu_arch

    model_type = args.model_type or find_family(args.model or DEFAULT_MODEL)[0].model_type
    settings = BenchSettings(
        model_type=model_type,
        text=_read_text(args),
        model=str(args.model or DEFAULT_MODEL),
        seed=args.seed,
        device=args.device,
        dtype=args.dtype,
        gpu_arch=detect_gpu_arch(args.device),
        cuda_graph_preset=args.cuda_graph_preset,
        n_warmup=args.warmup,
        n_reps=args.reps,
        language=args.language,
        params=parse_params(args.param),
    )
    gate = None
    if args.quality:
        from voicehub.bench.quality import QualityGate

        gate = QualityGate(args.language)

    voice = {}
    if args.ref_audio is not None:
        voice = {"default_voice": {"ref_audio_path": str(args.ref_audio), "prompt_text": args.prompt_text or "",
                                   "prompt_language": args.prompt_language}}  # fmt: skip

    def load(**engine: Any) -> Any:
        return AutoModelForTextToSpeech.from_pretrained(
            args.model, model_type=model_type, device=args.device, dtype=args.dtype, **voice, **engine
        )

    out = args.out or Path(f"bench-{model_type}")
    profiles = _pick_profiles(model_type, args.profiles, args.cuda_graph_preset)
    audio_dir = out / "audio" if args.save_audio else None
    record = run_benchmark(load, settings, profiles, quality_gate=gate, audio_dir=audio_dir)
    paths = write_reports(record, out)
    sys.stdout.write(markdown_table(record))
    print(f"wrote {', '.join(str(p) for p in paths.values())}", file=sys.stderr)
    return 0


def cmd_listening_kit(args: argparse.Namespace) -> int:
    import secrets

    from voicehub.bench.listening import make_listening_kit, read_bench_runs

    profiles = [n.strip() for n in args.profiles.split(",") if n.strip()] if args.profiles else None
    samples, rate, texts = read_bench_runs(args.bench_dirs, profiles, args.reference)
    seed = args.seed if args.seed is not None else secrets.randbits(31)
    kit = make_listening_kit(
        args.out, samples, rate, args.reference, texts, seed=seed, key_path=args.key, title=args.title
    )
    others = ", ".join(s for s in samples if s != args.reference)
    print(f"wrote {kit.folder} ({kit.n_pairs} pairs: {args.reference} against {others}); open {kit.page}")
    print(f"key: {kit.key} (keep it away from listeners)")
    return 0


def cmd_listening_score(args: argparse.Namespace) -> int:
    from voicehub.bench.listening import add_tallies, read_json, score_answers, sign_test_p

    key = read_json(args.key, "key file")
    if not isinstance(key, dict) or not {"kit_id", "reference", "pairs"} <= key.keys():
        raise ValueError(f"{str(args.key)!r} is not a listening-kit key (needs kit_id, reference and pairs)")
    tallies = []
    for path in args.answers:
        try:
            tallies.append(score_answers(key, read_json(path, "answers file")))
        except ValueError as exc:
            raise ValueError(f"{str(path)!r}: {exc}") from exc
    total = add_tallies(tallies)
    for counts in total.values():
        counts["sign_test_p"] = sign_test_p(counts["preferred"], counts["reference_preferred"])
    if args.json:
        print(json.dumps({"kit_id": key["kit_id"], "reference": key["reference"], "n_answers": len(tallies),
                          "profiles": total}, indent=2))  # fmt: skip
        return 0
    ref = key["reference"]
    print(f"kit {key['kit_id']}: {len(tallies)} answers file(s); p: two-sided sign test, ties left out")
    print(f"| profile | preferred | {ref} preferred | no difference | unanswered | p |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, c in total.items():
        p = "-" if c["sign_test_p"] is None else f"{c['sign_test_p']:.3f}"
        print(
            f"| {name} | {c['preferred']} | {c['reference_preferred']} | {c['same']} | {c['unanswered']} | {p} |"
        )
    return 0


def run(args: argparse.Namespace) -> int:
    """Run `args.command` (one of COMMANDS); returns the process exit code."""
    handlers = {
        "bench": cmd_bench,
        "quality": cmd_quality,
        "support": cmd_support,
        "listening-kit": cmd_listening_kit,
        "listening-score": cmd_listening_score,
    }
    return handlers[args.command](args)
