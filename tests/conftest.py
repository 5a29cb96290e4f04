"""Shared test set-up: no network, caches in a temporary folder, small thread counts."""

from __future__ import annotations

import os

import pytest
import torch
from gpt_sovits_fixtures import REFERENCE_TEXT, reference_wav, tiny_set  # noqa: F401 (fixtures)

# Without a GPU, Triton kernels run only in Triton's interpreter, and @triton.jit (and Triton's own
# standard library) read TRITON_INTERPRET when first imported: set it before any test imports them.
# Tests that check the no-GPU refusal delete it with monkeypatch.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Helper modules that hold asserts moved out of test modules (not named test_*): pytest rewrites their
# asserts as it does the tests', so a failing check there still shows its values.
pytest.register_assert_rewrite("t2s_layer_inputs", "gpt_sovits_streaming_fixtures")


@pytest.fixture(scope="session", autouse=True)
def _offline_and_private_cache(tmp_path_factory: pytest.TempPathFactory):
    # Caches the packages write go to a temporary folder; nothing may reach a model hub.
    cache = tmp_path_factory.mktemp("voicehub-cache")
    saved = {k: os.environ.get(k) for k in ("VOICEHUB_CACHE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    os.environ.update(VOICEHUB_CACHE=str(cache), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    yield
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(scope="session")
def transcriber():
    """Whisper base on the CPU, loaded once per test run."""
    pytest.importorskip("faster_whisper", reason="the quality extra is needed for ASR checks")
    from voicehub.bench.asr import Transcriber

    return Transcriber("base")


@pytest.fixture(scope="module")
def model(tiny_set):  # noqa: F811
    """The tiny GPT-SoVITS v3 set loaded by `load`, once per test module (some tests change the model)."""
    from voicehub.models.gpt_sovits import load

    return load(tiny_set)


@pytest.fixture(scope="module")
def voice(reference_wav):  # noqa: F811
    """The GPT-SoVITS voice of the reference clip and REFERENCE_TEXT, in English, once per test module."""
    from voicehub.models.gpt_sovits import Voice

    return Voice(reference_wav, REFERENCE_TEXT, "en")
