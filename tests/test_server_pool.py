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


class _Cyclic(SineModel):
    """A model whose objects form a reference cycle, as module trees with hooks or back-references do."""

    def __init__(self):
        super().__init__()
        self.me = self


def test_a_loaded_model_is_frozen_out_of_the_collector_and_an_unloaded_one_is_collected():
    import gc
    import weakref

    pool = ModelPool(lambda spec: _Cyclic())
    spec = ModelSpec("cyclic", factory="x")
    try:
        ref = weakref.ref(pool.get(spec))
        assert gc.get_freeze_count() > 0 and ref() is not None
        frozen_before = gc.get_freeze_count()
        pool.unload("cyclic")
        # the cycle was frozen: only the thaw in unload lets the collector free it
        assert ref() is None
        assert gc.get_freeze_count() <= frozen_before
    finally:
        gc.unfreeze()
