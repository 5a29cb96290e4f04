"""GPT (T2S) checkpoints: upstream key compatibility, the official layout, strict loading, wrong files."""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path

import pytest
import torch

from voicehub.errors import CheckpointError, ModelNotFoundError
from voicehub.models.gpt_sovits.t2s.checkpoint import load_t2s, read_t2s_checkpoint
from voicehub.models.gpt_sovits.t2s.config import FULL_V3, TINY, T2SConfig
from voicehub.models.gpt_sovits.t2s.make_checkpoint import make_t2s_checkpoint, random_state_dict
from voicehub.models.gpt_sovits.t2s.model import T2SModel, checkpoint_state_dict

KEYS = Path(__file__).parent / "data" / "upstream_keys" / "t2s_v3.json"


class HParams:  # stands in for upstream's utils.HParams, the config object of SoVITS .pth files
    def __init__(self, **kw):
        self.__dict__.update(kw)


@pytest.fixture(scope="module")
def tiny_ckpt(tmp_path_factory) -> Path:
    return make_t2s_checkpoint(tmp_path_factory.mktemp("t2s") / "tiny.ckpt", "tiny", seed=0)


def _rewrite(src: Path, dst: Path, edit) -> Path:
    ckpt = torch.load(src, weights_only=True)
    edit(ckpt)
    torch.save(ckpt, dst)
    return dst


def test_full_model_has_upstream_keys_and_shapes():
    doc = json.loads(KEYS.read_text())
    assert doc["upstream_commit"] and doc["command"]
    with torch.device("meta"):
        ours = {k: list(v.shape) for k, v in checkpoint_state_dict(T2SModel(FULL_V3)).items()}
    assert sorted(ours) == sorted(doc["keys"])
    assert ours == doc["keys"]


def test_full_config_round_trips_through_upstream_layout():
    assert T2SConfig.from_checkpoint_config(FULL_V3.to_checkpoint_config()) == FULL_V3
    assert FULL_V3.early_stop_num == 50 * 54


def test_tiny_checkpoint_has_official_layout(tiny_ckpt):
    ckpt = torch.load(tiny_ckpt, weights_only=True)
    assert set(ckpt) == {"weight", "config", "info"}
    assert all(k.startswith("model.") for k in ckpt["weight"])
    assert {v.dtype for v in ckpt["weight"].values()} == {torch.float16}
    model_cfg = ckpt["config"]["model"]
    assert (model_cfg["vocab_size"], model_cfg["phoneme_vocab_size"], model_cfg["EOS"]) == (1025, 732, 1024)
    assert isinstance(ckpt["info"], str)


def test_architecture_comes_from_config_not_file_name(tiny_ckpt, tmp_path):
    misleading = tmp_path / "s1v3-full-24layer.ckpt"
    misleading.write_bytes(tiny_ckpt.read_bytes())
    model, config = load_t2s(misleading)
    assert config == TINY
    assert len(model.h.layers) == TINY.n_layer
    assert model.ar_predict_layer.weight.dtype == torch.float32


def test_loaded_weights_equal_file(tiny_ckpt):
    model, _ = load_t2s(tiny_ckpt, dtype="float16")
    weight, _, _ = read_t2s_checkpoint(tiny_ckpt)
    for name, tensor in checkpoint_state_dict(model).items():
        assert torch.equal(tensor, weight[name]), name


def test_random_weights_are_seeded():
    a, b, c = random_state_dict(TINY, 1), random_state_dict(TINY, 1), random_state_dict(TINY, 2)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["model.ar_predict_layer.weight"], c["model.ar_predict_layer.weight"])


def test_missing_tensor_is_named(tiny_ckpt, tmp_path):
    name = "model.h.layers.1.linear2.bias"
    bad = _rewrite(tiny_ckpt, tmp_path / "missing.ckpt", lambda c: c["weight"].pop(name))
    with pytest.raises(CheckpointError, match=r"missing: model\.h\.layers\.1\.linear2\.bias") as err:
        load_t2s(bad)
    assert str(bad) in str(err.value)


def test_misshaped_tensor_is_named(tiny_ckpt, tmp_path):
    name = "model.h.layers.0.self_attn.in_proj_weight"

    def edit(c):
        c["weight"][name] = torch.zeros(3 * 64, 65, dtype=torch.float16)

    bad = _rewrite(tiny_ckpt, tmp_path / "misshaped.ckpt", edit)
    with pytest.raises(CheckpointError, match=r"mis-shaped: model\.h\.layers\.0\.self_attn\.in_proj_weight"):
        load_t2s(bad)


