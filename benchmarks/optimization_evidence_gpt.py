"""The GPT-SoVITS v3 parts of optimization_evidence.py (gpt-evidence, gpt-compile-evidence, gpt-bench) on
full-size random weights; that script's docstring describes them."""

from __future__ import annotations

import json
import sys
import time
import traceback
from pathlib import Path

import torch
from e2e_measure import PROMPT_TEXT, write_reference
from optimization_evidence_record import MARGIN_EPSILON, SEED, median_s, rel_l2, sha256, write_evidence

from voicehub.optimization import TTSOptimizationConfig
from voicehub.optimization.evidence import MAX_REL_L2

GPT_TEXT = (
    "The old lighthouse keeper climbed the stairs at dusk. He watched the boats come home. "
    "Then he wrote the weather in his notebook."
)
GPT_TOKENS = 110  # per sentence: random weights never sample EOS; 3 x 110 tokens ~ 12 s at speed 1.1
GPT_PARAMS = {"preset": "balanced", "force_n_tokens": GPT_TOKENS, "how_to_cut": "punctuation"}


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
