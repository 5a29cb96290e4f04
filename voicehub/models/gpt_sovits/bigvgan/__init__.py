"""BigVGAN v2 vocoder (24 kHz, 100 bands, 256x) loaded from its Hugging Face folder layout."""

from voicehub.models.gpt_sovits.bigvgan.activation import ANTI_ALIAS_SNAKE, anti_alias_snake_torch
from voicehub.models.gpt_sovits.bigvgan.checkpoint import (
    FOLDER_NAME,
    load_bigvgan,
    make_bigvgan_folder,
    prepare_bigvgan,
)
from voicehub.models.gpt_sovits.bigvgan.model import BigVGAN, BigVGANConfig, vocode

__all__ = [
    "ANTI_ALIAS_SNAKE",
    "FOLDER_NAME",
    "BigVGAN",
    "BigVGANConfig",
    "anti_alias_snake_torch",
    "load_bigvgan",
    "prepare_bigvgan",
    "make_bigvgan_folder",
    "vocode",
]
