"""Device arguments and the process-wide attention setting of a CUDA load."""

import pytest
import torch

from voicehub.runtime.device import disable_cudnn_attention, resolve_device, resolve_dtype


def test_device_and_dtype_arguments():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_dtype("fp16", torch.float32) is torch.float16
    assert resolve_dtype(None, torch.float32) is torch.float32
    with pytest.raises(ValueError, match="unknown device"):
        resolve_device("gpu!")
    with pytest.raises(ValueError, match="unknown dtype"):
        resolve_dtype("float8", torch.float32)


def test_cudnn_attention_is_left_out_of_sdpa():
    before = torch.backends.cuda.cudnn_sdp_enabled()
    try:
        torch.backends.cuda.enable_cudnn_sdp(True)
        assert disable_cudnn_attention() == {"cudnn_attention": False}
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        # the other backends stay as they were
        assert torch.backends.cuda.flash_sdp_enabled() and torch.backends.cuda.mem_efficient_sdp_enabled()
    finally:
        torch.backends.cuda.enable_cudnn_sdp(before)
