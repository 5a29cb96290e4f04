"""`TTSInferencer`: the voice-conversation face, familiar to users of GPT-SoVITS runtimes.

    tts = TTSInferencer(device="cuda", gpt_path="s1v3.ckpt", sovits_path="my_voice.pth",
                        pretrained_dir="GPT_SoVITS/pretrained_models")
    for sample_rate, chunk, text in tts.infer_stream("Hello there.", "ref.wav", "What the reference says.",
                                                    text_language="en", prompt_language="en"):
        ...

Upstream labels (中文, 英文, 按标点符号切, cut5, ...) are accepted as aliases of the ASCII codes.
The tuples are built from the library's `AudioChunk`s; errors are raised, never yielded.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from voicehub.models.gpt_sovits.model import GptSovitsModel
from voicehub.models.gpt_sovits.params import DEFAULT_PRESET
from voicehub.models.gpt_sovits.presets import apply_preset, list_presets
from voicehub.models.gpt_sovits.reference import Voice

__all__ = ["TTSInferencer", "apply_preset", "list_presets"]


class TTSInferencer:
    """Loads one GPT-SoVITS v3 model; `infer_stream` speaks a text in a reference voice, chunk by chunk.

    pretrained_dir: upstream's GPT_SoVITS/pretrained_models (defaults to `pretrained_models/`
    beside the GPT checkpoint). cuda_graph_preset: full, minimal, lazy or off; the default ('auto') is
    minimal on CUDA and off elsewhere.
    dtype: float16 on CUDA, float32 on the CPU by default.
    """

    def __init__(
        self,
        device: str = "cpu",
        gpt_path: str | Path | None = None,
        sovits_path: str | Path | None = None,
        pretrained_dir: str | Path | None = None,
        cuda_graph_preset: str = "auto",
        dtype: Any = None,
        **load_options: Any,
    ):
        from voicehub.models.gpt_sovits import load

        if gpt_path is None or sovits_path is None:
            raise ValueError(
                "TTSInferencer needs gpt_path= (a GPT .ckpt) and sovits_path= (a SoVITS v3 .pth)"
            )
        self.model: GptSovitsModel = load(
            None,
            device=device,
            dtype=dtype,
            gpt_path=gpt_path,
            sovits_path=sovits_path,
            pretrained_dir=pretrained_dir or _default_pretrained(Path(gpt_path)),
            cuda_graph_preset=cuda_graph_preset,
            **load_options,
        )

    @property
    def sample_rate(self) -> int:
        return self.model.sample_rate

    @property
    def text_frontend_info(self) -> dict[str, str | None]:
        """Where Chinese polyphone readings come from: `polyphone_source` 'g2pw' (g2pw_model_dir= given) or 'pypinyin'."""
        return self.model.text_frontend_info

    def infer_stream(
        self,
        text: str,
        ref_audio_path: str | Path,
        prompt_text: str,
        text_language: str = "auto",
        prompt_language: str = "auto",
        preset: str | None = DEFAULT_PRESET,
        how_to_cut: str = "punctuation",
        top_k: int | None = None,
        top_p: float | None = None,
        temperature: float | None = None,
        repetition_penalty: float = 1.35,
        speed: float | None = None,
        sample_steps: int | None = None,
        seed: int | None = None,
        **params: Any,
    ) -> Iterator[tuple[int, np.ndarray, str]]:
        """Yield (sample_rate, float32 [n] chunk, the sentence it speaks): one per cut sentence, or
        one per window when `stream_chunk_tokens` is given (the first window that many semantic tokens,
        later ones longer: see `GptSovitsParams`).

        Sampler, speed and CFM-step values left at None come from `preset` (fast, balanced,
        quality; None: upstream's defaults). Other keyword parameters: force_n_tokens,
        max_new_tokens, pause_s, stream_chunk_tokens. Bad input raises before the first chunk.
        """
        voice = Voice(ref_audio_path, prompt_text, prompt_language)
        chunks = self.model.stream(
            text,
            voice=voice,
            seed=seed,
            preset=preset,
            text_language=text_language,
            how_to_cut=how_to_cut,
            top_k=top_k,
            top_p=top_p,
            temperature=temperature,
            repetition_penalty=repetition_penalty,
            speed=speed,
            sample_steps=sample_steps,
            **params,
        )
        return ((chunk.sample_rate, chunk.audio, chunk.text) for chunk in chunks)


def _default_pretrained(gpt_path: Path) -> Path | None:
    # A GPT-SoVITS checkout keeps GPT_weights_v3/ at its root and GPT_SoVITS/pretrained_models below it.
    for folder in (gpt_path.parent, gpt_path.parent.parent):
        for candidate in (folder / "pretrained_models", folder / "GPT_SoVITS" / "pretrained_models"):
            if candidate.is_dir():
                return candidate
    return None
