"""Full-size v3 acoustic stage on a CUDA GPU: fp16 against fp32 on random real-size weights."""

from __future__ import annotations

import time

import pytest
import torch

from voicehub.models.gpt_sovits.bigvgan import load_bigvgan, make_bigvgan_folder, vocode
from voicehub.models.gpt_sovits.sovits import (
    SAMPLES_PER_TOKEN,
    decode_mel,
    encode_reference,
    load_sovits_v3,
    make_sovits_checkpoint,
)

pytestmark = pytest.mark.gpu


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_full_size_fp16_follows_fp32(tmp_path):
    dev = torch.device("cuda")
    sovits_path = make_sovits_checkpoint(tmp_path / "s2Gv3.pth", "full", seed=0)
    assert 700e6 < sovits_path.stat().st_size < 800e6  # s2Gv3.pth is ~769 MB
    voc_dir = make_bigvgan_folder(tmp_path / "bigvgan", "full", seed=0)
    g = torch.Generator().manual_seed(0)
    ref_codes = torch.randint(0, 1024, (1, 1, 100), generator=g)  # 4 s reference
    ref_phones = torch.randint(1, 732, (1, 40), generator=g)
    ref_spec = torch.rand(1, 1025, 200, generator=g)
    ref_mel = torch.randn(1, 100, 380, generator=g) - 6
    codes = torch.randint(0, 1024, (1, 1, 76), generator=g)  # ~3 s of speech
    phones = torch.randint(1, 732, (1, 50), generator=g)
    results = {}
    for dtype in (torch.float32, torch.float16):
        sovits = load_sovits_v3(sovits_path).to(dev, dtype)
        vocoder = load_bigvgan(voc_dir).to(dev, dtype)
        args = [t.to(dev) for t in (ref_codes, ref_phones)] + [t.to(dev, dtype) for t in (ref_spec, ref_mel)]
        prompt = encode_reference(sovits, *args)
        noise_gen = torch.Generator(dev).manual_seed(1)
        mel = decode_mel(sovits, prompt, codes.to(dev), phones.to(dev), 4, generator=noise_gen)
        audio = vocode(vocoder, mel)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        decode_mel(
            sovits, prompt, codes.to(dev), phones.to(dev), 4, generator=torch.Generator(dev).manual_seed(1)
        )
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        vocode(vocoder, mel)
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        print(
            f"{dtype}: eager decode_mel 4 steps {1e3 * (t1 - t0):.1f} ms, BigVGAN {1e3 * (t2 - t1):.1f} ms for 3.04 s"
        )
        assert audio.shape == (1, 76 * SAMPLES_PER_TOKEN) and torch.isfinite(audio).all()
        results[dtype] = (prompt.ge, mel, audio)
        del sovits, vocoder
    (ge32, mel32, _), (ge16, mel16, _) = results[torch.float32], results[torch.float16]
    print(f"fp16 vs fp32 rel. L2: style {_rel(ge16, ge32):.2e}, mel {_rel(mel16, mel32):.2e}")
    assert _rel(ge16, ge32) < 1e-2 and _rel(mel16, mel32) < 5e-2
    # Same mel through both vocoder precisions isolates BigVGAN's fp16 error.
    voc32 = load_bigvgan(voc_dir).to(dev)
    voc16 = load_bigvgan(voc_dir).to(dev, torch.float16)
    a32, a16 = vocode(voc32, mel32), vocode(voc16, mel32)
    print(f"BigVGAN fp16 vs fp32 rel. L2 {_rel(a16, a32):.2e}")
    assert _rel(a16, a32) < 2e-2
