"""Finding a GPT-SoVITS v3 model's files: the GPT checkpoint, the SoVITS weights, `pretrained_models/`.

A model directory holds one GPT `.ckpt`, one SoVITS `.pth` and a `pretrained_models/` folder (or
`GPT_SoVITS/pretrained_models/`, as in an upstream install); explicit `gpt_path=`, `sovits_path=`
and `pretrained_dir=` override what the directory gives. What a file *is* is decided by its
contents when it is loaded (the loaders raise CheckpointError naming the kind or version found);
here only presence is checked, and every missing piece says what to put where.
"""

from __future__ import annotations

import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from voicehub.errors import ModelNotFoundError
from voicehub.models.gpt_sovits.bert import BERT_FOLDER
from voicehub.models.gpt_sovits.bigvgan import FOLDER_NAME as BIGVGAN_FOLDER
from voicehub.models.gpt_sovits.sovits import BASE_FILE
from voicehub.models.gpt_sovits.ssl import HUBERT_FOLDER

PRETRAINED_FOLDER = "pretrained_models"
# Where pretrained_models sits inside a model directory: ours, and an upstream checkout's.
PRETRAINED_LOCATIONS = (PRETRAINED_FOLDER, f"GPT_SoVITS/{PRETRAINED_FOLDER}")
GPT_SUFFIX = ".ckpt"
SOVITS_SUFFIX = ".pth"
PRETRAINED_LAYOUT = (
    f"{HUBERT_FOLDER}/, {BERT_FOLDER}/, {BIGVGAN_FOLDER}/ (and {BASE_FILE} for LoRA SoVITS files)"
)


@dataclass(frozen=True)
class ModelFiles:
    """The files one GPT-SoVITS v3 model is loaded from (presence checked, contents not yet)."""

    gpt: Path
    sovits: Path
    pretrained: Path

    @property
    def hubert(self) -> Path:
        return self.pretrained / HUBERT_FOLDER

    @property
    def bert(self) -> Path:
        return self.pretrained / BERT_FOLDER

    @property
    def bigvgan(self) -> Path:
        return self.pretrained / BIGVGAN_FOLDER

    @property
    def sovits_base(self) -> Path:
        """The v3 base s2Gv3.pth a LoRA SoVITS file is merged into (may be absent for full files)."""
        return self.pretrained / BASE_FILE

    def to_options(self) -> dict[str, str]:
        """The load options that name these files (what a voice registry entry stores)."""
        return {
            "gpt_path": str(self.gpt),
            "sovits_path": str(self.sovits),
            "pretrained_dir": str(self.pretrained),
        }


def _is_pretrained_dir(folder: Path) -> bool:
    return (folder / HUBERT_FOLDER).is_dir() or (folder / BIGVGAN_FOLDER).is_dir()


def _pretrained_in(folder: Path) -> Path | None:
    if _is_pretrained_dir(folder):
        return folder  # the directory is itself a pretrained_models folder
    for name in PRETRAINED_LOCATIONS:
        if (folder / name).is_dir():
            return folder / name
    return None


def _single(folder: Path, suffix: str, what: str, option: str) -> Path:
    found = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix == suffix)
    if len(found) == 1:
        return found[0]
    listed = ", ".join(p.name for p in found) or "none"
    raise ModelNotFoundError(
        f"folder {str(folder)!r} should hold exactly one {what} ({suffix}); found: {listed}. "
        f"Pass {option}= to name the file."
    )


def _existing(path: str | Path, what: str) -> Path:
    path = Path(path).expanduser()
    if not path.is_file():
        raise ModelNotFoundError(f"{what} {str(path)!r} does not exist; check the path")
    return path


def check_pretrained_dir(folder: Path) -> Path:
    """The folder, after checking it holds the HuBERT, BERT and BigVGAN folders by their upstream names."""
    fix = (
        f"copy GPT_SoVITS/{PRETRAINED_FOLDER} from a GPT-SoVITS install there (it needs {PRETRAINED_LAYOUT}), "
        "or pass pretrained_dir="
    )
    if not folder.is_dir():
        raise ModelNotFoundError(f"pretrained_models folder {str(folder)!r} does not exist: {fix}")
    for name in (HUBERT_FOLDER, BERT_FOLDER, BIGVGAN_FOLDER):
        if not (folder / name).is_dir():
            raise ModelNotFoundError(f"{str(folder)!r} has no {name}/ folder: {fix}")
    return folder


