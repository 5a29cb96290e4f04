"""GPT-SoVITS v3 family: the user's own GPT (.ckpt) and SoVITS (.pth) files with upstream's
`pretrained_models` folder (chinese-hubert-base, chinese-roberta-wwm-ext-large, BigVGAN v2 24 kHz,
s2Gv3.pth for LoRA SoVITS files), run by our own eager reference pipeline.

Importing this package loads no weights; `load` does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from voicehub.models.base import ModelFamily
from voicehub.models.gpt_sovits.files import ModelFiles, detect, find_model_files
from voicehub.models.gpt_sovits.model import MODEL_TYPE, GptSovitsModel
from voicehub.models.gpt_sovits.params import GptSovitsParams
from voicehub.models.gpt_sovits.reference import Voice
from voicehub.runtime.graph_presets import GraphPreset, resolve_graph_preset

__all__ = ["FAMILY", "GptSovitsModel", "GptSovitsParams", "ModelFiles", "Voice", "load"]

LOAD_OPTIONS = (
    "gpt_path",
    "sovits_path",
    "pretrained_dir",
    "cuda_graph_preset",
    "g2pw_model_dir",
    "voice_registry",
    "reference_cache",
    "default_voice",
)


def load(
    path: str | Path | None = None,
    device: str = "cpu",
    dtype: Any = None,
    lazy_load: bool = False,
    **kwargs: Any,
) -> GptSovitsModel:
    """Load a GPT-SoVITS v3 model from a model directory and/or explicit file paths.

    path: a directory with one GPT `.ckpt`, one SoVITS `.pth` and `pretrained_models/` (or a GPT
    `.ckpt` file); kwargs: gpt_path, sovits_path, pretrained_dir (override the directory's),
    cuda_graph_preset (full/minimal/lazy capture CUDA graphs, off decodes eagerly; the default, 'auto',
    is 'minimal' on CUDA and 'off' elsewhere), g2pw_model_dir
    (upstream's GPT_SoVITS/text/G2PWModel for Chinese polyphones; pypinyin without it),
    voice_registry (a VoiceRegistry, so `voice="name"` works), reference_cache (a ReferenceCache to share),
    default_voice (a Voice, registry name, or {ref_audio_path, prompt_text, prompt_language}: the voice
    of requests that name none).
    dtype: float16 on CUDA and float32 on the CPU by default. lazy_load: find and check the files
    now, read the weights on first use.
    """
    import torch

    from voicehub.runtime.device import resolve_device, resolve_dtype

    unknown = sorted(set(kwargs) - set(LOAD_OPTIONS))
    if unknown:
        raise TypeError(
            f"unknown GPT-SoVITS load option(s) {', '.join(unknown)}; valid: {', '.join(LOAD_OPTIONS)}"
        )
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, torch.float16 if dev.type == "cuda" else torch.float32)
    preset = resolve_graph_preset(kwargs.get("cuda_graph_preset"), dev.type)
    if preset is not GraphPreset.OFF and dev.type != "cuda":
        raise ValueError(f"cuda_graph_preset={preset.value!r} needs a CUDA device; use 'off' on {dev}")
    files = find_model_files(
        path,
        gpt_path=kwargs.get("gpt_path"),
        sovits_path=kwargs.get("sovits_path"),
        pretrained_dir=kwargs.get("pretrained_dir"),
    )
    return GptSovitsModel(
        files,
        dev,
        dt,
        cuda_graph_preset=preset,
        lazy_load=lazy_load,
        g2pw_model_dir=kwargs.get("g2pw_model_dir"),
        voice_registry=kwargs.get("voice_registry"),
        reference_cache=kwargs.get("reference_cache"),
        default_voice=kwargs.get("default_voice"),
    )


FAMILY = ModelFamily(
    model_type=MODEL_TYPE,
    summary=(
        "GPT-SoVITS v3 (GPT .ckpt + SoVITS .pth, LoRA too, + pretrained_models): voice cloning from "
        "3-10 s of reference audio, 24 kHz"
    ),
    load=load,
    detect=detect,
)
