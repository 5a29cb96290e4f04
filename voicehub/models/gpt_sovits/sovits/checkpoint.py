"""Reading SoVITS `.pth` files: version header, kind and version checks, strict load, LoRA merge.

File facts (upstream process_ckpt.py): a SoVITS file is a torch zip of {"weight", "config",
"info"} with fp16 weights; LoRA and v2Pro files are written by `my_save2`, which overwrites the
zip's first two bytes ("PK") with a version code. The pretrained bases are recognised by the md5
of their first 8192 bytes. A v3 LoRA file holds the trainable tensors of LoRA training: the LoRA
factors of the DiT attention (under `cfm.base_model.model.`), the non-frozen SoVITS layers and
all buffers; the rest comes from the base `s2Gv3.pth`, and W += B @ A * alpha / rank with
alpha = rank (upstream's LoraConfig), merged here without peft.
"""

from __future__ import annotations

import hashlib
import io
import pickle
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch

from voicehub.errors import CheckpointError
from voicehub.models.checkpoints import check_state_dict, fold_weight_norm
from voicehub.models.gpt_sovits.cfm.dit import sinusoid_table
from voicehub.models.gpt_sovits.sovits.config import SoVITSV3Arch
from voicehub.models.gpt_sovits.sovits.model import SynthesizerV3
from voicehub.models.gpt_sovits.sovits.strict import SLOT_HINT, file_layout, load_weight_normed
from voicehub.models.gpt_sovits.weights import meta_device, rebuild_missing

HEADER_VERSIONS = {  # first two bytes -> (model version, is LoRA)
    b"00": ("v1", False),
    b"01": ("v2", False),
    b"02": ("v3", False),
    b"03": ("v3", True),
    b"04": ("v4", True),
    b"05": ("v2Pro", False),
    b"06": ("v2ProPlus", False),
}
PRETRAINED_MD5 = {  # md5 of the first 8192 bytes of upstream's pretrained SoVITS files
    "dc3c97e17592963677a4a1681f30c653": "v2",  # s2G488k.pth (v1 weights, v2 loader)
    "43797be674a37c1c83ee81081941ed0f": "v3",  # s2Gv3.pth
    "6642b37f3dbb1f76882b69937c95a5f3": "v2",  # s2G2333K.pth
    "4f26b9476d0c5033e04162c486074374": "v4",  # s2Gv4.pth
    "c7e9fce2223f3db685cdfa1e6368728a": "v2Pro",  # s2Gv2Pro.pth
    "66b313e39455b57ab1b0bc0b239c9d0a": "v2ProPlus",  # s2Gv2ProPlus.pth
}
BASE_FILE = "s2Gv3.pth"  # the v3 base in GPT_SoVITS/pretrained_models, needed by LoRA files
LORA_PREFIX = "cfm.base_model.model."  # peft's wrapping of `cfm` during LoRA training
LORA_TARGETS = ("to_q", "to_k", "to_v", "to_out.0")
_LORA_KEY = re.compile(r"(.+)\.lora_([AB])\.default\.weight")


class HParams:
    """Stand-in for upstream's `utils.HParams`, which trained files pickle as their config."""


_CONFIG_CLASSES = [(HParams, "utils.HParams"), (HParams, "GPT_SoVITS.utils.HParams")]
MD5_PREFIX_BYTES = 8192  # what PRETRAINED_MD5 hashes
# The buffers SynthesizerV3 computes rather than reads (see weights.rebuild_missing).
COMPUTED_BUFFERS = {("TextEmbedding", "freqs_cis"): lambda b: sinusoid_table(b.shape[1], b.shape[0])}


@dataclass
class SoVITSFile:
    path: Path
    version: str  # "v1", "v2", "v3", "v4", "v2Pro", "v2ProPlus"
    is_lora: bool
    weight: dict[str, torch.Tensor]
    config: dict[str, Any]
    lora_rank: int | None


def _plain(obj: Any) -> Any:
    if isinstance(obj, HParams):
        obj = vars(obj)
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    return obj


