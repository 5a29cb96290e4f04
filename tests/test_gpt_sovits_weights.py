"""Loading on the meta device (weights.py) gives exactly what building for real, loading and `.to` gave."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from voicehub.errors import CheckpointError
from voicehub.models.checkpoints import load_strict, rename_weight_norm
from voicehub.models.gpt_sovits.bert import BERT_LAYER, BertFeatureExtractor, encoder_state, make_bert_folder
from voicehub.models.gpt_sovits.bert_model import BertModel
from voicehub.models.gpt_sovits.bigvgan import load_bigvgan, make_bigvgan_folder
from voicehub.models.gpt_sovits.bigvgan.checkpoint import CONFIG_FILE, WEIGHTS_FILE
from voicehub.models.gpt_sovits.bigvgan.model import BigVGAN, BigVGANConfig
from voicehub.models.gpt_sovits.hubert_model import HubertModel
from voicehub.models.gpt_sovits.sovits import load_sovits_v3, make_sovits_checkpoint, read_sovits_file
from voicehub.models.gpt_sovits.sovits.config import SoVITSV3Arch
from voicehub.models.gpt_sovits.sovits.model import SynthesizerV3
from voicehub.models.gpt_sovits.sovits.strict import load_weight_normed
from voicehub.models.gpt_sovits.ssl import (
    HUBERT_OPTIONAL,
    HubertEncoder,
    find_weights,
    make_hubert_folder,
    read_weights,
)
from voicehub.models.gpt_sovits.weights import assign_strict, check_materialized, meta_device, rebuild_missing

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


def test_an_optional_tensor_the_file_lacks_is_built_by_its_builder():
    module = _meta()
    state = {"lin.weight": torch.randn(2, 3)}
    assign_strict(module, state, "x", device=torch.device("cpu"), dtype=torch.float16, optional=("lin.bias",))
    assert module.lin.bias.is_meta
    builders = {
        ("_Computed", "steps"): lambda b: torch.arange(b.shape[0]),
        ("_Computed", "table"): lambda b: torch.ones(b.shape),
        ("Linear", "bias"): lambda b: torch.zeros(b.shape),
    }
    rebuild_missing(module, builders, torch.device("cpu"), torch.float16)
    check_materialized(module)
    bias = module.lin.bias
    assert isinstance(bias, torch.nn.Parameter) and bias.requires_grad and bias.dtype == torch.float16
    assert torch.equal(bias, torch.zeros(2, dtype=torch.float16))


def test_rebuild_missing_casts_floating_ones_and_refuses_an_unknown_one():
    module = _meta()
    assign_strict(module, _Computed().state_dict(), "x", device=torch.device("cpu"), dtype=torch.float16)
    with pytest.raises(AssertionError, match="table"):
        rebuild_missing(module, {("_Computed", "steps"): lambda b: torch.arange(b.shape[0])}, torch.device("cpu"), torch.float16)  # fmt: skip
    builders = {
        ("_Computed", "steps"): lambda b: torch.arange(b.shape[0]),
        ("_Computed", "table"): lambda b: torch.ones(b.shape),
    }
    rebuild_missing(module, builders, torch.device("cpu"), torch.float16)
    check_materialized(module)
    assert module.steps.dtype == torch.int64 and torch.equal(module.steps, torch.arange(4))
    assert module.table.dtype == torch.float16


@pytest.fixture(scope="module")
def hubert_folder(tmp_path_factory) -> Path:
    return make_hubert_folder(tmp_path_factory.mktemp("pm") / "chinese-hubert-base", "tiny", seed=3)


@pytest.fixture(scope="module")
def bert_folder(tmp_path_factory) -> Path:
    return make_bert_folder(tmp_path_factory.mktemp("pm") / "chinese-roberta-wwm-ext-large", "tiny", seed=5)


def _config(folder: Path) -> dict:
    return json.loads((folder / "config.json").read_text())


def _hubert_built_for_real(folder: Path, dtype: torch.dtype) -> torch.nn.Module:
    model = HubertModel(_config(folder))
    state = rename_weight_norm(read_weights(find_weights(folder)), set(model.state_dict()))
    load_strict(model, state, "x", optional=HUBERT_OPTIONAL)
    return model.to(dtype=dtype).eval()


@pytest.mark.parametrize("dtype", (torch.float32, torch.float16))
def test_hubert_equals_a_model_built_for_real(hubert_folder, dtype):
    got = HubertEncoder.from_folder(hubert_folder, "cpu", dtype).model
    check_materialized(got)
    assert_same_module(got, _hubert_built_for_real(hubert_folder, dtype))


@pytest.mark.parametrize("dtype", (torch.float32, torch.float16))
def test_bert_equals_a_model_built_for_real(bert_folder, dtype):
    want = BertModel(_config(bert_folder))
    load_strict(want, encoder_state(read_weights(find_weights(bert_folder))), "x")
    want.keep_layers(BERT_LAYER)  # as the extractor keeps them
    got = BertFeatureExtractor.from_folder(bert_folder, "cpu", dtype).model
    check_materialized(got)
    assert_same_module(got, want.to(dtype=dtype).eval())


def test_hubert_file_without_masked_spec_embed_loads(hubert_folder, tmp_path):
    folder = tmp_path / "chinese-hubert-base"
    shutil.copytree(hubert_folder, folder)
    state = torch.load(folder / "pytorch_model.bin")
    del state["masked_spec_embed"]
    torch.save(state, folder / "pytorch_model.bin")
    model = HubertEncoder.from_folder(folder, "cpu", torch.float16).model
    # rebuilt as zeros (it fills masked frames in training only)
    check_materialized(model)
    assert model.masked_spec_embed.dtype == torch.float16
    del state["feature_projection.projection.bias"]
    torch.save(state, folder / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match=r"missing: feature_projection\.projection\.bias"):
        HubertEncoder.from_folder(folder, "cpu", torch.float16)


def test_meta_device_skips_random_init_on_meta_tensors_only():
    real = torch.zeros(4)
    with meta_device():
        layer = torch.nn.Linear(3, 2)
        torch.nn.init.normal_(real)  # a real tensor is still initialised
    assert layer.weight.is_meta and layer.weight.shape == (2, 3)
    assert not torch.equal(real, torch.zeros(4))
