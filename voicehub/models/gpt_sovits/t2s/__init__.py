"""GPT-SoVITS text-to-semantic (T2S) decoder: model, checkpoint loader, eager and static-KV decoding."""

from voicehub.models.gpt_sovits.t2s.checkpoint import load_t2s, prepare_t2s, read_t2s_checkpoint
from voicehub.models.gpt_sovits.t2s.config import T2SConfig
from voicehub.models.gpt_sovits.t2s.decode import DecodeResult, StopReason, T2SSamplingParams, decode
from voicehub.models.gpt_sovits.t2s.make_checkpoint import logit_margins, make_t2s_checkpoint
from voicehub.models.gpt_sovits.t2s.model import T2SModel
from voicehub.models.gpt_sovits.t2s.static import (
    StaticDecodeConfig,
    T2SRequest,
    decode_step,
)
from voicehub.models.gpt_sovits.t2s.static_decoder import T2SStaticDecoder

__all__ = [
    "DecodeResult",
    "StaticDecodeConfig",
    "StopReason",
    "T2SConfig",
    "T2SModel",
    "T2SRequest",
    "T2SSamplingParams",
    "T2SStaticDecoder",
    "decode",
    "decode_step",
    "load_t2s",
    "prepare_t2s",
    "logit_margins",
    "make_t2s_checkpoint",
    "read_t2s_checkpoint",
]
