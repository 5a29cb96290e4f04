"""Strict loading of GPT-SoVITS GPT (text-to-semantic) checkpoints.

Layout, as upstream's s1_train.py writes `GPT_weights_v3/<name>-e<N>.ckpt` and as `s1v3.ckpt` ships:
a torch zip holding {"weight": {"model.<name>": fp16 tensor}, "config": dict (s1longer-v2.yaml),
"info": str}. Only tensors and plain data, so it loads with `weights_only=True`.
"""

from __future__ import annotations

import pickle
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from voicehub.errors import CheckpointError, ModelNotFoundError
from voicehub.models.checkpoints import check_state_dict
from voicehub.models.gpt_sovits.t2s.config import V2_PHONEME_VOCAB, T2SConfig
from voicehub.models.gpt_sovits.t2s.model import T2SModel, checkpoint_state_dict
from voicehub.models.gpt_sovits.weights import meta_device
from voicehub.runtime.device import resolve_device, resolve_dtype

STATE_PREFIX = "model."
# upstream's process_ckpt.py overwrites the zip's leading b"PK" with a 2-byte SoVITS version tag
SOVITS_HEADERS = {
    b"00": "v1",
    b"01": "v2",
    b"02": "v3",
    b"03": "v3 LoRA",
    b"04": "v4 LoRA",
    b"05": "v2Pro",
    b"06": "v2ProPlus",
}
SOVITS_KEY_PREFIXES = ("enc_p.", "enc_q.", "dec.", "cfm.", "ref_enc.", "ssl_proj.", "quantizer.", "bridge.")


def _not_gpt_sovits(path: Path, why: str) -> CheckpointError:
    return CheckpointError(
        f"{path} is a GPT-SoVITS SoVITS weights file ({why}), not a GPT (text-to-semantic) checkpoint; "
        "pass it as sovits_path and give gpt_path a GPT .ckpt (e.g. s1v3.ckpt or GPT_weights_v3/<name>-e15.ckpt)"
    )


def _load_torch_file(path: Path) -> Any:
    if not path.is_file():
        raise ModelNotFoundError(f"GPT checkpoint {path} does not exist")
    with open(path, "rb") as f:
        head = f.read(4)
    if head[:2] in SOVITS_HEADERS and head[2:4] == b"\x03\x04":
        raise _not_gpt_sovits(path, f"version header {head[:2]!r} = {SOVITS_HEADERS[head[:2]]}")
    is_zip = zipfile.is_zipfile(path)
    if is_zip:
        try:
            unsafe = torch.serialization.get_unsafe_globals_in_checkpoint(path)
        except Exception as exc:  # a damaged zip: say so rather than guess
            raise CheckpointError(f"{path} is not a readable torch checkpoint ({exc})") from exc
        if any(name.endswith("HParams") for name in unsafe):
            raise _not_gpt_sovits(path, "its config is an HParams object")
        if unsafe:
            raise CheckpointError(
                f"{path} holds Python objects other than tensors and plain data ({', '.join(unsafe)}); "
                "a GPT-SoVITS GPT checkpoint holds only `weight`, `config` and `info`. If this is a Lightning "
                "training checkpoint from logs_s1/ckpt, use the exported GPT_weights_v3/<name>-e<N>.ckpt instead"
            )
    try:
        # mmap (zip files only): each tensor is read once, by its cast on the way to the device
        return torch.load(path, map_location="cpu", weights_only=True, mmap=is_zip)
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError, OSError) as exc:
        raise CheckpointError(
            f"{path} is not a readable torch checkpoint ({type(exc).__name__}: {exc})"
        ) from exc


def read_t2s_checkpoint(path: str | Path) -> tuple[dict[str, torch.Tensor], T2SConfig, dict[str, Any]]:
    """Open a GPT checkpoint: (weights under `model.` names, architecture, the file's raw config)."""
    path = Path(path)
    obj = _load_torch_file(path)
    if not isinstance(obj, dict):
        raise CheckpointError(
            f"{path}: expected a dict with `weight`, `config`, `info`, got {type(obj).__name__}"
        )
    if "state_dict" in obj and "weight" not in obj:
        raise CheckpointError(
            f"{path} is a Lightning training checkpoint; use the half-precision export that GPT-SoVITS writes "
            "to GPT_weights_v3/<name>-e<N>.ckpt"
        )
    weight = obj.get("weight")
    if not isinstance(weight, dict) or not all(isinstance(v, torch.Tensor) for v in weight.values()):
        raise CheckpointError(f"{path}: no `weight` dict of tensors; not a GPT-SoVITS GPT checkpoint")
    if weight and not any(k.startswith(STATE_PREFIX) for k in weight):
        if any(k.startswith(SOVITS_KEY_PREFIXES) for k in weight):
            raise _not_gpt_sovits(path, "its tensors are enc_p./dec./cfm. weights")
        raise CheckpointError(f"{path}: no tensor named `model.*`; not a GPT-SoVITS GPT checkpoint")
    raw = obj.get("config")
    return weight, T2SConfig.from_checkpoint_config(raw, source=str(path)), raw


def load_t2s(
    path: str | Path,
    device: str | torch.device = "cpu",
    dtype: str | torch.dtype | None = None,
    *,
    phoneme_vocab_size: int | None = V2_PHONEME_VOCAB,
) -> tuple[T2SModel, T2SConfig]:
    """Load a GPT checkpoint strictly into an eval-mode T2SModel on `device`.

    dtype defaults to float16 on CUDA (upstream's is_half) and float32 on the CPU. phoneme_vocab_size
    checks the symbol table the text frontend will index (732 for v2/v3; None skips the check).
    """
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, torch.float16 if dev.type == "cuda" else torch.float32)
    return prepare_t2s(path, phoneme_vocab_size=phoneme_vocab_size)(dev, dt)


def prepare_t2s(
    path: str | Path, *, phoneme_vocab_size: int | None = V2_PHONEME_VOCAB
) -> Callable[[torch.device, torch.dtype], tuple[T2SModel, T2SConfig]]:
    """`load_t2s` in two steps: the file read, checked and its model built on the meta device now (no
    device touched), then the returned function's call puts the weights on a device in a dtype."""
    weight, config, _ = read_t2s_checkpoint(path)
    if phoneme_vocab_size is not None and config.phoneme_vocab_size != phoneme_vocab_size:
        raise CheckpointError(
            f"{path}: GPT checkpoint has {config.phoneme_vocab_size} phoneme symbols, VoiceHub's v3 frontend "
            f"needs {phoneme_vocab_size} (512 means a GPT-SoVITS v1 model, which is not supported)"
        )
    with meta_device():  # no throw-away random init of 77 M parameters
        model = T2SModel(config)
    expected = {k: tuple(v.shape) for k, v in checkpoint_state_dict(model).items()}
    check_state_dict(expected, weight, path, model="the T2S architecture in its config")

    def finish(dev: torch.device, dt: torch.dtype) -> tuple[T2SModel, T2SConfig]:
        # copy: a memory-mapped file's pages are never shared with the model
        state = {k[len(STATE_PREFIX) :]: v.to(device=dev, dtype=dt, copy=True) for k, v in weight.items()}
        model.load_state_dict(state, strict=True, assign=True)
        model.reset_buffers(dev, dt)
        return model.eval().requires_grad_(False), config

    return finish