def test_unexpected_tensor_is_named(tiny_ckpt, tmp_path):
    def edit(c):
        c["weight"]["model.h.layers.2.norm1.weight"] = torch.ones(64, dtype=torch.float16)

    bad = _rewrite(tiny_ckpt, tmp_path / "extra.ckpt", edit)
    with pytest.raises(CheckpointError, match=r"unexpected: model\.h\.layers\.2\.norm1\.weight"):
        load_t2s(bad)


def test_sovits_file_with_version_header_is_sent_to_sovits_path(tmp_path):
    buf = io.BytesIO()
    torch.save({"weight": {"enc_p.proj.weight": torch.zeros(2)}, "config": {}, "info": "x"}, buf)
    path = tmp_path / "my_voice_e8_s200.pth"
    path.write_bytes(b"03" + buf.getvalue()[2:])  # upstream's my_save2 for a v3 LoRA
    with pytest.raises(CheckpointError, match=r"SoVITS.*v3 LoRA.*sovits_path"):
        load_t2s(path)


def test_sovits_file_with_hparams_config_is_sent_to_sovits_path(tmp_path):
    path = tmp_path / "s2Gv3.pth"
    torch.save({"weight": {"enc_p.proj.weight": torch.zeros(2)}, "config": HParams(a=1), "info": "x"}, path)
    with pytest.raises(CheckpointError, match=r"SoVITS.*sovits_path"):
        load_t2s(path)


def test_sovits_weights_with_plain_config_are_sent_to_sovits_path(tmp_path):
    path = tmp_path / "plain.pth"
    torch.save({"weight": {"enc_p.proj.weight": torch.zeros(2), "cfm.x": torch.zeros(1)}}, path)
    with pytest.raises(CheckpointError, match=r"SoVITS.*sovits_path"):
        load_t2s(path)


def test_lightning_training_checkpoint_points_to_export(tmp_path):
    path = tmp_path / "epoch=14-step=300.ckpt"
    torch.save({"state_dict": {"model.bert_proj.bias": torch.zeros(2)}, "epoch": 14}, path)
    with pytest.raises(CheckpointError, match=r"GPT_weights_v3"):
        load_t2s(path)


@pytest.mark.parametrize("content", [b"", b"not a checkpoint at all", b"PK\x03\x04 truncated zip"])
def test_unreadable_file_raises_checkpoint_error(tmp_path, content):
    path = tmp_path / "broken.ckpt"
    path.write_bytes(content)
    with pytest.raises(CheckpointError, match="broken.ckpt"):
        load_t2s(path)


def test_truncated_real_checkpoint_raises_checkpoint_error(tiny_ckpt, tmp_path):
    path = tmp_path / "cut.ckpt"
    path.write_bytes(tiny_ckpt.read_bytes()[:50_000])
    with pytest.raises(CheckpointError, match="cut.ckpt"):
        load_t2s(path)


def test_missing_file_raises_not_found(tmp_path):
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        load_t2s(tmp_path / "nope.ckpt")


def test_config_without_model_section_is_rejected(tiny_ckpt, tmp_path):
    bad = _rewrite(tiny_ckpt, tmp_path / "noconf.ckpt", lambda c: c["config"].pop("model"))
    with pytest.raises(CheckpointError, match=r"no `model` section"):
        load_t2s(bad)


def test_v1_symbol_table_is_rejected(tmp_path):
    v1 = dataclasses.replace(TINY, phoneme_vocab_size=512)
    path = tmp_path / "v1.ckpt"
    torch.save({"weight": random_state_dict(v1, 0), "config": v1.to_checkpoint_config(), "info": "v1"}, path)
    with pytest.raises(CheckpointError, match=r"512 phoneme symbols.*v1"):
        load_t2s(path)
    model, config = load_t2s(path, phoneme_vocab_size=None)  # the architecture itself loads
    assert model.ar_text_embedding.word_embeddings.weight.shape == (512, 64)


def test_invalid_architecture_is_a_checkpoint_error(tiny_ckpt, tmp_path):
    bad = _rewrite(tiny_ckpt, tmp_path / "eos.ckpt", lambda c: c["config"]["model"].update(EOS=7))
    with pytest.raises(CheckpointError, match="EOS"):
        load_t2s(bad)
