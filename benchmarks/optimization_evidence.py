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
import hashlib
import json
import platform
import shutil
import statistics
import sys
import time
import traceback
from datetime import date
from importlib import metadata
from pathlib import Path

import numpy as np
import torch
from bench_meta import tree_commit

from voicehub.optimization import TTSOptimizationConfig
from voicehub.optimization.evidence import EXACTNESS, MAX_REL_L2, REJECTED, SCHEMA, VALIDATED, check_evidence

ROOT = Path(__file__).resolve().parent.parent
PACKAGE_EVIDENCE = ROOT / "voicehub" / "optimization" / "evidence"
SENTENCES = ROOT / "benchmarks" / "data" / "vits_bench_sentences.json"
SEED = 1234
MARGIN_EPSILON = 0.05  # logit units: greedy steps whose eager top-1/top-2 margin is larger must agree
GPT_TEXT = (
    "The old lighthouse keeper climbed the stairs at dusk. He watched the boats come home. "
    "Then he wrote the weather in his notebook."
)
GPT_TOKENS = 110  # per sentence: random weights never sample EOS; 3 x 110 tokens ~ 12 s at speed 1.1
GPT_PARAMS = {"preset": "balanced", "force_n_tokens": GPT_TOKENS, "how_to_cut": "punctuation"}
PROMPT_TEXT = "The quick brown fox jumps over the lazy dog, and then it runs away into the forest."


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


# -- GPT-SoVITS v3 (full-size random weights) -------------------------------------------------------


def gpt_set(args) -> Path:
    from voicehub.models.gpt_sovits.make_checkpoint import make_checkpoint_set

    if args.set is not None:  # made before, e.g. by `voicehub make-checkpoint gpt-sovits-v3 --size full`
        if not args.set.is_dir():
            raise FileNotFoundError(
                f"--set {args.set} is not a folder; make it with voicehub make-checkpoint"
            )
        return args.set
    folder = args.out / f"gpt-sovits-{args.size}"
    if not (folder / ".complete").exists():
        make_checkpoint_set(folder, args.size, seed=0, margin_tokens=0)
        (folder / ".complete").touch()
    return folder


def reference_wav(folder: Path) -> Path:
    """A speech-like stand-in for a reference clip (as e2e_bench.write_reference)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from e2e_bench import write_reference

    path = folder / "optimization_ref.wav"
    return path if path.exists() else write_reference(path)


def gpt_model(args, folder: Path, preset: str):
    from voicehub.models.gpt_sovits import Voice, load

    preset = preset if args.device.startswith("cuda") else "off"
    voice = Voice(reference_wav(folder), PROMPT_TEXT, "en")
    return load(
        folder, device=args.device, dtype=args.gpt_dtype, cuda_graph_preset=preset, default_voice=voice
    ), voice


def _token_check(eager, fast) -> dict:
    """Greedy tokens of a path against eager's under the margin rule, up to the first divergence."""
    margins, ref, got = eager.decision_margins.float().cpu(), eager.tokens.cpu(), fast.tokens.cpu()
    n = min(len(ref), len(got))
    differ = (ref[:n] != got[:n]).nonzero()
    first = int(differ[0]) if len(differ) else None
    upto = n if first is None else first + 1  # later steps follow a different history
    compared = int((margins[:upto] > MARGIN_EPSILON).sum())
    bad = int(first is not None and margins[first] > MARGIN_EPSILON)
    return {"name": "greedy", "n_steps": int(eager.n_steps), "n_compared": compared, "n_mismatched": bad,
            "first_divergence": None if first is None else {"step": first, "margin": float(margins[first])}}  # fmt: skip


