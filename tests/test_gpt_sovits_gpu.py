"""GPT-SoVITS v3 pipeline on a CUDA GPU (deselected in CI; the lead runs these on the H200).

- tiny set: CUDA fp32 gives the CPU's greedy tokens and close audio; fp16 runs and stays finite; a
  reference's convolutions run without cuDNN;
- full set (real sizes, random weights, made on the GPU machine): one forced 500-token sentence, timed.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
from gpt_sovits_fixtures import REFERENCE_TEXT

from voicehub.models.gpt_sovits import Voice, load
from voicehub.models.gpt_sovits.params import GptSovitsParams
from voicehub.models.gpt_sovits.sovits import SAMPLES_PER_TOKEN
from voicehub.text.options import Language

pytestmark = pytest.mark.gpu
GREEDY = dict(top_k=1, top_p=1.0, temperature=1.0, repetition_penalty=1.0, speed=1.0, max_new_tokens=40)


@pytest.fixture(scope="module")
def cuda():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    return "cuda"


def _sentence(model, voice, **params):
    pipe = model.pipeline
    sentence = pipe.text_features("A sentence for the GPU.", Language.EN)
    return pipe.synthesize_sentence(
        pipe.reference(voice), sentence, GptSovitsParams.build(None, **params), seed=0
    )


def test_cuda_fp32_equals_cpu(cuda, tiny_set, reference_wav):
    voice = Voice(reference_wav, REFERENCE_TEXT, "en")
    cpu = _sentence(load(tiny_set), voice, **GREEDY)
    gpu_model = load(tiny_set, device=cuda, dtype="float32")
    gpu = _sentence(gpu_model, voice, **GREEDY)
    assert torch.equal(cpu.tokens, gpu.tokens.cpu())
    # The CFM noise comes from a CUDA generator on the GPU, so compare the token path and the lengths;
    # the acoustic stage's CPU/GPU equality is held by the SoVITS tests with injected noise.
    assert len(cpu.audio) == len(gpu.audio)


def test_cuda_fp16_runs(cuda, tiny_set, reference_wav):
    model = load(tiny_set, device=cuda)  # float16 by default on CUDA
    assert model.dtype == torch.float16
    out = model.generate("Half precision.", voice=Voice(reference_wav, REFERENCE_TEXT, "en"), seed=0,
                         force_n_tokens=16, speed=1.0, how_to_cut="none")  # fmt: skip
    assert out.audio.shape == (16 * SAMPLES_PER_TOKEN,) and np.isfinite(out.audio).all()


def test_cuda_reference_builds_no_cudnn_plan(cuda, tiny_set, reference_wav):
    """A voice's reference (a length seen once) runs its convolutions through ATen, none through cuDNN
    (its attention may still be cuDNN's: only the convolutions are routed)."""
    pipe = load(tiny_set, device=cuda).pipeline
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        ref = pipe.reference(Voice(reference_wav, REFERENCE_TEXT, "en"))
    ops = {e.key for e in prof.key_averages()}
    assert not any("cudnn_convolution" in op for op in ops), sorted(ops)
    assert any("convolution" in op for op in ops)
    assert torch.isfinite(ref.acoustic.fea).all() and len(ref.prompt_tokens) > 0


def test_full_size_set_500_tokens(cuda, tmp_path_factory, reference_wav):
    from voicehub.models.gpt_sovits.make_checkpoint import make_checkpoint_set, margins_report

    made = make_checkpoint_set(tmp_path_factory.mktemp("full"), "full", seed=0, margin_tokens=100)
    print(margins_report(made.margins))
    model = load(made.out, device=cuda)
    voice = Voice(reference_wav, REFERENCE_TEXT, "en")
    model.generate("Warm up.", voice=voice, seed=0, force_n_tokens=20, how_to_cut="none")
    torch.cuda.synchronize()
    start = time.perf_counter()
    out = model.generate(
        "A long sentence.", voice=voice, seed=0, force_n_tokens=500, speed=1.0, how_to_cut="none"
    )
    torch.cuda.synchronize()
    print(f"eager full-size: 500 tokens -> {out.duration:.1f} s audio in {time.perf_counter() - start:.2f} s")
    assert out.audio.shape == (500 * SAMPLES_PER_TOKEN,) and np.isfinite(out.audio).all()