def _torch_load(data: bytes | None, path: Path) -> Any:
    # weights_only: a config pickled as utils.HParams is rebuilt as our stand-in, nothing else runs.
    # data None: a plain zip, memory-mapped (its tensors are read once, by the cast to the model's dtype).
    source = io.BytesIO(data) if data is not None else path
    try:
        with torch.serialization.safe_globals(_CONFIG_CLASSES):
            return torch.load(source, map_location="cpu", weights_only=True, mmap=data is None)
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError) as exc:
        raise CheckpointError(f"cannot read {path} as a GPT-SoVITS checkpoint: {exc}") from exc


def read_sovits_file(path: str | Path) -> SoVITSFile:
    """Load a SoVITS .pth (plain or version-headed) and tell its version; nothing is built."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"SoVITS checkpoint {path} does not exist")
    with open(path, "rb") as f:
        prefix = f.read(MD5_PREFIX_BYTES)
    version, is_lora = PRETRAINED_MD5.get(hashlib.md5(prefix).hexdigest()), False
    head, data = prefix[:2], None
    if head != b"PK":
        if head not in HEADER_VERSIONS:
            raise CheckpointError(f"{path} is neither a PyTorch zip file nor a GPT-SoVITS versioned .pth")
        version, is_lora = HEADER_VERSIONS[head]
        data = b"PK" + path.read_bytes()[2:]  # torch reads a zip only from its real magic
    ckpt = _torch_load(data, path)
    if not isinstance(ckpt, dict) or not isinstance(ckpt.get("weight"), dict):
        raise CheckpointError(f"{path} has no 'weight' dict; it is not a GPT-SoVITS SoVITS checkpoint")
    weight, config = ckpt["weight"], _plain(ckpt.get("config") or {})
    if any(k.startswith("model.") for k in weight):
        raise CheckpointError(
            f"{path} is a GPT (text-to-semantic) checkpoint, not a SoVITS one; pass it as gpt_path"
        )
    is_lora = is_lora or "lora_rank" in ckpt
    version = version or _version_from_tensors(weight, config)
    rank = int(ckpt["lora_rank"]) if "lora_rank" in ckpt else None
    return SoVITSFile(path, version, is_lora, weight, config, rank)


def _version_from_tensors(weight: dict[str, torch.Tensor], config: dict[str, Any]) -> str:
    declared = str((config.get("model") or {}).get("version", ""))
    if any(k.startswith("cfm.") for k in weight):
        return "v4" if declared == "v4" else "v3"  # v3 and v4 share every tensor shape
    if "sv_emb.weight" in weight:
        return "v2ProPlus" if declared == "v2ProPlus" else "v2Pro"
    emb = weight.get("enc_p.text_embedding.weight")
    return "v1" if emb is not None and emb.shape[0] == 322 else "v2"


def _require_v3(f: SoVITSFile) -> None:
    if f.version != "v3":
        raise CheckpointError(
            f"{f.path} is a GPT-SoVITS {f.version} SoVITS checkpoint; VoiceHub loads v3 only for now. "
            "Use a v3 SoVITS file (or a v3 LoRA trained on s2Gv3.pth)."
        )


def build_sovits(
    f: SoVITSFile, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
) -> SynthesizerV3:
    """Build the model a full (non-LoRA) v3 file describes and load it strictly on `device` in `dtype`."""
    return _build_sovits_on(f, _meta_sovits(f), torch.device(device), dtype)


def _meta_sovits(f: SoVITSFile) -> SynthesizerV3:
    # the model a full v3 file describes, built on the meta device (no throw-away random init)
    _require_v3(f)
    if f.is_lora:
        raise CheckpointError(f"{f.path} is a LoRA checkpoint; load it with its base s2Gv3.pth")
    shapes = {k: tuple(t.shape) for k, t in f.weight.items()}
    arch = SoVITSV3Arch.from_checkpoint(f.config, shapes, str(f.path))
    with meta_device():
        return SynthesizerV3(arch)


def _build_sovits_on(
    f: SoVITSFile, model: SynthesizerV3, device: torch.device, dtype: torch.dtype
) -> SynthesizerV3:
    load_weight_normed(model, f.weight, str(f.path), device=device, dtype=dtype)
    rebuild_missing(model, COMPUTED_BUFFERS, device, dtype)
    return model.eval()


def load_sovits_v3(
    path: str | Path,
    base_path: str | Path | None = None,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
) -> SynthesizerV3:
    """A ready SoVITS v3 model (eval) on `device` in `dtype`, from a full file, or a LoRA file plus its base.

    base_path: the pretrained `s2Gv3.pth` (GPT_SoVITS/pretrained_models/s2Gv3.pth), needed
    only when `path` is a LoRA checkpoint. Each tensor is cast once, on its way to `device`; a LoRA
    is merged in float32 on the CPU first (as `module.to` after a float32 load would give).
    """
    return prepare_sovits_v3(path, base_path)(torch.device(device), dtype)


def prepare_sovits_v3(
    path: str | Path, base_path: str | Path | None = None
) -> Callable[[torch.device, torch.dtype], SynthesizerV3]:
    """`load_sovits_v3` in two steps: the file read (a LoRA merged into its base on the CPU) and the model
    built on the meta device now, no device touched; the returned function's call puts it on a device."""
    f = read_sovits_file(path)
    _require_v3(f)
    if not f.is_lora:
        return partial(_build_sovits_on, f, _meta_sovits(f))
    if base_path is None or not Path(base_path).is_file():
        raise CheckpointError(
            f"{f.path} is a SoVITS v3 LoRA; its base s2Gv3.pth is needed but was not found at {base_path}. "
            "Put s2Gv3.pth in GPT_SoVITS/pretrained_models (pretrained_dir)."
        )
    base = read_sovits_file(base_path)
    model = build_sovits(base)
    apply_lora_file(model, f)
    return lambda device, dtype: model.to(device=device, dtype=dtype)


