"""A complete GPT-SoVITS v3 file set from random weights, in the official layouts: a testing and
benchmarking tool (`voicehub make-checkpoint gpt-sovits-v3`), not a model. It speaks no words.

    OUT/gpt.ckpt                                    GPT checkpoint ({"weight", "config", "info"})
    OUT/sovits.pth                                  full SoVITS v3 file (a "fine-tuned" voice)
    OUT/lora/sovits_lora.pth                        SoVITS v3 LoRA over pretrained_models/s2Gv3.pth
    OUT/pretrained_models/chinese-hubert-base/      HuBERT (config.json, pytorch_model.bin, ...)
    OUT/pretrained_models/chinese-roberta-wwm-ext-large/
    OUT/pretrained_models/models--nvidia--bigvgan_v2_24khz_100band_256x/
    OUT/pretrained_models/s2Gv3.pth                 the v3 SoVITS base

The LoRA file sits in its own folder so OUT itself holds exactly one `.ckpt` and one `.pth` and
loads as a model directory; load the LoRA set with `sovits_path=OUT/lora/sovits_lora.pth`.
`full` has the real sizes (several GB; make it on the machine that benchmarks it); `tiny` keeps
every interface width the parts exchange (HuBERT 768, BERT 1024, 1024 semantic codes, 732
phonemes, 100 mel bands) and shrinks the rest, for CPU tests in seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import torch

from voicehub.models.gpt_sovits.bert import BERT_FOLDER, make_bert_folder
from voicehub.models.gpt_sovits.bigvgan import FOLDER_NAME as BIGVGAN_FOLDER
from voicehub.models.gpt_sovits.bigvgan import make_bigvgan_folder
from voicehub.models.gpt_sovits.files import PRETRAINED_FOLDER
from voicehub.models.gpt_sovits.sizes import Size, parse_size
from voicehub.models.gpt_sovits.sovits import BASE_FILE, SoVITSV3Arch, make_sovits_checkpoint
from voicehub.models.gpt_sovits.ssl import HUBERT_FOLDER, hubert_config, make_hubert_folder
from voicehub.models.gpt_sovits.t2s import load_t2s, logit_margins, make_t2s_checkpoint
from voicehub.models.gpt_sovits.t2s.config import T2SConfig
from voicehub.models.gpt_sovits.t2s.make_checkpoint import random_prompt

GPT_FILE = "gpt.ckpt"
SOVITS_FILE = "sovits.pth"
LORA_FILE = "lora/sovits_lora.pth"
DEFAULT_LORA_RANK = 8
# The benchmark workload of issue 4: a prompt of 80 phonemes and 150 semantic tokens.
MARGIN_PHONES, MARGIN_PROMPT_TOKENS = 80, 150


@dataclass(frozen=True)
class CheckpointSet:
    """The paths `make_checkpoint_set` wrote, and the T2S logit-margin summary."""

    out: Path
    gpt: Path
    sovits: Path
    sovits_lora: Path
    pretrained: Path
    margins: dict[str, float]


def sovits_arch(size: str) -> SoVITSV3Arch:
    """`full`: the real v3 sizes; `tiny`: SoVITS's tiny widths with the real HuBERT width (768) and
    codebook (1024 codes), so the tiny HuBERT's features and the T2S decoder's tokens fit it."""
    if parse_size(size) is Size.FULL:
        return SoVITSV3Arch.full()
    return replace(SoVITSV3Arch.tiny(), ssl_dim=hubert_config("tiny")["hidden_size"], n_bins=1024)


def t2s_margins(gpt_path: Path, n_tokens: int, seed: int) -> dict[str, float]:
    """Greedy top-1 minus top-2 logit margins of the GPT file over n_tokens (EOS suppressed), on the CPU."""
    model, config = load_t2s(gpt_path, "cpu", torch.float32)
    assert isinstance(config, T2SConfig)
    phones, bert, prompt = random_prompt(config, MARGIN_PHONES, MARGIN_PROMPT_TOKENS, seed)
    return logit_margins(model, phones, bert, prompt, n_tokens)


def make_checkpoint_set(
    out: str | Path,
    size: str = "tiny",
    seed: int = 0,
    lora_rank: int = DEFAULT_LORA_RANK,
    margin_tokens: int = 200,
) -> CheckpointSet:
    """Write the whole set under `out` (see the module docstring); returns its paths and T2S margins."""
    size = parse_size(size)
    if lora_rank < 1:
        raise ValueError(f"--lora-rank must be >= 1, got {lora_rank}")
    out = Path(out)
    pretrained = out / PRETRAINED_FOLDER
    pretrained.mkdir(parents=True, exist_ok=True)
    arch = sovits_arch(size)
    gpt = make_t2s_checkpoint(out / GPT_FILE, size, seed)
    make_sovits_checkpoint(pretrained / BASE_FILE, seed=seed, arch=arch)
    sovits = make_sovits_checkpoint(out / SOVITS_FILE, seed=seed + 1, arch=arch)
    lora = out / LORA_FILE
    # The base's seed: a LoRA file's buffers (the codebook among them) are the base's, as upstream's
    # training freezes them; only the LoRA factors differ.
    make_sovits_checkpoint(lora, seed=seed, lora_rank=lora_rank, arch=arch)
    make_hubert_folder(pretrained / HUBERT_FOLDER, size, seed)
    make_bert_folder(pretrained / BERT_FOLDER, size, seed)
    make_bigvgan_folder(pretrained / BIGVGAN_FOLDER, size, seed)
    margins = t2s_margins(gpt, margin_tokens, seed) if margin_tokens > 0 else {}
    return CheckpointSet(out, gpt, sovits, lora, pretrained, margins)


def margins_report(margins: dict[str, float]) -> str:
    """The T2S margin summary as printed by the CLI."""
    if not margins:
        return "T2S logit margins: not computed"
    return (
        f"T2S greedy top-1/top-2 logit margins over {margins['n_tokens']} tokens (EOS suppressed): "
        f"min {margins['min']:.4f}, p10 {margins['p10']:.4f}, median {margins['median']:.4f}, "
        f"share < 0.01: {margins['share_below_0.01']:.3f}; distinct tokens: {margins['distinct_tokens']}"
    )
