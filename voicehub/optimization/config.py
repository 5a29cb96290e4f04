"""What a user asks for (`TTSOptimizationConfig`) and where it will run (`OptimizationContext`).

Both are frozen and validated once, here: every control is a `str` enum and an unknown value
raises a ValueError that lists the valid ones. Nothing here imports torch or any GPU package.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from voicehub.choices import parse_choice
from voicehub.runtime.graph_presets import GraphPreset

if TYPE_CHECKING:
    from collections.abc import Mapping

    from voicehub.optimization.evidence import EvidenceStore
    from voicehub.optimization.families import FamilyCapabilities
    from voicehub.optimization.plan import OptimizationPlan


class AttentionImplementation(StrEnum):
    AUTO = "auto"
    NATIVE = "native"
    SDPA = "sdpa"
    FLASH_ATTENTION_4 = "flash_attention_4"


class KernelBackend(StrEnum):
    AUTO = "auto"
    NATIVE = "native"  # the model's own code, untouched
    TORCH = "torch"  # our portable PyTorch versions of the fused ops
    TRITON = "triton"
    CUDA_EXTENSION = "cuda_extension"


class Toggle(StrEnum):
    """compile, diffusion cache and diffusion sampling: on where validated, always, or never."""

    AUTO = "auto"
    REQUIRED = "required"
    DISABLED = "disabled"


class OptimizationMode(StrEnum):
    INFERENCE = "inference"
    TRAINING = "training"  # declared so it can be refused by name: no family supports it


class Feature(StrEnum):
    """The controls, in the order their transforms are applied (compile last: it wraps the rest)."""

    ATTENTION = "attention"
    KERNELS = "kernels"
    DIFFUSION_SAMPLING = "diffusion_sampling"
    DIFFUSION_CACHE = "diffusion_cache"
    COMPILE = "compile"


class DType(StrEnum):
    FLOAT32 = "float32"
    FLOAT16 = "float16"
    BFLOAT16 = "bfloat16"


CudaGraphPreset = (
    GraphPreset  # engine configuration given at load (the runtime's presets); plans only record it
)


NATIVE = "native"  # what a decision selects when nothing changes
DTYPE_ALIASES = {"fp32": "float32", "fp16": "float16", "half": "float16", "bf16": "bfloat16"}
_GPU_ARCH = re.compile(r"^sm_\d{2,3}[a-z]?$")
_DEVICE = re.compile(r"^(cpu|cuda(:\d+)?)$")


def parse_dtype(value: Any) -> DType:
    """A dtype name ('float16', 'fp16', ...) or a torch.dtype (read by name, torch not imported)."""
    name = str(value).removeprefix("torch.")
    return parse_choice(DType, DTYPE_ALIASES.get(name, name), "dtype")


@dataclass(frozen=True)
class TTSOptimizationConfig:
    """The optimizations asked for. `auto` turns a technique on only where evidence validates it."""

    attn_implementation: AttentionImplementation = AttentionImplementation.AUTO
    kernel_backend: KernelBackend = KernelBackend.AUTO
    compile: Toggle = Toggle.AUTO
    diffusion_cache: Toggle = Toggle.AUTO
    diffusion_sampling: Toggle = Toggle.AUTO

    def __post_init__(self) -> None:
        # frozen: normalise the given strings to enums once, here
        set_ = object.__setattr__
        set_(
            self,
            "attn_implementation",
            parse_choice(AttentionImplementation, self.attn_implementation, "attn_implementation", "values"),
        )
        set_(
            self,
            "kernel_backend",
            parse_choice(KernelBackend, self.kernel_backend, "kernel_backend", "values"),
        )
        for name in ("compile", "diffusion_cache", "diffusion_sampling"):
            set_(self, name, parse_choice(Toggle, getattr(self, name), name, "values"))

    @classmethod
    def eager(cls) -> TTSOptimizationConfig:
        """Everything native: the reference the benchmark compares against."""
        return cls("native", "native", "disabled", "disabled", "disabled")

    def requested(self, feature: Feature) -> str:
        """The value asked for one feature."""
        return {
            Feature.ATTENTION: self.attn_implementation,
            Feature.KERNELS: self.kernel_backend,
            Feature.COMPILE: self.compile,
            Feature.DIFFUSION_CACHE: self.diffusion_cache,
            Feature.DIFFUSION_SAMPLING: self.diffusion_sampling,
        }[Feature(feature)].value

    def to_dict(self) -> dict[str, str]:
        return {k: str(v) for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TTSOptimizationConfig:
        return cls(**data)

    def resolve(
        self,
        model_type: str,
        mode: str = "inference",
        context: OptimizationContext | None = None,
        *,
        evidence: EvidenceStore | None = None,
        capabilities: Mapping[str, FamilyCapabilities] | None = None,
    ) -> OptimizationPlan:
        """Decide every feature for `model_type` on `context`; changes nothing, imports no GPU package.

        Raises OptimizationUnsupportedError for an explicit request that cannot run there
        (OptimizationNotImplementedError for a technique declared but not implemented yet) and
        TrainingModeUnsupportedError for mode='training'. `evidence` defaults to the files
        shipped in voicehub/optimization/evidence/; `capabilities` (model_type -> record) to the
        package's FAMILY_CAPABILITIES.
        """
        from voicehub.optimization.plan import resolve_plan

        return resolve_plan(self, model_type, mode, context, evidence, capabilities)


@dataclass(frozen=True)
class OptimizationContext:
    """Where the model runs: mode, device ('cpu', 'cuda', 'cuda:N'), dtype, GPU architecture
    ('sm_90'; None when unknown, which keeps `auto` native on CUDA) and the CUDA-graph preset."""

    mode: OptimizationMode = OptimizationMode.INFERENCE
    device: str = "cpu"
    dtype: DType = DType.FLOAT32
    gpu_arch: str | None = None
    cuda_graph_preset: CudaGraphPreset | None = field(default=None)

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "mode", parse_choice(OptimizationMode, self.mode, "mode"))
        device = str(self.device)
        if not _DEVICE.match(device):
            raise ValueError(f"unknown device {self.device!r}; use 'cpu', 'cuda' or 'cuda:N'")
        set_(self, "device", device)
        set_(self, "dtype", parse_dtype(self.dtype))
        if self.gpu_arch is not None:
            if device == "cpu":
                raise ValueError("gpu_arch is only meaningful on a CUDA device; leave it None for 'cpu'")
            if not _GPU_ARCH.match(str(self.gpu_arch)):
                raise ValueError(f"gpu_arch {self.gpu_arch!r} is not like 'sm_90' (sm_<major><minor>)")
        if self.cuda_graph_preset is not None:
            set_(
                self,
                "cuda_graph_preset",
                parse_choice(CudaGraphPreset, self.cuda_graph_preset, "cuda_graph_preset", "values"),
            )

    @property
    def device_type(self) -> str:
        return self.device.split(":")[0]

    @property
    def platform(self) -> str:
        """What evidence is keyed by: the GPU architecture on CUDA, 'cpu' on the CPU."""
        return "cpu" if self.device_type == "cpu" else (self.gpu_arch or "unknown")

    def to_dict(self) -> dict[str, Any]:
        return {k: (str(v) if v is not None else None) for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> OptimizationContext:
        return cls(**data)