def apply_lora_file(model: SynthesizerV3, f: SoVITSFile) -> None:
    """Overlay a LoRA file's tensors on a loaded base model and merge its LoRA factors."""
    source = str(f.path)
    if not f.lora_rank or f.lora_rank < 1:
        raise CheckpointError(f"{source} is a LoRA checkpoint without a positive 'lora_rank'")
    plain: dict[str, torch.Tensor] = {}
    factors: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in f.weight.items():
        name = "cfm." + key[len(LORA_PREFIX) :] if key.startswith(LORA_PREFIX) else key
        m = _LORA_KEY.fullmatch(name)
        if m:
            factors.setdefault(m.group(1), {})[m.group(2)] = tensor
        else:
            plain[name] = tensor
    layout = file_layout(model)
    # A LoRA file overlays part of its base: every tensor it has must fit, none is required.
    check_state_dict(layout, plain, source, optional=layout, hint=SLOT_HINT)
    own = model.state_dict()
    _check_factors(factors, own, f.lora_rank, source)
    with torch.no_grad():
        for name, value in fold_weight_norm(plain).items():
            own[name].copy_(value.to(own[name].dtype))
        for layer, ab in factors.items():
            # alpha == rank in upstream's LoraConfig, so the LoRA scale alpha / rank is 1.
            delta = ab["B"].float() @ ab["A"].float()
            own[f"{layer}.weight"].add_(delta.to(own[f"{layer}.weight"].dtype))


def _check_factors(factors, own, rank: int, source: str) -> None:
    expected: dict[str, tuple[int, ...]] = {}
    for layer in lora_layers(own):
        out_f, in_f = own[f"{layer}.weight"].shape
        expected[f"{layer}.lora_A"] = (rank, in_f)
        expected[f"{layer}.lora_B"] = (out_f, rank)
    found = {f"{layer}.lora_{ab}": t for layer, pair in factors.items() for ab, t in pair.items()}
    check_state_dict(expected, found, f"{source} (LoRA rank {rank})", hint=SLOT_HINT)


def lora_layers(state: dict[str, torch.Tensor]) -> list[str]:
    """Names of the DiT attention projections LoRA adapts (upstream's target_modules)."""
    pattern = re.compile(
        r"(cfm\.estimator\.transformer_blocks\.\d+\.attn\.(?:to_q|to_k|to_v|to_out\.0))\.weight"
    )
    return [m.group(1) for k in state if (m := pattern.fullmatch(k))]