class GptReference:
    """The loaded full-size set with eager's outputs, against which each technique is compared."""

    def __init__(self, args) -> None:
        from voicehub.models.gpt_sovits import techniques
        from voicehub.models.gpt_sovits.params import GptSovitsParams
        from voicehub.models.gpt_sovits.t2s import T2SRequest, decode
        from voicehub.text.options import Language

        techniques.COMPILE_BACKEND = args.compile_backend
        self.args, folder = args, gpt_set(args)
        t0 = time.perf_counter()
        self.model, voice = gpt_model(args, folder, "full")
        self.load_s = time.perf_counter() - t0
        files = self.model.files
        self.checkpoint = {"kind": "random", "size": args.size,
                           "sha256": {p.name: sha256(p) for p in (files.gpt, files.sovits)}}  # fmt: skip
        pipe = self.pipe = self.model.pipeline
        self.ref = pipe.reference(voice)
        self.sentence = pipe.text_features(
            "The old lighthouse keeper climbed the stairs at dusk.", Language.EN
        )
        self.params = GptSovitsParams.build(None, speed=1.0, top_k=1, top_p=1.0, temperature=1.0,
                                            repetition_penalty=1.0, force_n_tokens=GPT_TOKENS, sample_steps=4)  # fmt: skip
        phone_ids = torch.tensor(
            self.ref.phone_ids + self.sentence.phone_ids, dtype=torch.long, device=pipe.device
        )
        bert = torch.cat([self.ref.bert, self.sentence.bert], dim=1)
        request = T2SRequest(phone_ids, bert, self.ref.prompt_tokens, self.params.sampling(SEED))
        with torch.inference_mode():
            self.eager = decode(pipe.t2s, phone_ids, bert, self.ref.prompt_tokens, request.params)
        self.native_mel, self.native_audio = self.acoustic()
        self.native_s = self.sentence_s()
        print(f"gpt reference: load {self.load_s:.1f} s, sentence {self.native_s * 1e3:.0f} ms", flush=True)

    def acoustic(self):
        """The eager tokens through the CFM and the vocoder: [mel], [audio]."""
        from voicehub.models.gpt_sovits.bigvgan.model import vocode
        from voicehub.models.gpt_sovits.sovits.synth import decode_mel

        pipe = self.pipe
        with torch.inference_mode():
            phones = torch.tensor([self.sentence.phone_ids], device=pipe.device)
            gen = torch.Generator(device=pipe.device).manual_seed(SEED)
            tokens = self.eager.tokens[None, None].to(pipe.device)
            mel = decode_mel(pipe.sovits, self.ref.acoustic, tokens, phones, 4, generator=gen)
            return mel, vocode(pipe.vocoder, mel)

    def sentence_s(self) -> float:
        synth = lambda: self.pipe.synthesize_sentence(self.ref, self.sentence, self.params, SEED)  # noqa: E731
        return median_s(synth, self.args.reps, self.args.device)

    def timed_with(self, config: dict) -> float:
        """synthesize_sentence's median seconds with `config` applied (then restored)."""
        self.model.optimize(TTSOptimizationConfig(**config))
        try:
            return self.sentence_s()
        finally:
            self.model.restore_tts_optimization()

    def evidence(
        self, feature: str, technique: str, config: dict, progress=None, baseline: dict | None = None
    ) -> None:
        """Apply one technique, compare it with eager, restore; write its evidence file. baseline: the
        config the timing compares against (what auto runs without this technique), else native eager;
        outputs and tokens are always compared with native eager."""
        args, model, progress = self.args, self.model, progress or (lambda stage, **kw: None)
        base_s, base_what = self.native_s, "native eager"
        if baseline is not None:
            base_s, base_what = self.timed_with(baseline), f"the model with {baseline}"
            progress("baseline", baseline=baseline, baseline_sentence_ms=base_s * 1e3)
        try:
            progress("applying")
            t0 = time.perf_counter()
            model.optimize(TTSOptimizationConfig(**config))
            apply_s = time.perf_counter() - t0
            progress("applied", apply_s=apply_s)
            t0 = time.perf_counter()
            with torch.inference_mode():
                fast = self.pipe.decode_tokens(self.ref, self.sentence, self.params, SEED)
            mel, audio = self.acoustic()
            first_call_s = time.perf_counter() - t0  # includes any recompile the warm-up missed
            opt_s = self.sentence_s()
        except Exception:
            progress("failed", error=traceback.format_exc(limit=3))
            print(f"gpt-evidence {technique} failed:\n{traceback.format_exc()}", flush=True)
            return
        finally:
            if model.optimization_result is not None:
                model.restore_tts_optimization()
        measurements = {
            "tolerance_rel_l2": MAX_REL_L2[args.gpt_dtype], "margin_epsilon": MARGIN_EPSILON,
            "outputs": [{"name": "cfm_mel", "rel_l2": rel_l2(mel, self.native_mel)},
                        {"name": "vocoder_audio", "rel_l2": rel_l2(audio, self.native_audio)}],
            "tokens": [_token_check(self.eager, fast)],
            "timing": {"eager_ms": base_s * 1e3, "optimized_ms": opt_s * 1e3, "reps": args.reps,
                       "what": f"synthesize_sentence, {GPT_TOKENS} tokens, graphs {model.cuda_graph_preset.value}; "
                               f"eager_ms: {base_what} (native eager {self.native_s * 1e3:.1f} ms)"},
            "apply_s": apply_s, "first_call_s": first_call_s,
            "reference_path": "eager decode (tokens); the loaded model untouched (acoustic)",
            "compile_backend": args.compile_backend if feature == "compile" else None,
        }  # fmt: skip
        print(f"gpt {technique}: {measurements['outputs']} {measurements['tokens']} apply {apply_s:.1f} s, "
              f"{base_s * 1e3:.0f} ({base_what}) -> {opt_s * 1e3:.0f} ms", flush=True)  # fmt: skip
        path = write_evidence(
            args, "gpt-sovits-v3", feature, technique, args.gpt_dtype, self.checkpoint, measurements
        )
        progress("done", evidence=path.name)


