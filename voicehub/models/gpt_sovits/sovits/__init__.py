"""SoVITS v3 (`SynthesizerTrnV3`): checkpoint loading and the eager acoustic reference path."""

from voicehub.models.gpt_sovits.sovits.checkpoint import (
    BASE_FILE,
    load_sovits_v3,
    prepare_sovits_v3,
    read_sovits_file,
)
from voicehub.models.gpt_sovits.sovits.config import SoVITSV3Arch
from voicehub.models.gpt_sovits.sovits.make import make_sovits_checkpoint
from voicehub.models.gpt_sovits.sovits.model import SynthesizerV3
from voicehub.models.gpt_sovits.sovits.synth import (
    SAMPLES_PER_TOKEN,
    ReferencePrompt,
    decode_mel,
    denorm_spec,
    encode_reference,
    norm_spec,
)

__all__ = [
    "BASE_FILE",
    "SAMPLES_PER_TOKEN",
    "ReferencePrompt",
    "SoVITSV3Arch",
    "SynthesizerV3",
    "decode_mel",
    "denorm_spec",
    "encode_reference",
    "load_sovits_v3",
    "prepare_sovits_v3",
    "make_sovits_checkpoint",
    "norm_spec",
    "read_sovits_file",
]
