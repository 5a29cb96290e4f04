"""Random-weight SoVITS v3 files in upstream's layouts, for tests and benchmarks.

`full` has the real sizes (a ~770 MB fp16 file like s2Gv3.pth); `tiny` has the same tensor
names with small widths. Written exactly as upstream writes them: {"weight", "config", "info"}
with fp16 tensors; a LoRA file also has "lora_rank" and the "03" version header of `my_save2`.
"""

from __future__ import annotations

import io
from pathlib import Path

import torch

from voicehub.models.gpt_sovits.sizes import Size, parse_size
from voicehub.models.gpt_sovits.sovits.checkpoint import LORA_PREFIX, lora_layers
from voicehub.models.gpt_sovits.sovits.config import SoVITSV3Arch
from voicehub.models.gpt_sovits.sovits.model import SynthesizerV3
from voicehub.models.gpt_sovits.sovits.strict import file_layout, weight_norm_layers

# Frozen during upstream's LoRA training (freeze_quantizer, peft): their parameters are not saved.
LORA_FROZEN_PREFIXES = ("enc_p.", "ssl_proj.", "quantizer.", "cfm.")


def arch_for(size: str | Size) -> SoVITSV3Arch:
    return SoVITSV3Arch.full() if parse_size(size) is Size.FULL else SoVITSV3Arch.tiny()


def lora_file_layout(model: SynthesizerV3, rank: int) -> dict[str, tuple[int, ...]]:
    """Names and shapes a v3 LoRA file holds: trainable tensors, all buffers, LoRA factors."""
    buffers = {name for name, _ in model.named_buffers()}
    layout = {}
    for name, shape in file_layout(model).items():
        if name in buffers or not name.startswith(LORA_FROZEN_PREFIXES):
            layout[_lora_name(name)] = shape
    own = model.state_dict()
    for layer in lora_layers(own):
        out_f, in_f = own[f"{layer}.weight"].shape
        layout[_lora_name(f"{layer}.lora_A.default.weight")] = (rank, in_f)
        layout[_lora_name(f"{layer}.lora_B.default.weight")] = (out_f, rank)
    return layout


def _lora_name(name: str) -> str:
    return LORA_PREFIX + name[len("cfm.") :] if name.startswith("cfm.") else name


@torch.no_grad()
def _random_model(arch: SoVITSV3Arch, seed: int) -> SynthesizerV3:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = SynthesizerV3(arch)
        for codebook in (layer._codebook for layer in model.quantizer.vq.layers):
            codebook.embed_avg.copy_(codebook.embed)
            codebook.cluster_size.fill_(1.0)
        # Nonzero GRN and adaLN shifts so every path of the DiT carries signal.
        for name, p in model.cfm.named_parameters():
            if name.endswith(("grn.gamma", "grn.beta")):
                p.normal_(0, 0.1)
    return model.eval()


def _file_tensors(model: SynthesizerV3) -> dict[str, torch.Tensor]:
    # fp16, with weight-normed layers split into g = ||v|| per slice and v = the weight.
    state = {}
    wn = weight_norm_layers(model)
    for name, tensor in model.state_dict().items():
        owner, _, leaf = name.rpartition(".")
        if leaf == "weight" and owner in wn:
            state[f"{owner}.weight_g"] = (
                tensor.flatten(1).norm(dim=1).view(-1, *[1] * (tensor.dim() - 1)).half()
            )
            state[f"{owner}.weight_v"] = tensor.half()
        else:
            state[name] = tensor.half()
    return state


def _save(obj: dict, path: Path, header: bytes | None) -> None:
    buf = io.BytesIO()
    torch.save(obj, buf)
    data = buf.getvalue()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(header + data[2:] if header else data)


def make_sovits_checkpoint(
    path: str | Path,
    size: str = "tiny",
    seed: int = 0,
    lora_rank: int | None = None,
    version_header: bool = False,
    arch: SoVITSV3Arch | None = None,
) -> Path:
    """Write a random-weight SoVITS v3 file; with `lora_rank`, a LoRA file for a base of the same size.

    A full file doubles as the base `s2Gv3.pth` of pretrained_models. `version_header` writes a
    non-LoRA file with the "02" (v3) header instead of the zip's "PK"; LoRA files always carry "03".
    `arch`, when given, replaces the architecture `size` names (the GPT-SoVITS set maker needs a
    tiny SoVITS whose input width and codebook fit the tiny HuBERT and T2S).
    """
    arch = arch_for(size) if arch is None else arch
    model = _random_model(arch, seed)
    tensors = _file_tensors(model)
    info = "0epoch_0iteration"
    path = Path(path)
    if lora_rank is None:
        _save(
            {"weight": tensors, "config": arch.to_hps(), "info": info},
            path,
            b"02" if version_header else None,
        )
        return path
    if lora_rank < 1:
        raise ValueError(f"lora_rank must be >= 1, got {lora_rank}")
    layout = lora_file_layout(model, lora_rank)
    gen = torch.Generator().manual_seed(seed + 1)
    weight = {}
    for name, shape in layout.items():
        plain = "cfm." + name[len(LORA_PREFIX) :] if name.startswith(LORA_PREFIX) else name
        if ".lora_" in name:
            # Small random factors: B is nonzero (unlike peft's init) so merging changes the model.
            weight[name] = (torch.randn(shape, generator=gen) * 0.1).half()
        else:
            weight[name] = tensors[plain]
    hps = arch.to_hps()
    hps["train"]["lora_rank"] = lora_rank
    _save({"weight": weight, "config": hps, "info": info, "lora_rank": lora_rank}, path, b"03")
    return path
