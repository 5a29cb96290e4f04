"""The server warms up a preloaded GPT-SoVITS model with the spec's default voice, and skips (saying
so) a model of a voice-cloning family that has none, instead of failing its preload."""

from __future__ import annotations

import functools
import logging

import pytest
from gpt_sovits_fixtures import REFERENCE_TEXT

from voicehub.models.base import TTSModel
from voicehub.server.config import Limits, ModelSpec
from voicehub.server.metrics import Metrics
from voicehub.server.pool import ModelPool, load_model
from voicehub.server.worker import Worker


def _load(spec: ModelSpec) -> TTSModel:
    model = load_model(spec, "cpu")
    # The tiny set's random T2S never emits EOS: cap each request's tokens so a warm-up takes a second.
    model.stream = functools.partial(model.stream, force_n_tokens=4)
    return model


def _preload(spec: ModelSpec) -> tuple[Worker, ModelPool]:
    pool = ModelPool(_load)
    worker = Worker(pool, Limits(), Metrics(), [spec], warmup_text="Hi.")
    worker.start()
    try:
        assert worker.ready.wait(60) or worker.startup_error, "preloading neither finished nor failed"
    finally:
        worker.stop()
    return worker, pool


def test_warm_up_uses_the_default_voice(tiny_set, reference_wav):
    voice = {"ref_audio_path": str(reference_wav), "prompt_text": REFERENCE_TEXT, "prompt_language": "en"}
    spec = ModelSpec("gs", path=str(tiny_set), model_type="gpt-sovits-v3", options={"default_voice": voice})
    worker, pool = _preload(spec)
    assert worker.startup_error is None and worker.ready.is_set()
    cache = pool.get(spec).reference_cache
    assert (cache.misses, len(cache)) == (1, 1)  # the warm-up computed the default voice's reference


def test_warm_up_is_skipped_without_a_voice(tiny_set, caplog):
    spec = ModelSpec("gs", path=str(tiny_set), model_type="gpt-sovits-v3", options={"lazy_load": True})
    with caplog.at_level(logging.WARNING, logger="voicehub.server"):
        worker, pool = _preload(spec)
    assert worker.startup_error is None and worker.ready.is_set()
    assert "not warming up model 'gs'" in caplog.text and "default_voice" in caplog.text
    assert pool.get(spec).reference_cache.misses == 0
    with pytest.raises(ValueError, match="clones a reference voice"):
        pool.get(spec).stream("Hi.")
