"""SoVITS v3 files: upstream key lists, strict loading, version headers, wrong kinds and versions."""

from __future__ import annotations

import io
import json
import sys
import types
from pathlib import Path

import pytest
import torch

from voicehub.errors import CheckpointError
from voicehub.models.gpt_sovits.sovits import load_sovits_v3, make_sovits_checkpoint, read_sovits_file
from voicehub.models.gpt_sovits.sovits.config import SoVITSV3Arch
from voicehub.models.gpt_sovits.sovits.make import lora_file_layout
from voicehub.models.gpt_sovits.sovits.model import SynthesizerV3
from voicehub.models.gpt_sovits.sovits.strict import file_layout

KEYS = Path(__file__).parent / "data" / "upstream_keys"


def _upstream(name: str) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v) for k, v in json.loads((KEYS / name).read_text())["keys"].items()}


def _full_model_on_meta() -> SynthesizerV3:
    with torch.device("meta"):  # shapes only, no memory
        return SynthesizerV3(SoVITSV3Arch.full())


def _save(obj: dict, path: Path, header: bytes | None = None) -> Path:
    buf = io.BytesIO()
    torch.save(obj, buf)
    data = buf.getvalue()
    path.write_bytes(header + data[2:] if header else data)
    return path


@pytest.fixture(scope="module")
def tiny_file(tmp_path_factory) -> Path:
    return make_sovits_checkpoint(tmp_path_factory.mktemp("sovits") / "s2Gv3.pth", "tiny", seed=0)


def test_full_layout_equals_upstream_s2gv3_keys():
    assert file_layout(_full_model_on_meta()) == _upstream("sovits_v3.json")


def test_lora_file_layout_equals_upstream_lora_training_keys():
    assert lora_file_layout(_full_model_on_meta(), 8) == _upstream("sovits_v3_lora_r8.json")


def test_arch_is_read_back_from_a_tiny_file(tiny_file):
    model = load_sovits_v3(tiny_file)
    assert model.arch == SoVITSV3Arch.tiny()
    assert all(p.dtype == torch.float32 for p in model.parameters())


def test_missing_tensor_is_named(tiny_file, tmp_path):
    ckpt = torch.load(tiny_file, weights_only=True)
    del ckpt["weight"]["wns1.proj.bias"]
    bad = _save(ckpt, tmp_path / "missing.pth")
    with pytest.raises(CheckpointError, match=r"missing: wns1\.proj\.bias") as err:
        load_sovits_v3(bad)
    assert str(bad) in str(err.value)


def test_misshaped_and_unexpected_tensors_are_named(tiny_file, tmp_path):
    ckpt = torch.load(tiny_file, weights_only=True)
    ckpt["weight"]["linear_mel.bias"] = torch.zeros(7, dtype=torch.half)
    ckpt["weight"]["enc_q.pre.weight"] = torch.zeros(1, dtype=torch.half)
    bad = _save(ckpt, tmp_path / "bad.pth")
    with pytest.raises(CheckpointError) as err:
        load_sovits_v3(bad)
    assert "linear_mel.bias (7,)" in str(err.value) and "enc_q.pre.weight" in str(err.value)


def test_version_header_variant_loads_the_same_weights(tiny_file, tmp_path):
    headed = make_sovits_checkpoint(tmp_path / "headed.pth", "tiny", seed=0, version_header=True)
    assert headed.read_bytes()[:2] == b"02" and tiny_file.read_bytes()[:2] == b"PK"
    a, b = load_sovits_v3(tiny_file).state_dict(), load_sovits_v3(headed).state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _v2_weights() -> dict[str, torch.Tensor]:
    # The v2 SynthesizerTrn: a VITS decoder and flow, no CFM.
    return {
        "enc_p.text_embedding.weight": torch.zeros(732, 192, dtype=torch.half),
        "dec.conv_pre.weight": torch.zeros(512, 192, 7, dtype=torch.half),
        "flow.flows.0.pre.weight": torch.zeros(192, 96, 1, dtype=torch.half),
    }


