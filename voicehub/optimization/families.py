"""What each model family can do: one declarative capability record per family, as data.

These records belong beside their families (a module-level `OPTIMIZATION_CAPABILITIES` in each
family package); they live here while the family packages are being written. A record says what
a family *offers*; whether `auto` uses it is decided by evidence (see evidence.py), and the
family's `optimization_targets()` supplies the transform that does it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum
from types import MappingProxyType

from voicehub.optimization.config import DType, Feature

ALL_DTYPES = frozenset(DType)
HALF_DTYPES = frozenset({DType.FLOAT16, DType.BFLOAT16})
ANY_DEVICE = frozenset({"cpu", "cuda"})
CUDA_ONLY = frozenset({"cuda"})


class TechniqueKind(StrEnum):
    EXACT = "exact"  # the same function through other kernels or capture: an exactness proof validates it
    APPROXIMATE = "approximate"  # changes the output: only a real-checkpoint quality comparison validates it


@dataclass(frozen=True)
class Technique:
    """One way to serve a feature. `name` is the control's value for attention and kernels
    ('sdpa', 'triton') and the technique's own name for the on/off controls ('torch_compile')."""

    feature: Feature
    name: str
    kind: TechniqueKind
    summary: str
    devices: frozenset[str] = ANY_DEVICE
    dtypes: frozenset[DType] = ALL_DTYPES
    gpu_archs: frozenset[str] | None = None  # None: any architecture
    distribution: str | None = None  # a PyPI distribution that must be installed (read from metadata)
    # Declared for the family's design but with no transform yet: resolution raises
    # OptimizationNotImplementedError with this reason for an explicit request, and `auto` skips it
    # ("not implemented yet"). The family's optimization_targets() still offers a placeholder whose
    # validate() raises the same error, as a second guard.
    not_implemented: str | None = None

    def unmet(self, device_type: str, dtype: DType, gpu_arch: str | None) -> str | None:
        """Why this technique cannot run on (device, dtype, arch), or None when it can."""
        if device_type not in self.devices:
            return f"{self.name} runs on {'/'.join(sorted(self.devices))} only, not {device_type}"
        if dtype not in self.dtypes:
            return f"{self.name} supports {'/'.join(sorted(self.dtypes))}, not {dtype}"
        if device_type == "cuda" and self.gpu_archs is not None and gpu_arch not in self.gpu_archs:
            return f"{self.name} needs a GPU of architecture {'/'.join(sorted(self.gpu_archs))}, not {gpu_arch or 'unknown'}"
        return None


@dataclass(frozen=True)
class FamilyCapabilities:
    """A family's techniques; within one feature, `auto` prefers the earlier ones."""

    model_type: str
    techniques: tuple[Technique, ...]
    notes: tuple[str, ...] = ()

    def for_feature(self, feature: Feature) -> tuple[Technique, ...]:
        return tuple(t for t in self.techniques if t.feature == feature)

    def not_implemented(self) -> tuple[Technique, ...]:
        """Techniques declared without a transform yet (see `Technique.not_implemented`)."""
        return tuple(t for t in self.techniques if t.not_implemented is not None)


_FA4 = Technique(
    Feature.ATTENTION,
    "flash_attention_4",
    TechniqueKind.EXACT,
    "FlashAttention 4 (CuTe) kernels for the decoder's self-attention",
    devices=CUDA_ONLY,
    dtypes=HALF_DTYPES,
    gpu_archs=frozenset({"sm_90", "sm_100"}),
    distribution="flash-attn-4",
)
_SDPA = Technique(
    Feature.ATTENTION, "sdpa", TechniqueKind.EXACT, "torch scaled_dot_product_attention over true lengths"
)
_COMPILE = Technique(
    Feature.COMPILE, "torch_compile", TechniqueKind.EXACT, "torch.compile of the hot modules"
)

_NOT_YET = "not implemented yet for gpt-sovits-v3"

