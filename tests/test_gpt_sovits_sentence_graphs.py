"""The per-sentence path with acoustic graphs: masked BigVGAN window graphs for whole mels of any length
(vocoder_graphs.vocode_mel), the CFM chunks on the streamed path's graphs, the encoder without cuDNN.

CPU: the stand-in runner of acoustic_graphs_fakes (a "capture" runs the step and keeps its
outputs, a "replay" runs it again into them). GPU tests (`-m gpu`) hold real graphs to eager vocoding.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from acoustic_graphs_fakes import CUDA, captured  # noqa: F401 (fixture: the stand-in runner)
from gpt_sovits_fixtures import REFERENCE_TEXT

from voicehub.models.gpt_sovits import Voice, load
from voicehub.models.gpt_sovits.acoustic_graphs import AcousticGraphs
from voicehub.models.gpt_sovits.bigvgan import vocode
from voicehub.models.gpt_sovits.bigvgan.windows import receptive_field
from voicehub.models.gpt_sovits.params import GptSovitsParams
from voicehub.models.gpt_sovits.pipeline import Pipeline
from voicehub.models.gpt_sovits.vocoder_graphs import MASKED, SENTENCE_FRAME_BUCKETS, VocoderGraphs
from voicehub.runtime import eager_conv
from voicehub.runtime.kernels import registry
from voicehub.text.options import Language

HOP = 256


def _mel(frames: int, seed: int) -> torch.Tensor:
    return torch.randn(1, 100, frames, generator=torch.Generator().manual_seed(seed)) - 6


def test_whole_mels_replay_a_bounded_set_of_masked_graphs(model, captured):  # noqa: F811
    # small buckets so that a few hundred frames cross windows: (1, 32), (1, 64), (2, 64) and (4, 64) are
    # every shape, whatever the length; each length equals one-shot vocoding
    voc = model.pipeline.vocoder
    graphs = VocoderGraphs(voc, CUDA, sentence_buckets=(32, 64), max_row_frames=256)
    assert graphs.masked_keys() == [(1, 32, MASKED), (1, 64, MASKED), (2, 64, MASKED), (4, 64, MASKED)]
    assert graphs.context == receptive_field(voc.conf) < 32 and graphs.sentence_rows == 4
    with torch.inference_mode():
        for n in (1, 20, 33, 64, 65, 110, 300, 31, 64, 110):
            mel = _mel(n, seed=n)
            got = graphs.vocode_mel(mel)
            assert got.shape == (1, n * HOP)
            assert torch.allclose(got, vocode(voc, mel), atol=1e-5, rtol=1e-4), n
    assert sorted(captured) == sorted(graphs.masked_keys())  # each captured once, then replayed


def test_the_published_buckets_give_ten_graphs(model):
    graphs = VocoderGraphs(model.pipeline.vocoder, CUDA)
    keys = graphs.masked_keys()
    assert [k[1] for k in keys[:8]] == list(SENTENCE_FRAME_BUCKETS) and keys[8:] == [
        (2, 1024, MASKED),
        (4, 1024, MASKED),
    ]


def test_a_replayed_output_is_copied_before_the_next_replay(model, captured):  # noqa: F811
    # two groups of windows replay the same graph: the first group's audio must not be overwritten
    voc = model.pipeline.vocoder
    graphs = VocoderGraphs(voc, CUDA, sentence_buckets=(32, 64), max_row_frames=128)  # 2 rows a call
    with torch.inference_mode():
        mel = _mel(400, seed=9)
        assert torch.allclose(graphs.vocode_mel(mel), vocode(voc, mel), atol=1e-5, rtol=1e-4)
    assert (2, 64, MASKED) in captured


def test_activation_kernel_change_drops_the_masked_graphs(model, captured):  # noqa: F811
    voc = model.pipeline.vocoder
    graphs = VocoderGraphs(voc, CUDA, sentence_buckets=(32, 64), max_row_frames=256)
    with torch.inference_mode():
        graphs.vocode_mel(_mel(20, seed=1))
        kernel = voc.activation_post.kernel
        previous = voc.set_activation_kernel(lambda *args: kernel(*args))
        try:
            graphs.vocode_mel(_mel(20, seed=1))
        finally:
            voc.set_activation_kernel(previous)
    assert captured == [(1, 32, MASKED), (1, 32, MASKED)]


def test_sentence_with_graphs_equals_eager(model, reference_wav, captured, monkeypatch):  # noqa: F811
    pipe = model.pipeline
    graphs = AcousticGraphs(pipe.sovits.cfm.estimator, pipe.vocoder, "lazy", CUDA)
    fast = Pipeline(
        pipe.frontend, pipe.hubert, pipe.bert, pipe.t2s, pipe.sovits, pipe.vocoder, pipe.device, pipe.dtype,
        pipe.cache, pipe.model_id, None, graphs,
    )  # fmt: skip
    modes = []
    monkeypatch.setattr(eager_conv, "DEVICE_TYPES", ("cuda", "cpu"))  # the ATen mode's path on the CPU
    routed = eager_conv.aten_convolutions

    def spy(device):
        modes.append(str(device))
        return routed(device)

    monkeypatch.setattr(eager_conv, "aten_convolutions", spy)
    ref = pipe.reference(Voice(reference_wav, REFERENCE_TEXT, "en"))
    sentence = pipe.text_features("A whole sentence, vocoded from graphs.", Language.EN)
    params = GptSovitsParams.build("fast", force_n_tokens=80)
    with_graphs = fast.synthesize_sentence(ref, sentence, params, seed=4)
    eager = pipe.synthesize_sentence(ref, sentence, params, seed=4)
    assert torch.equal(with_graphs.tokens, eager.tokens)
    assert with_graphs.audio.shape == eager.audio.shape
    np.testing.assert_allclose(with_graphs.audio, eager.audio, rtol=0, atol=1e-4)
    assert {k for k in captured if len(k) == 3} and {k for k in captured if len(k) == 2}  # vocoder, CFM
    assert modes, "the encoder ran inside aten_convolutions"


# -- GPU ----------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_cuda_whole_mels_equal_one_shot_vocoding(tiny_set, dtype):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    model = load(tiny_set, device="cuda", dtype=dtype, cuda_graph_preset="full")
    graphs, voc = model.pipeline.acoustic_graphs, model.pipeline.vocoder
    assert len([k for k in graphs.vocoder.captured if len(k) == 3]) == 10  # full: every masked graph at load
    tol = 5e-3 if dtype == torch.float32 else 3e-2  # fp32: cuDNN may use TF32 (as the row graphs' bound)
    with torch.inference_mode():
        for n in (37, 64, 73, 107, 130, 300, 1024, 1025, 2500, 4000):  # 73-130: streamed windows
            mel = (torch.randn(1, 100, n, device="cuda") - 6).to(dtype)
            got, want = graphs.vocode_mel(voc, mel), vocode(voc, mel)
            assert got.shape == want.shape
            assert (got - want).abs().max() <= tol * max(1.0, want.abs().max().item()), n
    assert len([k for k in graphs.vocoder.captured if len(k) == 3]) == 10  # nothing new


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_cuda_masked_triton_activation_equals_reference(dtype):
    if not torch.cuda.is_available() or registry.available(registry.ANTI_ALIAS_SNAKE, "triton", "cuda"):
        pytest.skip("no CUDA GPU with Triton")
    kernel, ref = (
        registry.get(registry.ANTI_ALIAS_SNAKE, "triton"),
        registry.reference(registry.ANTI_ALIAS_SNAKE),
    )
    g = torch.Generator(device="cuda").manual_seed(0)
    for rows, channels, length in ((4, 24, 4096), (3, 768, 700), (2, 1536, 64)):
        x = torch.randn(rows, channels, length, device="cuda", generator=g)
        up, down = (torch.randn(1, 1, 12, device="cuda", generator=g) for _ in range(2))
        alpha, beta = (0.3 * torch.randn(channels, device="cuda", generator=g) for _ in range(2))
        valid = torch.randint(0, length + 1, (rows,), device="cuda", generator=g, dtype=torch.int32)
        want = ref(x.double(), up.double(), down.double(), alpha.double(), beta.double(), True, valid)
        got = kernel(x.to(dtype), up.to(dtype), down.to(dtype), alpha.to(dtype), beta.to(dtype), True, valid)
        err = (got.double() - want).norm() / want.norm()
        assert err <= (1e-3 if dtype == torch.float32 else 1e-2), (rows, channels, length, err.item())