def test_v2_file_is_refused_naming_v2(tmp_path):
    path = _save({"weight": _v2_weights(), "config": {"model": {}}, "info": "x"}, tmp_path / "v2.pth")
    with pytest.raises(CheckpointError, match=r"GPT-SoVITS v2 SoVITS checkpoint; VoiceHub loads v3 only"):
        load_sovits_v3(path)


@pytest.mark.parametrize(("header", "version"), [(b"05", "v2Pro"), (b"06", "v2ProPlus"), (b"04", "v4")])
def test_headed_other_versions_are_refused_by_name(tmp_path, header, version):
    path = _save({"weight": _v2_weights(), "config": {}, "info": "x"}, tmp_path / "x.pth", header)
    with pytest.raises(CheckpointError, match=rf"GPT-SoVITS {version} SoVITS checkpoint"):
        load_sovits_v3(path)


def test_v4_declared_in_config_is_refused(tiny_file, tmp_path):
    ckpt = torch.load(tiny_file, weights_only=True)
    ckpt["config"]["model"]["version"] = "v4"
    with pytest.raises(CheckpointError, match=r"GPT-SoVITS v4 SoVITS"):
        load_sovits_v3(_save(ckpt, tmp_path / "v4.pth"))


def test_gpt_checkpoint_in_sovits_slot_points_to_gpt_path(tmp_path):
    weight = {"model.ar_text_embedding.word_embeddings.weight": torch.zeros(732, 512, dtype=torch.half)}
    path = _save(
        {"weight": weight, "config": {"data": {"max_sec": 54}}, "info": "GPT-e15"}, tmp_path / "s1.ckpt"
    )
    with pytest.raises(CheckpointError, match="gpt_path"):
        load_sovits_v3(path)


def test_non_checkpoint_file_is_refused(tmp_path):
    path = tmp_path / "x.pth"
    path.write_bytes(b"hello world")
    with pytest.raises(CheckpointError, match="neither a PyTorch zip"):
        load_sovits_v3(path)


def test_config_pickled_as_upstream_hparams_is_read(tiny_file, tmp_path, monkeypatch):
    # Trained files pickle upstream's utils.HParams; we read it without upstream's code.
    fake = types.ModuleType("utils")

    class HParams:
        def __init__(self, **kw):
            for k, v in kw.items():
                setattr(self, k, HParams(**v) if isinstance(v, dict) else v)

    HParams.__module__, HParams.__qualname__ = "utils", "HParams"
    fake.HParams = HParams
    monkeypatch.setitem(sys.modules, "utils", fake)
    ckpt = torch.load(tiny_file, weights_only=True)
    ckpt["config"] = HParams(**ckpt["config"])
    path = _save(ckpt, tmp_path / "trained.pth")
    monkeypatch.delitem(sys.modules, "utils")
    assert read_sovits_file(path).config["model"]["hidden_channels"] == SoVITSV3Arch.tiny().hidden_channels
    assert load_sovits_v3(path).arch == SoVITSV3Arch.tiny()


def test_lora_without_base_asks_for_s2gv3(tmp_path):
    lora = make_sovits_checkpoint(tmp_path / "lora.pth", "tiny", seed=1, lora_rank=4)
    assert lora.read_bytes()[:2] == b"03"
    with pytest.raises(CheckpointError, match="s2Gv3.pth"):
        load_sovits_v3(lora, base_path=tmp_path / "absent.pth")


def test_lora_with_a_wrong_rank_factor_is_named(tiny_file, tmp_path):
    lora = make_sovits_checkpoint(tmp_path / "lora.pth", "tiny", seed=1, lora_rank=4)
    data = bytearray(lora.read_bytes())
    data[:2] = b"PK"
    ckpt = torch.load(io.BytesIO(bytes(data)), weights_only=True)
    key = "cfm.base_model.model.estimator.transformer_blocks.1.attn.to_v.lora_A.default.weight"
    ckpt["weight"][key] = torch.zeros(3, 64, dtype=torch.half)
    bad = _save(ckpt, tmp_path / "bad_lora.pth", b"03")
    with pytest.raises(CheckpointError, match=r"transformer_blocks\.1\.attn\.to_v\.lora_A \(3, 64\)"):
        load_sovits_v3(bad, base_path=tiny_file)
