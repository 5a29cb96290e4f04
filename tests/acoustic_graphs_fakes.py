"""Shared set-up of the acoustic graph tests (test_gpt_sovits_acoustic_graphs_*.py).

CPU: CUDA graphs need CUDA, so a stand-in runner (the `captured` fixture) "captures" by running the step
once and keeping its outputs, and "replays" by running the step again into those same tensors (a real
graph's static-output semantics: a caller that keeps the output without copying it sees it change).
Test modules import `captured` by name (pytest looks a fixture up in the test's own module); the tiny
set's `model` and `voice` come from conftest.py.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from voicehub.models.gpt_sovits.acoustic_graphs import AcousticGraphs
from voicehub.models.gpt_sovits.pipeline import Pipeline
from voicehub.runtime import cuda_graphs
from voicehub.runtime.cuda_graphs import BucketedGraphRunner

ATOL = 2e-5  # fp32: the padded, masked piece reorders a few sums
CUDA = torch.device("cuda")  # what the graphs are told; the stand-in never touches it


@pytest.fixture
def captured(monkeypatch) -> list:
    """Keys the stand-in runner captured, in order (see the module's docstring)."""
    keys: list = []
    init = BucketedGraphRunner.__init__

    def on_cuda(self, step, buckets, preset, device, **kw):
        init(self, step, buckets, preset, CUDA, **kw)

    def capture(self, key):
        keys.append(key)
        outputs = self.step(key)
        graph = SimpleNamespace(replay=lambda: outputs.copy_(self.step(key)))
        self._graphs[key] = cuda_graphs._Captured(graph, outputs)
        return self._graphs[key]

    monkeypatch.setattr(BucketedGraphRunner, "__init__", on_cuda)
    monkeypatch.setattr(BucketedGraphRunner, "_capture", capture)
    return keys


def graphs_of(pipe, preset: str = "lazy") -> AcousticGraphs:
    return AcousticGraphs(pipe.sovits.cfm.estimator, pipe.vocoder, preset, CUDA)


def random_piece(est, n: int, p: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    text_dim, mel = est.text_embed.freqs_cis.shape[1], est.proj_out.out_features
    return (torch.randn(1, n, text_dim, generator=g), torch.randn(1, mel, p, generator=g),
            torch.randn(1, mel, n, generator=g))  # fmt: skip


def stream_audio(pipe: Pipeline, ref, sentence, params):
    return [a for a, _ in pipe.stream_sentence(ref, sentence, params, seed=3)]
