"""`GptSovitsModel`: GPT-SoVITS v3 behind VoiceHub's `TTSModel` interface (the hub face)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from voicehub.models.base import TTSModel
from voicehub.models.gpt_sovits.acoustic_graphs import build_acoustic_graphs
from voicehub.models.gpt_sovits.bert import BertFeatureExtractor
from voicehub.models.gpt_sovits.bigvgan import prepare_bigvgan
from voicehub.models.gpt_sovits.files import ModelFiles
from voicehub.models.gpt_sovits.optimization import gpt_sovits_transforms
from voicehub.models.gpt_sovits.params import GptSovitsParams
from voicehub.models.gpt_sovits.pipeline import SAMPLE_RATE, Pipeline
from voicehub.models.gpt_sovits.reference import ReferenceCache, Voice
from voicehub.models.gpt_sovits.sovits import prepare_sovits_v3
from voicehub.models.gpt_sovits.ssl import HubertEncoder
from voicehub.models.gpt_sovits.t2s import StaticDecodeConfig, T2SConfig, T2SModel, prepare_t2s
from voicehub.models.gpt_sovits.t2s.runner import T2SGraphDecoder
from voicehub.models.gpt_sovits.warmup import (
    LoadTimeline,
    voice_languages,
    warm_cuda,
    warm_text,
    warm_text_deferred,
    warm_triton,
    warm_voice,
)
from voicehub.optimization.apply import OptimizationResult
from voicehub.optimization.config import Feature, KernelBackend, OptimizationContext, TTSOptimizationConfig
from voicehub.optimization.mixin import PENDING_ATTR
from voicehub.runtime.cuda_graphs import GraphPreset
from voicehub.text.frontend import TextFrontend
from voicehub.text.limits import check_text
from voicehub.types import AudioChunk
from voicehub.voices import VoiceNotFoundError

MODEL_TYPE = "gpt-sovits-v3"
log = logging.getLogger("voicehub.models.gpt_sovits")


def build_frontend(files: ModelFiles, g2pw_model_dir: str | Path | None = None) -> TextFrontend:
    """The text frontend: G2PW for Chinese polyphones when its folder is given (checked now), else pypinyin."""
    return TextFrontend(g2pw_model_dir=g2pw_model_dir, bert_dir=files.bert if g2pw_model_dir else None)


def uses_graph_decoder(device: torch.device, preset: GraphPreset) -> bool:
    """Whether T2S decodes through CUDA graphs: on a CUDA device with a capturing preset."""
    return device.type == "cuda" and GraphPreset(preset) is not GraphPreset.OFF


def build_t2s_decoder(
    t2s: T2SModel, config: T2SConfig, device: torch.device, preset: GraphPreset, *, capture: bool = True
) -> T2SGraphDecoder | None:
    """The model's one graph decoder, or None for the eager reference.

    capture: capture now what the preset captures at load (full/minimal); False builds it without graphs,
    and `capture_t2s_graphs` captures them once its step kernels are chosen.
    """
    if not uses_graph_decoder(device, preset):
        return None
    engine = StaticDecodeConfig.for_checkpoint(config)
    log.info(
        "GPT-SoVITS v3 T2S: CUDA-graph decoder, preset %s, %d KV slots, buckets %s",
        GraphPreset(preset).value, engine.max_seq_len, engine.buckets,
    )  # fmt: skip
    return T2SGraphDecoder(t2s, engine, (GraphPreset(preset) if capture else GraphPreset.LAZY).value)


def capture_t2s_graphs(decoder: T2SGraphDecoder, preset: GraphPreset) -> None:
    """Give a decoder built with capture=False its preset, capturing what that preset captures at load."""
    # The decoder captures in its constructor and again whenever its step kernels change; built 'lazy'
    # (nothing captured) and set to its preset here, a kernel choice made at load costs one capture.
    decoder.preset = decoder.graphs.preset = GraphPreset(preset)
    decoder._capture_at_load()


def build_pipeline(
    files: ModelFiles,
    device: torch.device,
    dtype: torch.dtype,
    frontend: TextFrontend | None = None,
    cache: ReferenceCache | None = None,
    cuda_graph_preset: GraphPreset = GraphPreset.OFF,
    capture_graphs: bool = True,
    timeline: LoadTimeline | None = None,
) -> Pipeline:
    """Read every file through its strict loader and assemble the pipeline on `device` in `dtype`.

    frontend: the text frontend to use (default: `build_frontend(files)`, pypinyin polyphones).
    cuda_graph_preset: full/minimal/lazy decode T2S through graphs on CUDA; off keeps the eager path.
    capture_graphs: False leaves the graph decoder uncaptured (see `build_t2s_decoder`).
    timeline: where each file's load is timed (`weights.*` phases).
    """
    phase = (timeline if timeline is not None else LoadTimeline()).phase
    # Every file is read and its model built on the meta device before any tensor goes to the device: on
    # CUDA the first copy waits for the context (~0.4 s, made on the runtime thread from the load's start),
    # and this work, which needs no device, fills that wait instead of following it.
    with phase("weights.read"):
        put_t2s = prepare_t2s(files.gpt)
        # s2Gv3.pth is read only when the SoVITS file is a LoRA; a full file needs no base.
        put_sovits = prepare_sovits_v3(files.sovits, base_path=files.sovits_base)
        put_vocoder = prepare_bigvgan(files.bigvgan)
        put_hubert = HubertEncoder.prepare(files.hubert)
        put_bert = BertFeatureExtractor.prepare(files.bert)
    with phase("weights.t2s"):
        t2s, t2s_config = put_t2s(device, dtype)
    with phase("weights.sovits"):
        sovits = put_sovits(device, dtype)
    with phase("weights.bigvgan"):
        vocoder = put_vocoder(device, dtype)
    with phase("weights.hubert"):
        hubert = put_hubert(device, dtype)
    with phase("weights.bert"):
        bert = put_bert(device, dtype)
    frontend = frontend if frontend is not None else build_frontend(files)
    model_id = f"{files.gpt.resolve()}|{files.sovits.resolve()}|{files.pretrained.resolve()}|{dtype}"
    with phase("t2s_decoder_build"):
        decoder = build_t2s_decoder(t2s, t2s_config, device, cuda_graph_preset, capture=capture_graphs)
    # The streamed CFM pieces and vocoder windows replay graphs on CUDA too; the warm-up captures them.
    acoustic = build_acoustic_graphs(sovits.cfm.estimator, vocoder, cuda_graph_preset, device)
    return Pipeline(
        frontend, hubert, bert, t2s, sovits.eval(), vocoder.eval(), device, dtype, cache, model_id, decoder,
        acoustic,
    )  # fmt: skip


def _sync_if_initialized(device: torch.device) -> None:
    """Wait for `device`'s queue once CUDA is initialised (before: nothing queued; its own device, since a
    bare synchronize() waits for the current device, cuda:0, and makes a context there)."""
    if torch.cuda.is_initialized():
        torch.cuda.synchronize(device)


class GptSovitsModel(TTSModel):
    """A GPT-SoVITS v3 voice model: `generate(text, voice=Voice(...), seed=..., **params)` and `stream`.

    params are `GptSovitsParams` fields (text_language, how_to_cut, top_k, top_p, temperature,
    repetition_penalty, speed, sample_steps, force_n_tokens, max_new_tokens, pause_s, prompt_language,
    stream_chunk_tokens) plus `preset` (fast, balanced, quality; None for upstream's defaults). A voice is a `Voice`, or a
    name in the `voice_registry` given at load; `default_voice` (given at load) serves requests that name none.
    """

    model_type = MODEL_TYPE
    sample_rate = SAMPLE_RATE

    def __init__(
        self,
        files: ModelFiles,
        device: torch.device,
        dtype: torch.dtype,
        *,
        cuda_graph_preset: GraphPreset = GraphPreset.OFF,
        lazy_load: bool = False,
        g2pw_model_dir: str | Path | None = None,
        voice_registry: Any = None,
        reference_cache: ReferenceCache | None = None,
        default_voice: Any = None,
    ):
        self.files = files
        self.device = device
        self.dtype = dtype
        # Engine configuration: on CUDA, anything but 'off' decodes T2S through one T2SGraphDecoder
        # built with the weights; the optimization manifest records it in its context.
        self.cuda_graph_preset = GraphPreset(cuda_graph_preset)
        self.voice_registry = voice_registry
        # Used when a request names no voice (e.g. a server's warm-up); a Voice, a registry name or a
        # mapping of Voice's fields. Resolved per request, so a registry edit is seen.
        self.default_voice = Voice(**default_voice) if isinstance(default_voice, dict) else default_voice
        self.reference_cache = reference_cache if reference_cache is not None else ReferenceCache()
        # Built now even when lazy: it only checks the G2PW folder, so a bad one fails at load and the
        # model can say where polyphone readings come from before any weights are read.
        self.frontend = build_frontend(files, g2pw_model_dir)
        self._g2pw_model_dir = Path(g2pw_model_dir) if g2pw_model_dir is not None else None
        log.info(
            "GPT-SoVITS v3 text frontend: Chinese polyphones from %s%s",
            self.frontend.polyphone_source,
            f" ({self._g2pw_model_dir})" if self._g2pw_model_dir else " (no g2pw_model_dir given)",
        )
        self._pipeline: Pipeline | None = None
        self._load_lock = threading.Lock()
        self.warm_up_info: dict[str, Any] = {}  # what loading warmed up (warmup.py), and after optimize()
        if not lazy_load:
            self._load()

    # -- loading ---------------------------------------------------------------------------------

    @property
    def text_frontend_info(self) -> dict[str, str | None]:
        """How text is read: `polyphone_source` ('g2pw' or 'pypinyin') and `g2pw_model_dir` (or None)."""
        folder = str(self._g2pw_model_dir) if self._g2pw_model_dir is not None else None
        return {"polyphone_source": self.frontend.polyphone_source, "g2pw_model_dir": folder}

    def describe(self) -> dict[str, Any]:
        """JSON-ready facts about the loaded model (the server's `GET /v1/models` shows them)."""
        return {
            "model_type": self.model_type,
            "sample_rate": self.sample_rate,
            "device": str(self.device),
            "dtype": str(self.dtype).removeprefix("torch."),
            "cuda_graph_preset": self.cuda_graph_preset.value,
            "t2s_decode": self.t2s_decode_info,
            "acoustic_graphs": (
                self._pipeline.acoustic_graphs.info()
                if self._pipeline is not None and self._pipeline.acoustic_graphs is not None
                else None
            ),
            "text_frontend": self.text_frontend_info,
            "warm_up": self.warm_up_info,
        }

    def optimization_targets(self) -> list:
        """The reversible transforms of `optimize()` (see gpt_sovits/optimization.py)."""
        return gpt_sovits_transforms(self)

    @property
    def t2s_decode_info(self) -> dict[str, Any]:
        """How T2S decodes: `path` ('cuda_graphs' or 'eager'), and why, or the graph engine's sizes."""
        if not uses_graph_decoder(self.device, self.cuda_graph_preset):
            why = (
                "cuda_graph_preset is 'off'"
                if self.device.type == "cuda"
                else f"no CUDA graphs on {self.device.type}"
            )
            return {"path": "eager", "reason": why}
        info: dict[str, Any] = {"path": "cuda_graphs", "preset": self.cuda_graph_preset.value}
        decoder = self._pipeline.t2s_decoder if self._pipeline is not None else None
        if decoder is not None:
            info["max_seq_len"] = decoder.engine.max_seq_len
            info["kv_buckets"] = list(decoder.engine.buckets)
            info["captured"] = len(decoder.graphs.captured_buckets)
        return info

    @property
    def is_runtime_loaded(self) -> bool:
        return self._pipeline is not None

    @property
    def pipeline(self) -> Pipeline:
        """The assembled pipeline, reading the weights now if the model was loaded lazily."""
        if self._pipeline is None:
            with self._load_lock:
                if self._pipeline is None:
                    self._load()
        assert self._pipeline is not None
        return self._pipeline

    def load_runtime(self) -> None:
        """Read the weights now if the model was loaded lazily (a load-time optimization applies then)."""
        self.pipeline  # noqa: B018

    def _load(self) -> None:
        # Each first-use cost is paid once, here (warmup.py): the text frontend is built on a thread while
        # the weights load (mostly Python against mostly I/O and copies), and the same thread then reads
        # what only some text needs while the main thread goes on; a load-time optimization config is
        # applied before the T2S graphs are captured and before anything runs, so its kernels are the
        # ones captured and warmed up; then the default voice warms up. `warm_up_info["load"]` keeps the
        # timeline: each phase's seconds (main thread; the text and runtime threads' `text_thread.*` and
        # `runtime_thread.*`, which overlap it).
        cuda = self.device.type == "cuda"
        # A main-thread phase syncs the GPU only once the runtime thread has made the context (waiting
        # for it there would bill the context to whichever phase ended first).
        timeline = LoadTimeline(sync=(lambda: _sync_if_initialized(self.device)) if cuda else None)
        voice = self._load_time_voice()
        # One runtime thread: the CUDA context, then (a load that runs Triton kernels) Triton's
        # once-per-process set-up, beside the weight reads. The main thread waits for the Triton job
        # before its first kernel; errors of either surface by then.
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="voicehub-runtime-warm-up") as runtime:
            runtime_jobs = [runtime.submit(warm_cuda, self.device, timeline)] if cuda else []
            if cuda and self._load_runs_triton():
                runtime_jobs.append(runtime.submit(warm_triton, timeline))
            self._load_with_text_thread(timeline, voice, runtime_jobs)

    def _load_runs_triton(self) -> bool:
        """Whether the load-time optimization config (if any) selects the Triton kernel backend."""
        pending = getattr(self, PENDING_ATTR, None)
        if pending is None:
            return False
        config, context = pending
        plan = config.resolve(self.model_type, mode="inference", context=context)
        return plan.decision(Feature.KERNELS).selected == KernelBackend.TRITON.value

    def _load_with_text_thread(
        self, timeline: LoadTimeline, voice: Voice | None, runtime_jobs: list[Future]
    ) -> None:
        pending = getattr(self, PENDING_ATTR, None)  # a load-time config, applied by _load_pipeline
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="voicehub-text-warm-up") as pool:
            text = pool.submit(warm_text, self.frontend, *voice_languages(voice), timeline)
            # One worker: this runs after warm_text, so text.result() is there without waiting.
            deferred = pool.submit(lambda: warm_text_deferred(self.frontend, text.result()["g2p"], timeline))
            try:
                warmed = self._load_pipeline(timeline, text, runtime_jobs)
                warmed.update(warm_voice(self._pipeline, voice, timeline))
                with timeline.phase("wait_text_deferred"):
                    warmed.update(deferred.result())
            except BaseException:
                # Dropped if it has not started; once running (it starts ~0.3 s into the load, so
                # usually), leaving the pool waits for it (~3 s) before the error propagates.
                deferred.cancel()
                self._drop_failed_pipeline(pending)
                raise
        self.warm_up_info = {"load": {**warmed, **timeline.info()}}

    def _drop_failed_pipeline(self, pending: Any) -> None:
        """A load that fails after its pipeline was set (warm-up, a runtime-thread job) leaves nothing
        half-done: the optimization it applied is undone and pending again, and the next use loads anew."""
        if self._pipeline is None:
            return
        try:
            if self.optimization_result is not None:
                self.restore_tts_optimization()
        finally:
            self._pipeline = None
            setattr(self, PENDING_ATTR, pending)

    def _load_pipeline(
        self, timeline: LoadTimeline, text: Future, runtime_jobs: list[Future]
    ) -> dict[str, Any]:
        """Weights, the frontend from the text thread, the runtime thread's jobs, a load-time optimization,
        the T2S graphs; returns warm_text's report."""
        pipe = build_pipeline(
            self.files,
            self.device,
            self.dtype,
            self.frontend,
            self.reference_cache,
            self.cuda_graph_preset,
            capture_graphs=False,
            timeline=timeline,
        )
        with timeline.phase("wait_text"):
            warmed = text.result()
        if runtime_jobs:
            with timeline.phase("wait_runtime_thread"):
                for job in runtime_jobs:
                    job.result()
        self._pipeline = pipe  # the transforms reach the weights through self.pipeline
        try:
            with timeline.phase("optimization_apply"):
                self.apply_pending_optimization()  # rolled back and still pending if it raises
        except BaseException:
            self._pipeline = None  # a failed load-time config fails the load; the next use tries again
            raise
        if pipe.t2s_decoder is not None:
            with timeline.phase("t2s_graph_capture"):
                capture_t2s_graphs(pipe.t2s_decoder, self.cuda_graph_preset)
        return warmed

    def _load_time_voice(self) -> Voice | None:
        """The default voice if it resolves now; a registry name not there yet is left to requests."""
        if self.default_voice is None:
            return None
        try:
            return self.resolve_voice(self.default_voice)
        except (VoiceNotFoundError, ValueError) as exc:
            log.warning("default voice %r not warmed up at load: %s", self.default_voice, exc)
            return None

    def _warm_up_kernels(self) -> None:
        # After an optimization: its kernels (Triton) build on first use; the frontend is warm already.
        if self._pipeline is not None:
            self.warm_up_info["optimize"] = warm_voice(self._pipeline, self._load_time_voice())

    def optimize(
        self, config: TTSOptimizationConfig, *, context: OptimizationContext | None = None
    ) -> OptimizationResult:
        """Apply `config` (see `OptimizableModelMixin.optimize`), then warm its kernels up on the
        default voice (CUDA), so they are not built in the next request; a kernel that fails there
        undoes the optimization and raises (a request would have failed the same way)."""
        result = super().optimize(config, context=context)
        try:
            self._warm_up_kernels()
        except Exception:
            self.restore_tts_optimization()
            raise
        return result

    # -- requests --------------------------------------------------------------------------------

    def resolve_voice(self, voice: Any) -> Voice:
        """A `Voice`, or the registry voice of that name; anything else raises naming the fix."""
        if voice is None and self.default_voice is not None:
            voice = self.default_voice
        if isinstance(voice, Voice):
            return voice
        if voice is None:
            raise ValueError(
                "GPT-SoVITS v3 clones a reference voice: pass voice=Voice(ref_audio_path, prompt_text, "
                "prompt_language) or the name of a registry voice"
            )
        if not isinstance(voice, str):
            raise TypeError(f"voice must be a Voice or a registry voice name, got {type(voice).__name__}")
        if self.voice_registry is None:
            raise ValueError(
                f"voice {voice!r} is a name, but this model has no voice registry: pass "
                "voice=Voice(ref_audio_path, prompt_text, prompt_language), or load with voice_registry="
            )
        entry = self.voice_registry.get(voice)  # VoiceNotFoundError lists the known names
        if entry.family != MODEL_TYPE or entry.reference_audio is None:
            raise ValueError(f"registry voice {voice!r} is a {entry.family} voice, not a GPT-SoVITS one")
        return Voice(entry.reference_audio, entry.transcript, entry.language)

    def request_params(self, seed: int | None, params: dict[str, Any]) -> GptSovitsParams:
        """Validated request parameters (TypeError for unknown names, ValueError for bad values)."""
        params = dict(params)
        preset = params.pop("preset", "balanced")
        if seed is not None:
            params["seed"] = seed
        return GptSovitsParams.build(preset, **params)

    def stream(
        self, text: str, *, voice: Voice | str | None = None, seed: int | None = None, **params: Any
    ) -> Iterator[AudioChunk]:
        """One chunk per cut sentence, each made through the whole chain before the next is decoded;
        with `stream_chunk_tokens=N`, several chunks per sentence, the first from its first N tokens.

        Text, parameters and the voice's reference are checked before this returns, so bad input
        raises here, not at the first chunk.
        """
        text = check_text(text)
        request = self.request_params(seed, params)
        return self.pipeline.stream(text, self.resolve_voice(voice), request)
