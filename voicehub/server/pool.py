"""The models the worker has loaded, under a memory budget, unloading the least recently used.

Only the worker thread calls into a pool, so it needs no lock. A model's size is its measured CUDA
allocation when it lives on a GPU, else the `memory_mb` its spec states.
"""

from __future__ import annotations

import gc
import hashlib
import importlib
import json
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from voicehub.models.base import TTSModel
from voicehub.server.config import ModelSpec
from voicehub.server.errors import ServerError

MB = 1024 * 1024


def spec_key(family: str, model_files: dict[str, str]) -> str:
    """A stable pool name for a registry voice's weights: voices with the same files share one model."""
    digest = hashlib.sha1(json.dumps(model_files, sort_keys=True).encode()).hexdigest()[:10]
    return f"{family}-{digest}"


def load_model(spec: ModelSpec, default_device: str) -> TTSModel:
    """Build the model a spec names: through its factory, else through the hub."""
    if spec.factory is not None:
        module_name, _, attr = spec.factory.partition(":")
        factory = getattr(importlib.import_module(module_name), attr)
        return factory(**spec.options)
    from voicehub.hub import AutoModelForTextToSpeech

    return AutoModelForTextToSpeech.from_pretrained(
        spec.path, model_type=spec.model_type, device=spec.device or default_device, **spec.options
    )


def describe_model(model: TTSModel) -> dict[str, Any]:
    """JSON-ready facts a loaded model gives about itself: its family's `describe()` when it has one.

    Read once at load, on the worker thread, so handlers can show them without touching the model.
    """
    facts: dict[str, Any] = {"model_type": model.model_type, "sample_rate": model.sample_rate}
    describe = getattr(model, "describe", None)  # optional: TTSModel does not require it
    if callable(describe):
        facts.update(describe())
    return facts


@dataclass
class _Entry:
    model: TTSModel
    size_mb: float
    info: dict[str, Any] = field(default_factory=dict)


def _cuda_allocated_mb() -> float:
    try:
        import torch
    except ImportError:
        return 0.0
    return torch.cuda.memory_allocated() / MB if torch.cuda.is_available() else 0.0


def freeze_long_lived() -> None:
    """Move every object alive now (a loaded model's modules, tensors, text tables) out of the garbage
    collector's walks: a full collection otherwise visits them all in the middle of requests (a tiny
    GPT-SoVITS load leaves ~200,000 tracked objects, a full collection 88 ms on a CI core, ~0 ms once
    frozen; one 128-stream batch run held a 219 ms pause, benchmarks/results/t2s_batch_triton_h200.json).
    Frozen objects are still freed by reference counting; cycles among them wait for `unload`, which
    thaws first."""
    gc.collect()
    gc.freeze()


class ModelPool:
    """name -> loaded model; `get` loads on a miss and unloads the least recently used to fit the budget."""

    def __init__(self, loader: Callable[[ModelSpec], TTSModel], budget_mb: float = 0.0):
        self._loader = loader
        self.budget_mb = budget_mb  # 0: no budget
        self._models: OrderedDict[str, _Entry] = OrderedDict()

    def loaded(self) -> list[str]:
        return list(self._models)

    def info(self) -> dict[str, dict[str, Any]]:
        """name -> `describe_model` facts of each loaded model (a snapshot; safe from handler threads)."""
        return {name: dict(entry.info) for name, entry in list(self._models.items())}

    def used_mb(self) -> float:
        return sum(e.size_mb for e in self._models.values())

    def get(self, spec: ModelSpec, pinned: frozenset[str] = frozenset()) -> TTSModel:
        """The loaded model of `spec`, loading it if needed; models in `pinned` are never unloaded."""
        entry = self._models.get(spec.name)
        if entry is not None:
            self._models.move_to_end(spec.name)
            return entry.model
        if self.budget_mb and spec.memory_mb:
            self._make_room(spec.memory_mb, pinned)
        before = _cuda_allocated_mb()
        model = self._loader(spec)
        size = (_cuda_allocated_mb() - before) or spec.memory_mb
        self._models[spec.name] = _Entry(model, size, describe_model(model))
        if self.budget_mb:
            self._make_room(0.0, pinned | {spec.name})
        freeze_long_lived()
        return model

    def _make_room(self, need_mb: float, pinned: frozenset[str]) -> None:
        for name in list(self._models):
            if self.used_mb() + need_mb <= self.budget_mb:
                return
            if name not in pinned:
                self.unload(name)
        if self.used_mb() + need_mb > self.budget_mb:
            raise ServerError(
                f"models in use need {self.used_mb() + need_mb:.0f} MB, over the memory budget of "
                f"{self.budget_mb:.0f} MB; raise limits.memory_budget_mb or serve fewer models at once"
            )

    def unload(self, name: str) -> None:
        entry = self._models.pop(name, None)
        if entry is None:
            return
        del entry
        gc.unfreeze()  # a frozen cycle is never collected: thaw, collect, freeze what is still alive
        gc.collect()
        gc.freeze()
        try:
            import torch

            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        except ImportError:
            pass