GPT_SOVITS_V3 = FamilyCapabilities(
    model_type="gpt-sovits-v3",
    techniques=(
        replace(_FA4, summary=f"[{_NOT_YET}] " + _FA4.summary, not_implemented=_NOT_YET),
        replace(
            _SDPA,
            summary=f"[{_NOT_YET}: the native T2S attention already calls SDPA] " + _SDPA.summary,
            not_implemented=f"{_NOT_YET}: the native T2S attention already calls torch SDPA; use native",
        ),
        Technique(
            Feature.KERNELS,
            "triton",
            TechniqueKind.EXACT,
            "Triton kernels: fused anti-aliased Snake (BigVGAN); the fused T2S decode step of the "
            "CUDA-graph decoder (one stream: three kernels a layer, QKV + KV append, attention over "
            "true lengths + out-projection, FFN; batched streams: tensor-core tiles over rows) and "
            "its sampler",
            devices=CUDA_ONLY,
            distribution="triton",
        ),
        Technique(
            Feature.KERNELS,
            "torch",
            TechniqueKind.EXACT,
            "portable PyTorch versions of the fused ops (BigVGAN anti-aliased Snake, polyphase)",
        ),
        replace(
            _COMPILE,
            summary="torch.compile of the CFM DiT's transformer blocks (one compiled block serves all)",
        ),
        Technique(
            Feature.DIFFUSION_SAMPLING,
            "cfm_short_schedule",
            TechniqueKind.APPROXIMATE,
            "fewer CFM steps on a dyadic schedule (the requested finest step, then doubling steps, "
            "as the v3 shortcut model was trained): 4 requested steps take 3, 8 take 4, 16 take 5",
        ),
        Technique(
            Feature.DIFFUSION_CACHE,
            "dit_step_cache",
            TechniqueKind.APPROXIMATE,
            "reuse the second half of the DiT blocks' residual on every other CFM step",
        ),
    ),
    notes=(
        "implemented: kernels=triton and kernels=torch, compile, diffusion_sampling=cfm_short_schedule "
        "and diffusion_cache=dit_step_cache; attention sdpa and flash_attention_4 are declared but not "
        "implemented yet: an explicit request for one raises OptimizationNotImplementedError when the "
        "plan is resolved, and auto skips them",
        "cuda_extension: no compiled CUDA extension is shipped for this family yet",
        "diffusion_sampling and diffusion_cache are approximate: auto keeps them off until a "
        "fixed-seed comparison on a real checkpoint passes the quality gate (none has been available: "
        "the project's v3 checkpoints are random weights)",
        "CUDA-graph presets (full, minimal, lazy, off) are engine configuration given at load",
    ),
)

_VITS_NOT_YET = "not implemented yet for vits"

VITS = FamilyCapabilities(
    model_type="vits",
    techniques=(
        replace(
            _SDPA,
            summary="the text encoder's relative-position attention through a fused SDPA kernel "
            "(relative keys as the score bias; relative values from the windowed weights and the "
            "kernel's log-sum-exp)",
        ),
        Technique(
            Feature.KERNELS,
            "triton",
            TechniqueKind.EXACT,
            f"[{_VITS_NOT_YET}] Triton kernels for the decoder (HiFi-GAN) activations and residual blocks",
            devices=CUDA_ONLY,
            distribution="triton",
            not_implemented=_VITS_NOT_YET,
        ),
        Technique(
            Feature.KERNELS,
            "torch",
            TechniqueKind.EXACT,
            f"[{_VITS_NOT_YET}] portable PyTorch versions of the fused ops",
            not_implemented=_VITS_NOT_YET,
        ),
        replace(_COMPILE, summary="torch.compile of the HiFi-GAN decoder and the prior flow"),
    ),
    notes=(
        "flash_attention_4: VITS attention adds relative-position logits, which FlashAttention 4 does not take",
        "no diffusion stage: diffusion_cache and diffusion_sampling do not apply",
        "compile is validated (or refused) by a measurement on the real Piper voice, recorded as evidence",
    ),
)

FAMILY_CAPABILITIES = MappingProxyType({c.model_type: c for c in (GPT_SOVITS_V3, VITS)})
