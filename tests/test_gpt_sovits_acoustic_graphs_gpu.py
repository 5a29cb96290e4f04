"""The streaming path's CFM and vocoder graphs (acoustic_graphs.py) on CUDA (`-m gpu`): real graphs held
to eager on the tiny `make-checkpoint` set. CPU tests: test_gpt_sovits_acoustic_graphs_{pieces,engine}.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from acoustic_graphs_fakes import random_piece, stream_audio
from gpt_sovits_fixtures import REFERENCE_TEXT

from voicehub.models.gpt_sovits import Voice, load
from voicehub.models.gpt_sovits.bigvgan import vocode
from voicehub.models.gpt_sovits.cfm import solve
from voicehub.models.gpt_sovits.cfm.solver import solve_padded
from voicehub.models.gpt_sovits.params import GptSovitsParams
from voicehub.text.options import Language


def _cuda_model(tiny_set, dtype, preset="full"):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    return load(tiny_set, device="cuda", dtype=dtype, cuda_graph_preset=preset)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_cuda_cfm_graph_equals_eager(tiny_set, dtype):
    model = _cuda_model(tiny_set, dtype)
    graphs = model.pipeline.acoustic_graphs
    est = model.pipeline.sovits.cfm.estimator
    with torch.inference_mode():
        for n, p in ((100, 40), (541, 468), (934, 468)):
            mu, prompt, noise = (t.to("cuda", dtype) for t in random_piece(est, n, p, seed=n))
            out = graphs.solve(est, mu, prompt, noise, 4)
            slots = graphs.cfm._slots_of(graphs.cfm.key(1, n))  # the graph's inputs: eager on the same
            eager = solve_padded(est, slots.mu, slots.prompt_x, slots.keep, slots.noise, 4, slots.mask)
            assert torch.equal(out, eager[:, :, :n]), n  # the same kernels on the same buffers
            alone = solve(est, mu, prompt, noise, 4)  # unpadded: up to rounding (masked attention)
            tol = 1e-4 if dtype == torch.float32 else 2e-2
            assert (out - alone).abs().max() <= tol * max(1.0, alone.abs().max().item()), n


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_cuda_vocoder_row_graphs_equal_eager(tiny_set, dtype):
    """The stream engine's windows: 3 of one length replay the (4 rows, n) graph. The replay equals eager
    BigVGAN on the graph's own (zero-padded) input bit for bit; each row equals its window vocoded alone
    within fp rounding (a batch of 4 may take other cuDNN kernels than a batch of 1)."""
    model = _cuda_model(tiny_set, dtype)
    graphs, voc = model.pipeline.acoustic_graphs, model.pipeline.vocoder
    tol = 5e-3 if dtype == torch.float32 else 3e-2  # fp32: cuDNN may use TF32 (as serving_gpu's bound)
    with torch.inference_mode():
        for n in (64, 128, 160):
            mels = [(torch.randn(100, n, device="cuda") - 6).to(dtype) for _ in range(3)]
            assert graphs.vocoder_eager_reason(3, n) is None
            out = graphs.vocode_rows(voc, mels)
            eager = vocode(voc, graphs.vocoder._input_of((4, n)))  # the graph's input, its 4th row zeros
            assert torch.equal(out, eager[:3]), n
            for row, mel in zip(out, mels):
                alone = vocode(voc, mel[None])[0]
                assert (row - alone).abs().max() <= tol * max(1.0, alone.abs().max().item()), n
        assert {(4, 64), (4, 128), (4, 160)} <= set(graphs.vocoder.captured)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "dtype, min_snr_db", [(torch.float32, 50.0), (torch.float16, 25.0)]
)  # as serving_gpu
def test_cuda_stream_with_graphs_equals_without(tiny_set, reference_wav, dtype, min_snr_db):
    model = _cuda_model(tiny_set, dtype)
    pipe = model.pipeline
    graphs = pipe.acoustic_graphs
    assert graphs is not None and graphs.info()["vocoder"] > 0 and graphs.info()["encoder"] > 0  # at load
    voice = Voice(reference_wav, REFERENCE_TEXT, "en")
    ref = pipe.reference(voice)
    sentence = pipe.text_features("One sentence on the GPU, streamed.", Language.EN)
    params = GptSovitsParams.build("fast", force_n_tokens=90, stream_chunk_tokens=25)
    with_graphs = stream_audio(pipe, ref, sentence, params)
    pipe.acoustic_graphs = None
    try:
        without = stream_audio(pipe, ref, sentence, params)
    finally:
        pipe.acoustic_graphs = graphs
    assert [len(a) for a in with_graphs] == [len(a) for a in without] and len(with_graphs) >= 3
    a, b = np.concatenate(with_graphs), np.concatenate(without)
    snr = 10 * np.log10(np.sum(b**2) / max(np.sum((a - b) ** 2), 1e-30))
    assert snr >= min_snr_db, snr
