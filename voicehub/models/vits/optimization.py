"""The optimization layer's transforms for VITS: named, reversible, applied from outside the network.

- attention=sdpa (exact): the text encoder's relative-position attention through a fused kernel
  (attention_sdpa.py), swapped in with `VitsSynthesizer.set_attention`; undo puts the native back.
- compile=torch_compile (exact within fp tolerance): torch.compile of the HiFi-GAN decoder (most of
  the time) and the prior flow's reverse pass, each on its instance.
Techniques the capability record declares without a transform (kernels) get a placeholder that
refuses. Validation reads no weights; apply reads them if the model was loaded lazily.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from voicehub.optimization.config import Feature
from voicehub.optimization.errors import OptimizationStateError, OptimizationUnsupportedError
from voicehub.optimization.families import FAMILY_CAPABILITIES
from voicehub.optimization.transforms import CompileTarget, CompileTransform, NotImplementedTransform
from voicehub.runtime.compile import DEFAULT_BACKEND

if TYPE_CHECKING:
    from voicehub.models.vits.tts import VitsModel

Undo = Callable[[], None]
PREFIX = "vits"
COMPILE_BACKEND = DEFAULT_BACKEND  # tests set 'aot_eager' (inductor is slow to compile on a small CPU)
WARMUP_FRAMES = 256  # latent frames of the compile warm-up (shape-generic code; a typical size, so
# size-dependent kernel choices guarded by the compiler hold for real sentences)


@dataclass
class SdpaAttentionTransform:
    """attention=sdpa: the fused relative-position attention in every text-encoder layer."""

    model: VitsModel
    feature: str = str(Feature.ATTENTION)
    technique: str = "sdpa"

    @property
    def name(self) -> str:
        return f"{PREFIX}.{self.feature}.{self.technique}"

    def validate(self) -> None:
        from voicehub.models.vits.attention_sdpa import sdpa_unavailable

        reason = sdpa_unavailable(self.model.device, self.model.dtype)
        if reason is not None:
            raise OptimizationUnsupportedError(
                f"attn_implementation='sdpa' cannot run here: {reason}; use attn_implementation='native'"
            )

    def apply(self) -> Undo:
        from voicehub.models.vits.attention_sdpa import relative_attention_sdpa
        from voicehub.models.vits.text_encoder import relative_attention_native

        net = self.model.network
        if net.enc_p.encoder.attn_layers[0].attend is not relative_attention_native:
            raise OptimizationStateError("the VITS attention was changed outside the optimization layer")
        previous = net.set_attention(relative_attention_sdpa)
        return lambda: net.set_attention(previous)


def compile_targets(model: VitsModel) -> list[CompileTarget]:
    """The decoder and the flow's reverse pass, each with a small warm-up input."""
    net = model.network
    arch, dev, dtype = net.arch, model.device, model.dtype
    g = torch.zeros(1, arch.gin_channels, 1, device=dev, dtype=dtype) if arch.n_speakers > 1 else None

    @torch.inference_mode()  # the mode of generate() and stream(): compiled code is guarded on it
    def decoder_warmup() -> None:
        with model.precision():
            net.dec(torch.zeros(1, arch.inter_channels, WARMUP_FRAMES, device=dev, dtype=dtype), g)

    @torch.inference_mode()
    def flow_warmup() -> None:
        z = torch.zeros(1, arch.inter_channels, WARMUP_FRAMES, device=dev, dtype=dtype)
        with model.precision():
            net.flow.reverse(z, torch.ones(1, 1, WARMUP_FRAMES, device=dev, dtype=dtype), g)

    return [
        CompileTarget("dec", net.dec, decoder_warmup),
        CompileTarget("flow.reverse", net.flow, flow_warmup, method="reverse"),
    ]


def vits_transforms(model: VitsModel) -> list:
    """Every transform a VITS model offers, plus a placeholder per declared-only technique."""
    caps = FAMILY_CAPABILITIES[model.model_type]
    compiled = CompileTransform(PREFIX, model.device.type, lambda: compile_targets(model), COMPILE_BACKEND)
    transforms: list = [SdpaAttentionTransform(model), compiled]
    transforms += [NotImplementedTransform(PREFIX, model.model_type, t) for t in caps.not_implemented()]
    return transforms
