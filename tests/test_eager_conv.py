"""aten_convolutions: 1-d convolutions of this thread through ATen with cuDNN off, same results."""

from __future__ import annotations

import threading

import pytest
import torch
import torch.nn.functional as F

from voicehub.runtime import eager_conv
from voicehub.runtime.eager_conv import AtenConvolutions, aten_convolutions


@pytest.fixture
def calls(monkeypatch):
    """Each torch._convolution call's cudnn_enabled argument, from any thread."""
    seen: list[bool] = []
    real = torch._convolution

    def spy(*args):
        seen.append(args[11])
        return real(*args)

    monkeypatch.setattr(eager_conv.torch, "_convolution", spy)
    return seen


@pytest.mark.parametrize(
    "cin,cout,k,stride,padding,dilation,groups",
    [
        (8, 12, 1, 1, 0, 1, 1),
        (8, 12, 5, 1, 4, 2, 1),
        (8, 8, 7, 1, 3, 1, 8),
        (8, 12, 4, 2, 1, 1, 4),
        (6, 6, 11, 1, 25, 5, 1),
    ],
)
def test_conv1d_equals_torch(calls, cin, cout, k, stride, padding, dilation, groups):
    g = torch.Generator().manual_seed(k)
    x = torch.randn(2, cin, 37, generator=g)
    w, b = torch.randn(cout, cin // groups, k, generator=g), torch.randn(cout, generator=g)
    want = F.conv1d(x, w, b, stride, padding, dilation, groups)
    with AtenConvolutions():
        got = F.conv1d(x, w, b, stride=stride, padding=padding, dilation=dilation, groups=groups)
        unbatched = F.conv1d(x[0], w, None, stride, padding, dilation, groups)
    assert calls == [False, False]
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(unbatched, F.conv1d(x[0], w, None, stride, padding, dilation, groups))


@pytest.mark.parametrize("stride,padding,output_padding,groups", [(4, 2, 0, 1), (2, 1, 1, 2), (3, 0, 2, 1)])
def test_conv_transpose1d_equals_torch(calls, stride, padding, output_padding, groups):
    g = torch.Generator().manual_seed(stride)
    x = torch.randn(2, 8, 19, generator=g)
    w, b = torch.randn(8, 6 // groups, 2 * stride, generator=g), torch.randn(6, generator=g)
    want = F.conv_transpose1d(x, w, b, stride, padding, output_padding, groups)
    with AtenConvolutions():
        got = F.conv_transpose1d(x, w, b, stride, padding, output_padding, groups)
    assert calls == [False]
    torch.testing.assert_close(got, want)


def test_modules_and_string_padding(calls):
    torch.manual_seed(0)
    conv, up = torch.nn.Conv1d(4, 6, 3, padding=1), torch.nn.ConvTranspose1d(6, 4, 8, 4, padding=2)
    same = torch.nn.Conv1d(4, 4, 3, padding="same")
    x = torch.randn(1, 4, 20)
    want = up(conv(x)), same(x)
    calls.clear()
    with AtenConvolutions():
        got = up(conv(x)), same(x)
    assert calls == [False, False]  # the "same" padding ran as it is, not through the mode
    torch.testing.assert_close(got, want)


def test_this_thread_only_and_cpu_is_unchanged(calls):
    x, w = torch.randn(1, 2, 9), torch.randn(2, 2, 3)
    inside, done = threading.Event(), threading.Event()

    def other():
        inside.wait(5)
        F.conv1d(x, w)
        done.set()

    t = threading.Thread(target=other)
    t.start()
    with AtenConvolutions():
        inside.set()
        assert done.wait(5)
    t.join()
    assert calls == []  # the other thread's conv1d did not reach the mode
    with aten_convolutions("cpu"):
        F.conv1d(x, w)
    assert calls == []


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_encoder_without_cudnn(tmp_path):
    """On CUDA: the eager SoVITS encoder under `without_cudnn` runs no cuDNN convolution (profiled) and
    matches its cuDNN output (fp32 within 1e-4 rel. L2; TF32 off for both)."""
    from voicehub.models.gpt_sovits.sovits import load_sovits_v3, make_sovits_checkpoint
    from voicehub.runtime.eager_conv import without_cudnn

    dev = torch.device("cuda")
    sovits = load_sovits_v3(make_sovits_checkpoint(tmp_path / "s2.pth", "tiny", seed=0)).to(dev).eval()
    a = sovits.arch
    g = torch.Generator(dev).manual_seed(0)
    codes = torch.randint(0, a.n_bins, (1, 1, 41), device=dev, generator=g)
    text = torch.randint(1, a.n_symbols, (1, 23), device=dev, generator=g)
    ge = torch.randn(1, a.gin_channels, 1, device=dev, generator=g)
    saved = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    try:
        with torch.inference_mode():
            want = sovits.decode_encp(codes, text, ge)
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                got = without_cudnn(sovits.decode_encp)(codes, text, ge)
    finally:
        torch.backends.cudnn.allow_tf32 = saved
    ops = {e.key for e in prof.key_averages()}
    assert not any("cudnn" in op for op in ops), sorted(ops)
    assert any("convolution" in op for op in ops)
    rel = float((got - want).norm() / want.norm())
    assert rel <= 1e-4, rel