def gpt_evidence(args) -> None:
    ref = GptReference(args)
    for technique in ("torch", "triton"):
        ref.evidence("kernels", technique, {"kernel_backend": technique})


def gpt_compile_evidence(args) -> None:
    """compile alone: a time limit may stop it inside the compiler, so each stage is written first."""
    path, started = args.out / "gpt_compile_progress.json", time.perf_counter()
    record = {"command": "python " + " ".join(sys.argv), "compile_backend": args.compile_backend,
              "what": f"gpt-sovits-v3 compile=required (torch.compile of the DiT blocks), {args.size} set",
              "stages": []}  # fmt: skip

    def progress(stage: str, **info) -> None:
        record["stages"].append({"stage": stage, "at_s": round(time.perf_counter() - started, 2), **info})
        path.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")

    progress("loading")
    ref = GptReference(args)
    progress("reference", load_s=ref.load_s, eager_sentence_ms=ref.native_s * 1e3)
    # auto runs compile beside auto's kernels (triton where validated): the timing is against those
    # kernels without compile, so compile is credited only with what it adds
    ref.evidence(
        "compile", "torch_compile", {"compile": "required"}, progress, baseline={"compile": "disabled"}
    )


def gpt_bench(args) -> None:
    from voicehub.bench.protocol import BenchSettings, Profile, run_benchmark
    from voicehub.bench.report import markdown_table, write_reports
    from voicehub.models.gpt_sovits import techniques
    from voicehub.optimization.mixin import detect_gpu_arch

    techniques.COMPILE_BACKEND = args.compile_backend
    folder = gpt_set(args)
    preset = "full" if args.device.startswith("cuda") else "off"
    eager = TTSOptimizationConfig.eager()
    profiles = [
        Profile("eager", eager, {"cuda_graph_preset": "off"}),
        Profile("cuda_graphs", eager, {"cuda_graph_preset": preset}),
        Profile("kernel_backend=triton", TTSOptimizationConfig(**{**eager.to_dict(), "kernel_backend": "triton"}),
                {"cuda_graph_preset": preset}),
        Profile("auto", TTSOptimizationConfig(), {"cuda_graph_preset": preset}),
    ]  # fmt: skip
    settings = BenchSettings(
        model_type="gpt-sovits-v3", text=GPT_TEXT, model=f"make-checkpoint --size {args.size} --seed 0", seed=SEED,
        device=args.device, dtype=args.gpt_dtype, gpu_arch=detect_gpu_arch(args.device), n_warmup=1,
        n_reps=args.reps, params=GPT_PARAMS, min_audio_s=args.min_audio_s,
    )  # fmt: skip
    out = args.out / "gpt_sovits_bench"
    record = run_benchmark(
        lambda **engine: gpt_model(args, folder, engine["cuda_graph_preset"])[0], settings, profiles
    )
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
