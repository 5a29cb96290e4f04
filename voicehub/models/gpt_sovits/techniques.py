"""GPT-SoVITS v3's CFM techniques and compile, as named reversible transforms.

- diffusion_sampling=cfm_short_schedule (approximate): the CFM takes the dyadic schedule
  (`cfm.schedule.dyadic_steps`: the requested finest step first, then steps that double, so
  4 requested steps become 3, 8 become 4, 16 become 5).
- diffusion_cache=dit_step_cache (approximate): every other CFM step reuses the residual that the
  second half of the DiT blocks added on the step before (`cfm.schedule.StepCache`).
- compile=torch_compile (exact within fp tolerance): torch.compile of the DiT's transformer blocks,
  each on its instance, compiled at apply time on a small input with shape-generic code. The blocks
  are identical, so one compiled graph serves all of them (regional compilation: compile time of
  one block, not of the whole stack). BigVGAN stays out: its 18 residual blocks all differ in
  shape, so inductor compiles each (the whole DiT + BigVGAN did not finish in 170 s on an H200),
  and kernel_backend=triton already fuses its activations.

Each swaps what the DiT or vocoder instance holds and its undo puts the previous value back, so a
restore gives bit-identical output. Validation reads no weights; apply reads them if the model
was loaded lazily.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from voicehub.models.gpt_sovits.cfm.schedule import StepCache, dyadic_steps, uniform_steps
from voicehub.optimization.config import Feature
from voicehub.optimization.errors import OptimizationStateError
from voicehub.optimization.transforms import CompileTarget, CompileTransform
from voicehub.runtime.compile import DEFAULT_BACKEND

if TYPE_CHECKING:
    from voicehub.models.gpt_sovits.cfm.dit import DiT
    from voicehub.models.gpt_sovits.model import GptSovitsModel

Undo = Callable[[], None]
PREFIX = "gpt_sovits"
STEP_CACHE = StepCache(interval=2, start_fraction=0.5)
COMPILE_BACKEND = DEFAULT_BACKEND  # tests set 'aot_eager': inductor takes ~30 s per compile on a small CPU
WARMUP_FRAMES = 128  # mel frames of the compile warm-up (shape-generic code; a typical size, so
# size-dependent kernel choices guarded by the compiler hold for real chunks)


def _estimator(model: GptSovitsModel) -> DiT:
    return model.pipeline.sovits.cfm.estimator


@dataclass
class ShortScheduleTransform:
    """diffusion_sampling=cfm_short_schedule: fewer CFM steps on the dyadic schedule."""

    model: GptSovitsModel
    feature: str = str(Feature.DIFFUSION_SAMPLING)
    technique: str = "cfm_short_schedule"
    details: dict[str, Any] = field(
        default_factory=lambda: {
            "schedule": "dyadic",
            "steps_taken": {str(n): len(dyadic_steps(n)) for n in (4, 8, 16, 32)},
        }
    )

    @property
    def name(self) -> str:
        return f"{PREFIX}.{self.feature}.{self.technique}"

    def validate(self) -> None:
        """Nothing to check: it runs wherever the CFM runs (no weights are read here)."""

    def apply(self) -> Undo:
        est = _estimator(self.model)
        if est.schedule is not uniform_steps:
            raise OptimizationStateError(
                "the CFM schedule was changed outside the optimization layer; reload the model"
            )
        previous = est.set_schedule(dyadic_steps)
        return lambda: est.set_schedule(previous)


@dataclass
class StepCacheTransform:
    """diffusion_cache=dit_step_cache: deep DiT blocks reused on every other CFM step."""

    model: GptSovitsModel
    cache: StepCache = STEP_CACHE
    feature: str = str(Feature.DIFFUSION_CACHE)
    technique: str = "dit_step_cache"

    @property
    def name(self) -> str:
        return f"{PREFIX}.{self.feature}.{self.technique}"

    @property
    def details(self) -> dict[str, Any]:
        return {"interval": self.cache.interval, "start_fraction": self.cache.start_fraction}

    def validate(self) -> None:
        """Nothing to check: it runs wherever the CFM runs (no weights are read here)."""

    def apply(self) -> Undo:
        est = _estimator(self.model)
        if est.step_cache is not None:
            raise OptimizationStateError(
                "the DiT already has a step cache set outside the optimization layer"
            )
        previous = est.set_step_cache(self.cache)
        return lambda: est.set_step_cache(previous)


def compile_targets(model: GptSovitsModel) -> list[CompileTarget]:
    """The DiT's transformer blocks (most of each CFM step); one warm-up through the whole DiT."""
    est = _estimator(model)
    dev, dtype = model.device, model.dtype
    mel_dim, dim = est.proj_out.out_features, est.proj_out.in_features
    text_dim = est.input_embed.proj.in_features - 2 * mel_dim  # proj reads [x, prompt, text]

    @torch.inference_mode()  # the pipeline's mode: compiled code is guarded on it
    def dit_warmup() -> None:
        # The solver's inputs are channel-first tensors transposed ([B, C, N] -> [B, N, C]): the same
        # strides here, so the compiled code's guards hold for real calls and nothing recompiles.
        # Batch 1 only: warming batch 2 as well (an engine's batched solves) made the one-stream sentence
        # slower under compile on an H100 (A/B: 99.9 / 98.7 ms against 109.2 / 116.9 ms,
        # benchmarks/results/compile_warmup_ab_h100.json), so a batch above 1 compiles at its first call.
        x = torch.zeros(1, mel_dim, WARMUP_FRAMES, device=dev, dtype=dtype).transpose(1, 2)
        text = torch.zeros(1, text_dim, WARMUP_FRAMES, device=dev, dtype=dtype).transpose(1, 2)
        t, d_emb = torch.zeros(1, device=dev, dtype=dtype), torch.zeros(1, dim, device=dev, dtype=dtype)
        est(x, torch.zeros_like(x), text, t, d_emb)  # two tensors: guards also check aliasing
        # and masked, as the graphs, the batches and the per-sentence path's bucketed solves call it
        mask = torch.ones(1, WARMUP_FRAMES, device=dev, dtype=torch.bool)
        est(x, torch.zeros_like(x), text, t, d_emb, mask)

    blocks = list(est.transformer_blocks)
    # Compiling is lazy: the last target's warm-up runs every block, compiling the first and
    # reusing its graph for the rest; a failure there undoes all of them (CompileTransform).
    return [
        CompileTarget(
            f"cfm.estimator.transformer_blocks.{i}", block, dit_warmup if i == len(blocks) - 1 else _nothing
        )
        for i, block in enumerate(blocks)
    ]


def _nothing() -> None:
    """The warm-up of a block compiled by a later target's warm-up."""


def compile_transform(model: GptSovitsModel) -> CompileTransform:
    return CompileTransform(PREFIX, model.device.type, lambda: compile_targets(model), COMPILE_BACKEND)


def technique_transforms(model: GptSovitsModel) -> list:
    """This module's transforms for `model` (optimization.gpt_sovits_transforms adds the kernels)."""
    return [ShortScheduleTransform(model), StepCacheTransform(model), compile_transform(model)]
