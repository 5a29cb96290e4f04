"""Loading on the meta device (weights.py) gives exactly what building for real, loading and `.to` gave."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from voicehub.errors import CheckpointError
from voicehub.models.gpt_sovits.bigvgan import load_bigvgan, make_bigvgan_folder
from voicehub.models.gpt_sovits.bigvgan.checkpoint import CONFIG_FILE, WEIGHTS_FILE
from voicehub.models.gpt_sovits.bigvgan.model import BigVGAN, BigVGANConfig
from voicehub.models.gpt_sovits.sovits import load_sovits_v3, make_sovits_checkpoint, read_sovits_file
from voicehub.models.gpt_sovits.sovits.config import SoVITSV3Arch
from voicehub.models.gpt_sovits.sovits.model import SynthesizerV3
from voicehub.models.gpt_sovits.sovits.strict import load_weight_normed
from voicehub.models.gpt_sovits.weights import assign_strict, check_materialized, rebuild_buffers

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _tensors(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    # parameters and every buffer, the non-persistent ones too
    return dict([*module.named_parameters(), *module.named_buffers()])


def assert_same_module(got: torch.nn.Module, want: torch.nn.Module) -> None:
    a, b = _tensors(got), _tensors(want)
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].dtype == b[name].dtype, name
        assert a[name].requires_grad == b[name].requires_grad, name
        assert torch.equal(a[name], b[name]), name  # bit-equal: the same casts in the same order
    assert got.training == want.training


@pytest.fixture(scope="module")
def sovits_file(tmp_path_factory) -> Path:
    return make_sovits_checkpoint(tmp_path_factory.mktemp("w") / "s2Gv3.pth", "tiny", seed=0)


@pytest.fixture(scope="module")
def bigvgan_folder(tmp_path_factory) -> Path:
    return make_bigvgan_folder(tmp_path_factory.mktemp("bigvgan"), "tiny", seed=0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_sovits_equals_a_float32_load_then_to(sovits_file, dtype):
    f = read_sovits_file(sovits_file)
    shapes = {k: tuple(t.shape) for k, t in f.weight.items()}
    want = SynthesizerV3(SoVITSV3Arch.from_checkpoint(f.config, shapes, "x"))
    load_weight_normed(want, f.weight, "x")
    want = want.eval().to(dtype=dtype)
    got = load_sovits_v3(sovits_file, dtype=dtype)
    check_materialized(got)
    assert_same_module(got, want)


@pytest.mark.parametrize("dtype", DTYPES)
def test_bigvgan_equals_a_float32_load_then_to(bigvgan_folder, dtype):
    want = BigVGAN(BigVGANConfig.from_json(json.loads((bigvgan_folder / CONFIG_FILE).read_text()), "x"))
    load_weight_normed(want, torch.load(bigvgan_folder / WEIGHTS_FILE)["generator"], "x")
    want = want.eval().to(dtype=dtype)
    got = load_bigvgan(bigvgan_folder, dtype=dtype)
    check_materialized(got)
    assert_same_module(got, want)


class _Computed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 2)
        self.register_buffer("steps", torch.arange(4), persistent=False)
        self.register_buffer("table", torch.ones(2, 3), persistent=False)


def _meta() -> _Computed:
    with torch.device("meta"):
        return _Computed()


def test_assign_strict_names_a_missing_and_a_misshaped_tensor():
    with pytest.raises(CheckpointError, match=r"file\.pt .*missing: lin\.bias.*mis-shaped: lin\.weight"):
        assign_strict(_meta(), {"lin.weight": torch.zeros(3, 2)}, "file.pt", device=torch.device("cpu"), dtype=torch.float32)  # fmt: skip


def test_assign_strict_casts_once_and_keeps_parameters():
    state = {"lin.weight": torch.randn(2, 3, dtype=torch.float16), "lin.bias": torch.randn(2)}
    module = _meta()
    assign_strict(module, state, "x", device=torch.device("cpu"), dtype=torch.float32, optional=("lin.bias",))
    assert isinstance(module.lin.weight, torch.nn.Parameter) and module.lin.weight.requires_grad
    assert module.lin.weight.dtype == torch.float32 and torch.equal(
        module.lin.weight, state["lin.weight"].float()
    )
    # the file's tensor is copied, never shared (a memory-mapped file stays read-only)
    assert module.lin.bias.data_ptr() != state["lin.bias"].data_ptr()
    absent = _meta()
    assign_strict(absent, {"lin.weight": state["lin.weight"]}, "x", device=torch.device("cpu"), dtype=torch.float32, optional=("lin.bias",))  # fmt: skip
    assert torch.equal(absent.lin.bias, torch.zeros(2))


def test_rebuild_buffers_casts_floating_ones_and_refuses_an_unknown_one():
    module = _meta()
    assign_strict(module, _Computed().state_dict(), "x", device=torch.device("cpu"), dtype=torch.float16)
    with pytest.raises(AssertionError, match="table"):
        rebuild_buffers(module, {("_Computed", "steps"): lambda b: torch.arange(b.shape[0])}, torch.device("cpu"), torch.float16)  # fmt: skip
    builders = {
        ("_Computed", "steps"): lambda b: torch.arange(b.shape[0]),
        ("_Computed", "table"): lambda b: torch.ones(b.shape),
    }
    rebuild_buffers(module, builders, torch.device("cpu"), torch.float16)
    check_materialized(module)
    assert module.steps.dtype == torch.int64 and torch.equal(module.steps, torch.arange(4))
    assert module.table.dtype == torch.float16
