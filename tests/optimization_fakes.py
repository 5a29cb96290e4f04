"""A test-local model family for the optimization tests.

Every control has an implemented technique, so the resolution and apply rules are tested
independently of how far a real family's implementation has come. It reaches resolve() through
its `capabilities` argument (or a test's monkeypatch of the plan's table); the package's table is
not touched.
"""

from __future__ import annotations

from types import MappingProxyType

from voicehub.optimization import Feature
from voicehub.optimization.families import (
    CUDA_ONLY,
    FAMILY_CAPABILITIES,
    HALF_DTYPES,
    FamilyCapabilities,
    Technique,
    TechniqueKind,
)

FAKE = FamilyCapabilities(
    model_type="fake-tts",
    techniques=(
        Technique(
            Feature.ATTENTION,
            "flash_attention_4",
            TechniqueKind.EXACT,
            "fake FA4",
            devices=CUDA_ONLY,
            dtypes=HALF_DTYPES,
            gpu_archs=frozenset({"sm_90", "sm_100"}),
            distribution="flash-attn-4",
        ),
        Technique(Feature.ATTENTION, "sdpa", TechniqueKind.EXACT, "fake SDPA"),
        Technique(
            Feature.KERNELS,
            "triton",
            TechniqueKind.EXACT,
            "fake Triton",
            devices=CUDA_ONLY,
            distribution="triton",
        ),
        Technique(Feature.KERNELS, "torch", TechniqueKind.EXACT, "fake torch kernels"),
        Technique(Feature.COMPILE, "torch_compile", TechniqueKind.EXACT, "fake compile"),
        Technique(
            Feature.DIFFUSION_SAMPLING, "cfm_short_schedule", TechniqueKind.APPROXIMATE, "fake schedule"
        ),
        Technique(Feature.DIFFUSION_CACHE, "dit_step_cache", TechniqueKind.APPROXIMATE, "fake cache"),
    ),
)
CAPS = MappingProxyType({**FAMILY_CAPABILITIES, FAKE.model_type: FAKE})
