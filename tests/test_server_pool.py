"""ModelPool: least-recently-used unloading under a memory budget, pinned models kept."""

from __future__ import annotations

import pytest

from voicehub.server.config import ModelSpec
from voicehub.server.errors import ServerError
from voicehub.server.fake import SineModel
from voicehub.server.pool import ModelPool


def test_lru_unloads_to_fit_the_budget_and_keeps_pinned_models():
    loads = []

    def loader(spec):
        loads.append(spec.name)
        return SineModel()

    pool = ModelPool(loader, budget_mb=100)
    a, b, c = (ModelSpec(n, factory="x", memory_mb=40) for n in "abc")
    pool.get(a)
    pool.get(b)
    pool.get(a)  # a is now the most recently used
    pool.get(c)  # 120 MB > 100: b (least recent) goes
    assert pool.loaded() == ["a", "c"] and loads == ["a", "b", "c"]
    pool.get(b, pinned=frozenset({"a"}))  # c goes, a stays though older
    assert pool.loaded() == ["a", "b"]
    big = ModelSpec("big", factory="x", memory_mb=90)
    with pytest.raises(ServerError, match="over the memory budget"):
        pool.get(big, pinned=frozenset({"a", "b"}))
