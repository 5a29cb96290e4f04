"""Load-time warm-up of GPT-SoVITS v3: first-use costs are paid when the model loads, not in a request.

What a first request would otherwise pay, and where it moves:
- the text frontend of each language (English loads its pronunciation dictionary, tokenizer, word
  segmenter and GRU in ~5 s; Chinese its jieba dictionary in ~1.5 s): built and run on a short text
  with numbers for the languages of the default voice's transcript, and English (every language mode
  reads Latin letters as English, and requests default to `auto`), while the weights load;
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
from typing import Any

from voicehub.errors import MissingDependencyError
from voicehub.models.gpt_sovits.acoustic_graphs import COMMON_CHUNK_TOKENS
from voicehub.models.gpt_sovits.params import GptSovitsParams
from voicehub.models.gpt_sovits.pipeline import Pipeline
from voicehub.models.gpt_sovits.reference import Voice
from voicehub.text.frontend import TextFrontend
from voicehub.text.langseg import split_by_language
from voicehub.text.options import Language

log = logging.getLogger("voicehub.models.gpt_sovits")

# g2p language -> (a short text with a number, whose reader also loads lazily; the mode that reads it)
WARM_TEXTS = {
    "en": ("At 12:30 the 3 apples cost $4.50.", Language.EN),
    "zh": ("今天是2024年1月1日，天气很好。", Language.ALL_ZH),
    "ja": ("今日は1月1日です。", Language.ALL_JA),
    "ko": ("오늘은 1월 1일입니다.", Language.ALL_KO),
    "yue": ("今日係1月1號。", Language.ALL_YUE),
}
WARM_CHUNK_TOKENS = COMMON_CHUNK_TOKENS[0]  # the streamed warm-up's windows: the shapes requests use
WARM_TOKENS = 2 * WARM_CHUNK_TOKENS  # semantic tokens of the GPU warm-up sentence: a first and a next window


def voice_languages(voice: Voice | None) -> tuple[list[str], list[str]]:
    """(g2p languages the voice's transcript needs, others worth building: English unless needed)."""
    needed = (
        set()
        if voice is None
        else {s.lang for s in split_by_language(voice.prompt_text, voice.prompt_language)}
    )
    return sorted(needed), sorted({"en"} - needed)


def warm_text(frontend: TextFrontend, needed: list[str], optional: list[str]) -> dict[str, Any]:
    """Build and run the frontend of each language (it needs no weights: the model runs this while its
    weights load). A needed language whose packages are missing raises (the voice cannot speak
    without it); an optional one is logged. Returns {"g2p": languages built, "text_s": seconds}."""
    t0 = time.perf_counter()
    built = []
    for language in [*needed, *optional]:
        text, mode = WARM_TEXTS[language]
        try:
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


def warm_chain(pipe: Pipeline, voice: Voice) -> None:
    """The voice's transcript as one sentence through the per-sentence path and the streamed path."""
    ref = pipe.reference(voice)
    sentence = pipe.text_features(ref.prompt_text, voice.prompt_language)
    if sentence is None:
        return  # a transcript with nothing speakable is refused by pipe.reference already
    params = GptSovitsParams.build(
        "fast", force_n_tokens=WARM_TOKENS, stream_chunk_tokens=WARM_CHUNK_TOKENS, seed=0
    )
    pipe.synthesize_sentence(ref, sentence, params, seed=0)
    for _ in pipe.stream_sentence(ref, sentence, params, seed=0):
        pass


def warm_voice(pipe: Pipeline, voice: Voice | None) -> dict[str, Any]:
    """The voice's reference into the cache, on CUDA the acoustic graphs the preset captures at load and
    the chain; returns what was done and the seconds."""
    t0 = time.perf_counter()
    report: dict[str, Any] = {
        "reference": voice is not None,
        "chain": voice is not None and pipe.device.type == "cuda",
    }
    ref = pipe.reference(voice) if voice is not None else None
    if pipe.acoustic_graphs is not None:
        t1 = time.perf_counter()
        prompt_frames = ref.acoustic.fea.shape[2] if ref is not None else None
        captured = pipe.acoustic_graphs.capture_at_load(prompt_frames, encoder=pipe.sovits)
        report["acoustic_graphs"] = {**captured, "seconds": time.perf_counter() - t1}
    if report["chain"]:
        warm_chain(pipe, voice)
    return {**report, "voice_s": time.perf_counter() - t0}
