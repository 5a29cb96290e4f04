"""Evidence for the optimization layer and the `voicehub bench` runs of issue 5.

Parts (--parts, comma-separated; each wrapped: a failure prints its error and the rest go on):
- vits-evidence: the real Piper voice (en_US-joe-medium), fp32: audio of attention=sdpa and of
  compile against eager for three texts (relative L2; a length change counts as a failure) and the
  time of the long text, written as exactness evidence files.
- vits-bench: the bench protocol on the same voice (eager, each technique alone, auto), >= 10 s
  text, the audio of every profile saved so the quality gate scores it on the CPU (`score`).
- gpt-evidence: full-size random GPT-SoVITS v3 weights, fp16, CUDA graphs `full`: kernels=torch and
  kernels=triton against the eager reference: greedy T2S tokens under the margin rule (eager's own
  decision margins, epsilon MARGIN_EPSILON), the CFM mel and the vocoder audio of the same tokens
  (relative L2), and the sentence time; written as exactness evidence files.
- gpt-compile-evidence: the same comparison for compile (inductor on the DiT blocks), its own part
  so the others never wait on the compiler; its timing is against auto's kernels without compile
  (what auto would run otherwise), its outputs and tokens against native eager.
  OUT/gpt_compile_progress.json says which stage it reached and when, so a run killed by its time
  limit still records how far the compile got.
- gpt-bench: the bench protocol: eager (graphs off), cuda_graphs (static KV + graphs, `full`),
  kernel_backend=triton and auto (both `full`).
- score (CPU, after a GPU run): the quality gate on vits-bench's saved audio (WER, speaker
  similarity, loudness, ...), written into its JSON and Markdown.

Phonemes: the GPU machine has no espeak-ng, so the Piper texts come with the phonemes
espeak-ng gave here (benchmarks/data/vits_bench_sentences.json, see vits_bench.py --prepare).
Evidence files go to --evidence-dir (default OUT/evidence); --install-evidence also copies them
into voicehub/optimization/evidence/ of this tree, so a later part's `auto` sees them.

    # GPU (benchmarks/gpu_session.sh parts piper, evidence, gptbench, gptcompile run these)
    python benchmarks/optimization_evidence.py --parts vits-evidence,vits-bench --install-evidence --out $OUT
    python benchmarks/optimization_evidence.py --parts gpt-evidence,gpt-bench --set /tmp/v3full --install-evidence --out $OUT
    python benchmarks/optimization_evidence.py --parts gpt-compile-evidence --set /tmp/v3full --install-evidence --out $OUT
    # CPU, afterwards: quality of the Piper profiles
    python benchmarks/optimization_evidence.py --parts score --out benchmarks/results/optimization
    # CPU smoke of every part (~9 min on 2 cores)
    python benchmarks/optimization_evidence.py --device cpu --size tiny --compile-backend aot_eager --reps 3 \
        --min-audio-s 1 --parts vits-evidence,vits-bench,gpt-evidence,gpt-compile-evidence,gpt-bench,score --out /tmp/oe
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

from optimization_evidence_gpt import gpt_bench, gpt_compile_evidence, gpt_evidence
from optimization_evidence_record import MARGIN_EPSILON, ROOT, SEED, median_s, rel_l2, sha256, write_evidence

from voicehub.optimization import TTSOptimizationConfig
from voicehub.optimization.evidence import MAX_REL_L2

SENTENCES = ROOT / "benchmarks" / "data" / "vits_bench_sentences.json"


# -- VITS (the real Piper voice) -------------------------------------------------------------------


def piper_voice(args, lazy: bool = False):
    from voicehub.models.vits import load, resolve
    from voicehub.models.vits.phonemes import Sentence

    entries = json.loads(SENTENCES.read_text(encoding="utf-8"))
    by_text = {
        e["text"]: [Sentence(s["text"], tuple(s["phonemes"])) for s in e["sentences"]]
        for e in entries.values()
    }
    path = resolve("en_US-joe-medium")
    model = load(path, device=args.device, dtype="float32", lazy_load=lazy)
    model.phonemize = lambda text: iter(by_text[text])  # espeak-ng output made where it exists
    return model, {k: e["text"] for k, e in entries.items()}, path


VITS_TECHNIQUES = (
    ("attention", "sdpa", {"attn_implementation": "sdpa"}),
    ("compile", "torch_compile", {"compile": "required"}),
)


def vits_evidence(args) -> None:
    from voicehub.models.vits import optimization as vits_opt

    vits_opt.COMPILE_BACKEND = args.compile_backend
    model, texts, path = piper_voice(args)
    checkpoint = {"kind": "real", "name": "en_US-joe-medium", "sha256": {path.name: sha256(path)}}
    speak = lambda text: model.generate(text, seed=SEED).audio  # noqa: E731
    native = {k: speak(t) for k, t in texts.items()}
    eager_s = median_s(lambda: speak(texts["long"]), args.reps, args.device)
    for feature, technique, config in VITS_TECHNIQUES:
        try:
            t0 = time.perf_counter()
            model.optimize(TTSOptimizationConfig(**config))
            apply_s = time.perf_counter() - t0
            outputs = []
            for k, t in texts.items():
                out = speak(t)
                outputs.append({"name": f"audio_{k}", "rel_l2": rel_l2(out, native[k]), "n_samples": len(out),
                                "eager_n_samples": len(native[k])})  # fmt: skip
            opt_s = median_s(lambda: speak(texts["long"]), args.reps, args.device)
        except Exception:
            print(f"vits-evidence {technique} failed:\n{traceback.format_exc()}", flush=True)
            continue
        finally:
            if model.optimization_result is not None:
                model.restore_tts_optimization()
        measurements = {
            "tolerance_rel_l2": MAX_REL_L2["float32"], "margin_epsilon": MARGIN_EPSILON, "outputs": outputs,
            "timing": {"eager_ms": eager_s * 1e3, "optimized_ms": opt_s * 1e3, "what": "generate(long text), median",
                       "reps": args.reps},
            "apply_s": apply_s, "compile_backend": args.compile_backend if feature == "compile" else None,
        }  # fmt: skip
        print(
            f"vits {technique}: {outputs}, eager {eager_s * 1e3:.1f} ms, optimized {opt_s * 1e3:.1f} ms",
            flush=True,
        )
        write_evidence(args, "vits", feature, technique, "float32", checkpoint, measurements)


def vits_bench(args) -> None:
    from voicehub.bench.protocol import BenchSettings, default_profiles, run_benchmark
    from voicehub.bench.report import markdown_table, write_reports
    from voicehub.models.vits import optimization as vits_opt
    from voicehub.optimization.mixin import detect_gpu_arch

    vits_opt.COMPILE_BACKEND = args.compile_backend
    _, texts, _ = piper_voice(args, lazy=True)
    settings = BenchSettings(
        model_type="vits", text=texts["long"], model="en_US-joe-medium", seed=SEED, device=args.device,
        dtype="float32", gpu_arch=detect_gpu_arch(args.device), n_warmup=1, n_reps=args.reps,
    )  # fmt: skip
    out = args.out / "vits_bench"
    record = run_benchmark(
        lambda: piper_voice(args)[0], settings, default_profiles("vits"), audio_dir=out / "audio"
    )
    write_reports(record, out)
    print(markdown_table(record), flush=True)


def score(args) -> None:
    from voicehub.bench.protocol import score_saved_audio
    from voicehub.bench.quality import QualityGate
    from voicehub.bench.report import markdown_table, write_reports

    out = args.out / "vits_bench"
    record = json.loads((out / "bench.json").read_text(encoding="utf-8"))
    record = score_saved_audio(record, out / "audio", QualityGate("en"))
    write_reports(record, out)
    print(markdown_table(record), flush=True)


PARTS = {"vits-evidence": vits_evidence, "vits-bench": vits_bench, "gpt-evidence": gpt_evidence,
         "gpt-compile-evidence": gpt_compile_evidence, "gpt-bench": gpt_bench, "score": score}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--parts", default="vits-evidence,vits-bench,gpt-evidence,gpt-bench")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--device", default="cuda")
    p.add_argument(
        "--size", default="full", help="make-checkpoint size of the GPT-SoVITS set (tiny for a smoke run)"
    )
    p.add_argument(
        "--set", type=Path, default=None, help="an existing make-checkpoint set (default: made under OUT)"
    )
    p.add_argument("--gpt-dtype", default=None, help="default: float16 on CUDA, float32 on the CPU")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--compile-backend", default="inductor")
    p.add_argument(
        "--min-audio-s", type=float, default=10.0, help="the protocol's minimum (lower only for a smoke run)"
    )
    p.add_argument("--evidence-dir", type=Path, default=None)
    p.add_argument(
        "--install-evidence",
        action="store_true",
        help="also copy GPU evidence into voicehub/optimization/evidence/",
    )
    args = p.parse_args()
    args.gpt_dtype = args.gpt_dtype or ("float16" if args.device.startswith("cuda") else "float32")
    args.out.mkdir(parents=True, exist_ok=True)
    failed = []
    for part in [x.strip() for x in args.parts.split(",") if x.strip()]:
        print(f"== {part}", flush=True)
        t0 = time.perf_counter()
        try:
            PARTS[part](args)
        except Exception:
            failed.append(part)
            print(f"{part} failed:\n{traceback.format_exc()}", flush=True)
        print(f"== {part} done in {time.perf_counter() - t0:.1f} s", flush=True)
    if failed:
        sys.exit(f"failed parts: {', '.join(failed)}")


if __name__ == "__main__":
    main()