def find_model_files(
    path: str | Path | None = None,
    *,
    gpt_path: str | Path | None = None,
    sovits_path: str | Path | None = None,
    pretrained_dir: str | Path | None = None,
) -> ModelFiles:
    """The files a model directory and/or explicit paths name; ModelNotFoundError says what is missing.

    path: a model directory, or a GPT `.ckpt` file (then sovits_path and pretrained_dir are needed,
    unless they sit beside it as in a model directory).
    """
    folder = None
    if path is not None:
        path = Path(path).expanduser()
        if path.is_file():
            gpt_path = gpt_path or path
            folder = path.parent
        elif path.is_dir():
            folder = path
        else:
            raise ModelNotFoundError(
                f"no file or folder {str(path)!r}; pass a GPT-SoVITS v3 model directory "
                "or gpt_path=, sovits_path= and pretrained_dir="
            )
    if gpt_path is None:
        if folder is None:
            raise ModelNotFoundError("no GPT checkpoint given: pass a model directory or gpt_path=")
        gpt_path = _single(folder, GPT_SUFFIX, "GPT (text-to-semantic) checkpoint", "gpt_path")
    if sovits_path is None:
        if folder is None:
            raise ModelNotFoundError("no SoVITS weights given: pass a model directory or sovits_path=")
        sovits_path = _single(folder, SOVITS_SUFFIX, "SoVITS v3 weights file", "sovits_path")
    if pretrained_dir is None:
        pretrained_dir = _pretrained_in(folder) if folder is not None else None
        if pretrained_dir is None:
            where = f"in {str(folder)!r} " if folder is not None else ""
            raise ModelNotFoundError(
                f"no {PRETRAINED_FOLDER} folder {where}(it holds {PRETRAINED_LAYOUT}): put GPT_SoVITS/"
                f"{PRETRAINED_FOLDER} from a GPT-SoVITS install in the model directory, or pass pretrained_dir="
            )
    return ModelFiles(
        gpt=_existing(gpt_path, "GPT checkpoint"),
        sovits=_existing(sovits_path, "SoVITS weights file"),
        pretrained=check_pretrained_dir(Path(pretrained_dir).expanduser()),
    )


def _probe_torch_file(path: Path) -> Any:
    # Unpickles only the structure (weights_only, tensors memory-mapped), so probing a large file is cheap.
    if not zipfile.is_zipfile(path):
        return None
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # any unreadable or foreign file: simply not ours
        return None


def is_t2s_checkpoint(path: str | Path) -> bool:
    """Whether a file's contents are a GPT-SoVITS GPT checkpoint (`weight` of `model.*` tensors + `config.model`)."""
    path = Path(path)
    if not path.is_file():
        return False
    obj = _probe_torch_file(path)
    if not isinstance(obj, dict) or not isinstance(obj.get("weight"), dict):
        return False
    config = obj.get("config")
    has_model_keys = any(str(k).startswith("model.") for k in obj["weight"])
    return has_model_keys and isinstance(config, dict) and isinstance(config.get("model"), dict)


def detect(path: Path) -> bool:
    """Whether `path` is a GPT-SoVITS v3 model, by content: a GPT checkpoint file, or a directory with
    a pretrained_models folder and a `.ckpt` whose contents are a GPT checkpoint.

    A directory that is ours but ambiguous (several `.ckpt` or `.pth`) is still claimed, so loading
    it says what to pass instead of "no family recognises it".
    """
    path = Path(path)
    if path.is_file():
        return is_t2s_checkpoint(path)
    if not path.is_dir() or _pretrained_in(path) is None:
        return False
    return any(is_t2s_checkpoint(p) for p in path.iterdir() if p.suffix == GPT_SUFFIX)
