"""Load-time warm-up of GPT-SoVITS v3: first-use costs are paid when the model loads, not in a request.

What a first request would otherwise pay, and where it moves:
- the text frontend of each language (English reads its pronunciation dictionary and GRU in ~0.3 s from
  the on-disk table cache; Chinese its jieba dictionary in ~1.5 s): built and run on a short text for the
  languages of the default voice's transcript, and English (every language mode reads Latin letters as
  English, and requests default to `auto`), on a thread while the weights load; the same thread then
  reads what only some text needs (English: wordsegment's tables ~0.5 s), while the
  main thread applies optimizations, captures graphs and warms the voice; the load waits for it at the
  end, so a first request pays neither;
- the default voice's reference features (HuBERT, the quantizer, SoVITS's reference encoder): computed
  into the reference cache (Chinese transcripts run BERT there);
- on CUDA with a capturing graph preset: the streamed path's SoVITS encoder, CFM and vocoder graphs that
  the preset captures at load (acoustic_graphs.py; for the default voice's prompt length when there is one);
- on CUDA, with a default voice: one short sentence through both request paths (whole sentence, and
  streamed through the decoder's `decode_iter` in windows of the common stream_chunk_tokens), so kernel
  loading, cuBLAS/cuDNN set-up, the T2S prefill, the CFM and the vocoder have run once. Under the `lazy`
  graph preset this captures the graphs that sentence uses (a sentence's first and next window). Run
  again after `optimize()`, whose kernels (Triton) build on first use (and which drops the acoustic
  graphs when it changes what the CFM or vocoder runs: they are captured again here).
Without a default voice only the frontend is warmed: a voice's reference is computed by its first request.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from itertools import islice
from typing import Any

import torch

from voicehub.errors import MissingDependencyError
from voicehub.models.gpt_sovits.acoustic_graphs import COMMON_CHUNK_TOKENS
from voicehub.models.gpt_sovits.params import GptSovitsParams
from voicehub.models.gpt_sovits.pipeline import Pipeline
from voicehub.models.gpt_sovits.reference import Voice
from voicehub.models.gpt_sovits.streaming import window_ends
from voicehub.text.frontend import TextFrontend
from voicehub.text.langseg import split_by_language
from voicehub.text.options import Language

log = logging.getLogger("voicehub.models.gpt_sovits")

# g2p language -> (a short text, the mode that reads it); English's has no digit and no unknown word: its
# number reader and word segmenter are read by `warm_text_deferred`, after the other languages.
WARM_TEXTS = {
    "en": ("The three apples cost four dollars.", Language.EN),
    "zh": ("今天是2024年1月1日，天气很好。", Language.ALL_ZH),
    "ja": ("今日は1月1日です。", Language.ALL_JA),
    "ko": ("오늘은 1월 1일입니다.", Language.ALL_KO),
    "yue": ("今日係1月1號。", Language.ALL_YUE),
}
WARM_CHUNK_TOKENS = COMMON_CHUNK_TOKENS[0]  # the streamed warm-up's windows: the shapes requests use
# semantic tokens of the streamed warm-up: a first and a next window (25 + 50)
WARM_TOKENS = list(islice(window_ends(WARM_CHUNK_TOKENS), 2))[-1]
# ... and of the per-sentence warm-up: its mel (185 frames at the fast preset's speed) replays the 192-frame
# masked vocoder graph of the streamed second window, and its CFM chunk (after a 5 s prompt) that window's
# bucket (704 frames), so under `minimal` the chain captures nothing that load did not
WARM_SENTENCE_TOKENS = 64


class LoadTimeline:
    """Wall-clock phases of one model load, JSON-ready through `info()`.

    sync: called before a phase's end is stamped (CUDA: synchronize), so queued GPU work is billed to the
    phase that queued it. Phases of the text thread pass sync=False and overlap the main thread's.
    """

    def __init__(self, sync: Callable[[], None] | None = None):
        self._sync = sync
        self._t0 = time.perf_counter()
        self._spans: dict[str, tuple[float, float]] = {}  # name -> (start, end), seconds since the load began
        self._notes: dict[str, str] = {}  # name -> what a phase skipped, and why

    @contextmanager
    def phase(self, name: str, sync: bool = True) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            if sync and self._sync is not None:
                self._sync()
            self._spans[name] = (start - self._t0, time.perf_counter() - self._t0)

    def note(self, name: str, text: str) -> None:
        """Record what a phase left undone and why (`info()["notes"]`)."""
        self._notes[name] = text

    def info(self) -> dict[str, Any]:
        """{"timeline_s": name -> seconds, "timeline_start_s": name -> seconds after the load began,
        "total_s": the load so far}, in the order the phases began, and "notes" when a phase left one."""
        spans = sorted(self._spans.items(), key=lambda item: item[1][0])
        info: dict[str, Any] = {
            "timeline_s": {name: round(end - start, 4) for name, (start, end) in spans},
            "timeline_start_s": {name: round(start, 4) for name, (start, _) in spans},
            "total_s": round(time.perf_counter() - self._t0, 4),
        }
        if self._notes:
            info["notes"] = dict(self._notes)
        return info


def voice_languages(voice: Voice | None) -> tuple[list[str], list[str]]:
    """(g2p languages the voice's transcript needs, others worth building: English unless needed)."""
    needed = (
        set()
        if voice is None
        else {s.lang for s in split_by_language(voice.prompt_text, voice.prompt_language)}
    )
    return sorted(needed), sorted({"en"} - needed)


def warm_text(
    frontend: TextFrontend, needed: list[str], optional: list[str], timeline: LoadTimeline | None = None
) -> dict[str, Any]:
    """Build and run the frontend of each language (it needs no weights: the model runs this while its
    weights load). A needed language whose packages are missing raises (the voice cannot speak
    without it); an optional one is logged. Returns {"g2p": languages built, "text_s": seconds}."""
    t0 = time.perf_counter()
    timeline = timeline if timeline is not None else LoadTimeline()
    built = []
    for language in [*needed, *optional]:
        text, mode = WARM_TEXTS[language]
        try:
            with timeline.phase(f"text_thread.{language}", sync=False):
                frontend.segments(text, mode)
        except MissingDependencyError as exc:
            if language in needed:
                raise
            log.info(
                "text frontend for %r not built at load (%s): such text would raise the same", language, exc
            )
            continue
        built.append(language)
    return {"g2p": built, "text_s": time.perf_counter() - t0}


def warm_text_deferred(
    frontend: TextFrontend, languages: list[str], timeline: LoadTimeline | None = None
) -> dict[str, Any]:
    """Read what only some text needs, for the built `languages` whose g2p reads parts on first use
    (a `load_deferred()` method: English's number reader and word segmenter). Returns
    {"text_deferred_s": seconds}."""
    t0 = time.perf_counter()
    timeline = timeline if timeline is not None else LoadTimeline()
    for language in languages:
        load = getattr(frontend.g2p(language), "load_deferred", None)  # optional in the G2P protocol
        if load is not None:
            with timeline.phase(f"text_thread.{language}_deferred", sync=False):
                load()
    return {"text_deferred_s": time.perf_counter() - t0}


def warm_cuda(device: torch.device, timeline: LoadTimeline) -> None:
    """The process's first CUDA work: driver and context, the caching allocator, cuBLAS (a small fp16
    matmul), cuDNN's libraries (a small fp16 convolution; its handle and plans are per thread and shape,
    the libraries it opens are the process's). Run on a thread at the start of a CUDA load: it waits mostly
    outside the GIL, beside the main thread's imports and file reads, instead of inside the first weight
    copy or the voice's first convolution."""
    with timeline.phase("runtime_thread.cuda_init", sync=False):
        torch.cuda.init()
        x = torch.ones(64, 64, device=device, dtype=torch.float16)
        torch.mm(x, x)
        torch.nn.functional.conv1d(x[None], x[:, :, None])
        torch.cuda.synchronize(device)


def warm_triton(timeline: LoadTimeline) -> None:
    """Triton's once-per-process costs, on the runtime thread while the weights load (a load that will run
    Triton kernels): its import, the key of its on-disk kernel cache (a hash of its compiler's sources and
    of its ~400 MB libtriton, ~0.45 s, outside the GIL), the CUDA backend's key (a `ptxas --version`
    process) and driver utilities (an `ldconfig -p` process, a small compiled module). Each is cached for
    the process, so the main thread's first kernel launch finds them done instead of paying them inside the
    first graph capture. Triton's internals move between versions: one this version lacks is skipped and
    named in the timeline (`runtime_thread.triton_skipped`), as the first launch then pays it as before."""
    with timeline.phase("runtime_thread.triton", sync=False):
        try:
            from triton.compiler.compiler import make_backend
            from triton.runtime.cache import triton_key
            from triton.runtime.driver import driver
        except ImportError as exc:
            timeline.note("runtime_thread.triton_skipped", f"{type(exc).__name__}: {exc}")
            return
        triton_key()
        active = driver.active
        make_backend(active.get_current_target()).hash()
        active.utils  # noqa: B018 (loads the compiled driver module)


def warm_chain(pipe: Pipeline, voice: Voice, timeline: LoadTimeline) -> None:
    """The voice's transcript as one sentence through the per-sentence path and the streamed path
    (phases `voice.chain_sentence`, `voice.chain_stream`)."""
    ref = pipe.reference(voice)
    sentence = pipe.text_features(ref.prompt_text, voice.prompt_language)
    if sentence is None:
        return  # a transcript with nothing speakable is refused by pipe.reference already
    with timeline.phase("voice.chain_sentence"):
        params = GptSovitsParams.build("fast", force_n_tokens=WARM_SENTENCE_TOKENS, seed=0)
        pipe.synthesize_sentence(ref, sentence, params, seed=0)
    with timeline.phase("voice.chain_stream"):
        params = GptSovitsParams.build(
            "fast", force_n_tokens=WARM_TOKENS, stream_chunk_tokens=WARM_CHUNK_TOKENS, seed=0
        )
        for _ in pipe.stream_sentence(ref, sentence, params, seed=0):
            pass


def warm_voice(pipe: Pipeline, voice: Voice | None, timeline: LoadTimeline | None = None) -> dict[str, Any]:
    """The voice's reference into the cache, on CUDA the acoustic graphs the preset captures at load and
    the chain; returns what was done and the seconds (each part also a `voice.*` phase of `timeline`)."""
    t0 = time.perf_counter()
    timeline = timeline if timeline is not None else LoadTimeline()
    report: dict[str, Any] = {
        "reference": voice is not None,
        "chain": voice is not None and pipe.device.type == "cuda",
    }
    ref = None
    if voice is not None:
        with timeline.phase("voice.reference"):
            ref = pipe.reference(voice)
    if pipe.acoustic_graphs is not None:
        t1 = time.perf_counter()
        prompt_frames = ref.acoustic.fea.shape[2] if ref is not None else None
        with timeline.phase("voice.acoustic_graph_capture"):
            captured = pipe.acoustic_graphs.capture_at_load(prompt_frames, encoder=pipe.sovits)
        report["acoustic_graphs"] = {**captured, "seconds": time.perf_counter() - t1}
    if report["chain"]:
        warm_chain(pipe, voice, timeline)
    return {**report, "voice_s": time.perf_counter() - t0}
