"""Finding a Piper voice's files: weights (`.onnx` or Lightning `.ckpt`) and the voice JSON."""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from voicehub.errors import ModelNotFoundError


class WeightFormat(StrEnum):
    ONNX = "onnx"
    CKPT = "ckpt"


@dataclass(frozen=True)
class VoiceFiles:
    weights: Path
    config: Path
    format: WeightFormat


def is_voice_json(path: Path) -> bool:
    """A JSON object with Piper's keys (`phoneme_id_map`, `audio.sample_rate`)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return isinstance(data, dict) and "phoneme_id_map" in data and "sample_rate" in (data.get("audio") or {})


def _config_for(weights: Path) -> Path | None:
    """The JSON beside a weights file: `<file>.json`, `<stem>.onnx.json`, `<stem>.json` or `config.json`."""
    names = [weights.name + ".json", weights.stem + ".onnx.json", weights.stem + ".json", "config.json"]
    for name in names:
        candidate = weights.with_name(name)
        if candidate.is_file():
            return candidate
    return None


def find_voice_files(path: Path, config: Path | None = None) -> VoiceFiles:
    """The weights and JSON a path names: a weights file, or a folder holding exactly one voice.

    Raises ModelNotFoundError saying what is missing. The JSON's contents are checked on load.
    """
    path = Path(path).expanduser()
    if path.is_dir():
        candidates = sorted(p for p in path.iterdir() if p.suffix in (".onnx", ".ckpt") and p.is_file())
        paired = [p for p in candidates if _config_for(p) is not None or config is not None]
        if len(paired) != 1:
            found = ", ".join(p.name for p in candidates) or "none"
            raise ModelNotFoundError(
                f"folder {str(path)!r} should hold exactly one Piper voice (.onnx or .ckpt with its .json); "
                f"found: {found}. Pass the weights file itself."
            )
        path = paired[0]
    if not path.is_file():
        raise ModelNotFoundError(f"no file {str(path)!r}; pass the path to a Piper .onnx or .ckpt voice")
    fmt = WeightFormat.CKPT if path.suffix == ".ckpt" else WeightFormat.ONNX
    json_path = Path(config) if config is not None else _config_for(path)
    if json_path is None or not json_path.is_file():
        raise ModelNotFoundError(
            f"no voice JSON beside {str(path)!r} (looked for {path.name}.json and config.json); "
            "put the voice's .onnx.json next to it, or pass config_path="
        )
    return VoiceFiles(path, json_path, fmt)


def detect(path: Path) -> bool:
    """Whether `path` is a Piper voice: weights with a Piper JSON beside them (checked by content).

    The weights themselves are checked when loaded, so a damaged file gets a CheckpointError
    that names it rather than "no family recognises it".
    """
    try:
        files = find_voice_files(path)
    except ModelNotFoundError:
        return False
    return is_voice_json(files.config)
