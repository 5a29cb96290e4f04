"""Loading Piper voices: detection, resolution, strict ONNX and .ckpt loading, and clear errors."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from voicehub.errors import CheckpointError, ModelNotFoundError
from voicehub.models.registry import find_family, get_family
from voicehub.models.vits import FAMILY, installed, load, resolve
from voicehub.models.vits.config import VitsArchitecture
from voicehub.models.vits.model import VitsSynthesizer

# Tensors Piper's training keeps weight-normalised (torch.nn.utils.weight_norm: weight_g / weight_v).
WEIGHT_NORMED = re.compile(
    r"(dec\.ups\.\d+|dec\.resblocks\.\d+\.convs\d?\.\d+|\.enc\.(in_layers|res_skip_layers)\.\d+|cond_layer)$"
)
TINY = VitsArchitecture(
    n_vocab=40,
    hidden_channels=16,
    inter_channels=8,
    filter_channels=24,
    n_heads=2,
    n_layers=2,
    kernel_size=3,
    window_size=4,
    heads_share=True,
    resblock="1",
    resblock_kernel_sizes=(3, 5),
    resblock_dilation_sizes=((1, 3, 5), (1, 3, 5)),
    upsample_rates=(4, 4),
    upsample_kernel_sizes=(8, 8),
    upsample_initial_channel=16,
    flow_n_flows=2,
    flow_hidden_channels=16,
    flow_kernel_size=5,
    flow_dilation_rate=1,
    flow_n_layers=2,
    use_sdp=True,
    dp_filter_channels=16,
    dp_kernel_size=3,
    n_speakers=3,
    gin_channels=8,
)


@pytest.fixture(scope="module")
def joe_files() -> tuple[Path, Path]:
    onnx_path = resolve("en_US-joe-medium")
    return onnx_path, Path(str(onnx_path) + ".json")


@pytest.fixture(scope="module")
def joe(joe_files):
    return load(joe_files[0])


def _voice_dir(tmp_path: Path, joe_files, json_edit=None, onnx_bytes: bytes | None = None) -> Path:
    """A folder with the joe voice (linked, or garbage weights) and its JSON, optionally edited."""
    onnx_path, json_path = joe_files
    target = tmp_path / "voice.onnx"
    if onnx_bytes is None:
        target.symlink_to(onnx_path)
    else:
        target.write_bytes(onnx_bytes)
    data = json.loads(json_path.read_text())
    if json_edit:
        json_edit(data)
    (tmp_path / "voice.onnx.json").write_text(json.dumps(data))
    return target


def test_resolve_and_installed():
    assert "en_US-joe-medium" in installed()
    assert resolve("en_US-joe-medium").is_file()
    assert resolve("no-such-voice") is None
    assert get_family("vits") is FAMILY


def test_detect_by_content(tmp_path, joe_files):
    onnx_path, _ = joe_files
    assert FAMILY.detect(onnx_path) and FAMILY.detect(onnx_path.parent)
    family, path = find_family(onnx_path)
    assert family.model_type == "vits" and path == onnx_path
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "x.onnx").symlink_to(onnx_path)
    assert not FAMILY.detect(bare / "x.onnx")  # no JSON beside it
    (bare / "x.onnx.json").write_text(json.dumps({"audio": {"sample_rate": 22050}}))
    assert not FAMILY.detect(bare / "x.onnx")  # a JSON, but not a Piper voice's


def test_architecture_read_from_the_file(joe):
    a = joe.architecture
    assert (a.hidden_channels, a.filter_channels, a.n_heads, a.n_layers, a.kernel_size) == (192, 768, 2, 6, 3)
    assert a.resblock == "2" and a.resblock_kernel_sizes == (3, 5, 7)
    assert a.resblock_dilation_sizes == ((1, 2), (2, 6), (3, 12))
    assert a.upsample_rates == (8, 8, 4) and a.upsample_kernel_sizes == (16, 16, 8)
    assert (a.upsample_initial_channel, a.n_vocab, a.n_speakers, a.use_sdp) == (256, 256, 1, True)


def test_corrupt_onnx(tmp_path, joe_files):
    path = _voice_dir(tmp_path, joe_files, onnx_bytes=b"this is not a protobuf \x00\xff" * 100)
    with pytest.raises(CheckpointError, match="voice.onnx"):
        load(path)


def test_json_missing_phoneme_id_map(tmp_path, joe_files):
    path = _voice_dir(tmp_path, joe_files, json_edit=lambda d: d.pop("phoneme_id_map"))
    with pytest.raises(CheckpointError, match="phoneme_id_map"):
        load(path, lazy_load=True)  # the JSON is checked even when the weights wait


def test_json_onnx_mismatch(tmp_path, joe_files):
    path = _voice_dir(tmp_path, joe_files, json_edit=lambda d: d.update(num_symbols=300))
    with pytest.raises(CheckpointError, match="num_symbols"):
        load(path)


def test_lazy_load_reads_weights_on_first_use(tmp_path, joe_files):
    path = _voice_dir(tmp_path, joe_files, onnx_bytes=b"garbage")
    model = load(path, lazy_load=True)  # JSON fine: no error yet
    assert model.sample_rate == 22050
    with pytest.raises(CheckpointError, match="voice.onnx"):
        model.generate("Hi.")


def test_unknown_load_option_and_device():
    with pytest.raises(TypeError, match="colour"):
        load(resolve("en_US-joe-medium"), colour="blue", lazy_load=True)
    with pytest.raises(ValueError, match="device"):
        load(resolve("en_US-joe-medium"), device="tpu", lazy_load=True)
    with pytest.raises(ModelNotFoundError):
        load(Path("/no/such/voice.onnx"))


def _piper_ckpt(
    tmp_path: Path, net: VitsSynthesizer, drop: str | None = None, hparams: dict | None = None
) -> Path:
    """Save `net` the way Piper's Lightning training does: model_g. prefix, weight norm, extra modules."""
    state: dict[str, torch.Tensor] = {}
    for key, value in net.state_dict().items():
        module, _, name = key.rpartition(".")
        if name == "weight" and WEIGHT_NORMED.search(module):
            norm = value.norm(dim=tuple(range(1, value.dim())), keepdim=True)
            state[f"model_g.{module}.weight_g"] = norm
            state[f"model_g.{module}.weight_v"] = value * 2.5  # weight norm is scale-free in v
        else:
            state[f"model_g.{key}"] = value.clone()
    # Training-only tensors inference must skip: posterior encoder, posterior flows, the dropped flow.
    for extra in ("enc_q.pre.weight", "dp.post_pre.weight", "dp.flows.1.pre.weight", "dp.post_flows.0.m"):
        state[f"model_g.{extra}"] = torch.zeros(2, 2)
    state["model_d.discriminators.0.convs.0.weight_v"] = torch.zeros(2, 2)
    if drop:
        state.pop(f"model_g.{drop}")
    hparams = hparams or {
        "upsample_rates": list(TINY.upsample_rates),
        "resblock_dilation_sizes": str(TINY.resblock_dilation_sizes),
    }
    path = tmp_path / "tiny.ckpt"
    torch.save({"state_dict": state, "hyper_parameters": hparams, "epoch": 1}, path)
    config = {
        "audio": {"sample_rate": 16000},
        "espeak": {"voice": "en-us"},
        "num_symbols": TINY.n_vocab,
        "num_speakers": TINY.n_speakers,
        "speaker_id_map": {"ann": 0, "bob": 1, "cy": 2},
        "phoneme_id_map": {
            "_": [0],
            "^": [1],
            "$": [2],
            " ": [3],
            "h": [20],
            "a": [14],
            "i": [21],
            ".": [10],
        },
        "inference": {"noise_scale": 0.5, "length_scale": 1.0, "noise_w": 0.5},
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    return path


@pytest.fixture(scope="module")
def tiny_net() -> VitsSynthesizer:
    torch.manual_seed(0)
    net = VitsSynthesizer(TINY).eval()
    with torch.no_grad():
        for p in net.parameters():
            p.normal_(0, 0.2)
    return net


def test_ckpt_loads_strictly_with_weight_norm_folded(tmp_path, tiny_net):
    path = _piper_ckpt(tmp_path, tiny_net)
    assert FAMILY.detect(path) and FAMILY.detect(tmp_path)
    model = load(path, lazy_load=True)
    assert model.architecture == TINY  # read back from shapes and hyperparameters
    ids = torch.tensor([[1, 0, 20, 0, 14, 0, 21, 0, 2]])
    with torch.inference_mode():
        ours = model.network(ids, (0.0, 1.0, 0.0), sid=torch.tensor([1]))
        ref = tiny_net(ids, (0.0, 1.0, 0.0), sid=torch.tensor([1]))
    assert ours.shape == ref.shape
    assert torch.allclose(ours, ref, atol=1e-5)


def test_ckpt_plain_duration_predictor_and_resblock_2(tmp_path):
    """The other VITS variants: deterministic duration predictor, resblock "2", one speaker."""
    arch = replace(
        TINY,
        use_sdp=False,
        dp_filter_channels=12,
        resblock="2",
        resblock_dilation_sizes=((1, 2), (2, 6)),
        n_speakers=1,
        gin_channels=0,
    )
    torch.manual_seed(1)
    net = VitsSynthesizer(arch).eval()
    with torch.no_grad():
        for p in net.parameters():
            p.normal_(0, 0.2)
    path = _piper_ckpt(
        tmp_path, net, hparams={"upsample_rates": [4, 4], "resblock_dilation_sizes": [[1, 2], [2, 6]]}
    )
    config = json.loads((tmp_path / "config.json").read_text())
    config.update(num_speakers=1, speaker_id_map={})
    (tmp_path / "config.json").write_text(json.dumps(config))
    model = load(path, lazy_load=True)
    assert model.architecture == arch
    ids = torch.tensor([[1, 0, 20, 0, 14, 0, 2]])
    with torch.inference_mode():
        assert torch.allclose(model.network(ids, (0.0, 1.0, 0.0)), net(ids, (0.0, 1.0, 0.0)), atol=1e-5)


def test_ckpt_speakers(tmp_path, tiny_net):
    model = load(_piper_ckpt(tmp_path, tiny_net))
    by_name = model.generate("Hi.", voice="bob", seed=1, noise_scale=0, noise_w=0).audio
    by_id = model.generate("Hi.", voice=1, seed=1, noise_scale=0, noise_w=0).audio
    other = model.generate("Hi.", voice="cy", seed=1, noise_scale=0, noise_w=0).audio
    np.testing.assert_array_equal(by_name, by_id)
    assert by_name.shape != other.shape or np.abs(by_name - other).max() > 1e-4
    assert model.speakers == ["ann", "bob", "cy"]
    with pytest.raises(ValueError, match="unknown speaker 'dan'"):
        model.generate("Hi.", voice="dan")
    with pytest.raises(ValueError, match="out of range"):
        model.generate("Hi.", voice=3)


def test_ckpt_missing_tensor_is_named(tmp_path, tiny_net):
    path = _piper_ckpt(tmp_path, tiny_net, drop="flow.flows.2.post.bias")
    with pytest.raises(CheckpointError, match=r"missing: flow\.flows\.2\.post\.bias") as err:
        load(path)
    assert "tiny.ckpt" in str(err.value)


def test_ckpt_unexpected_and_misshaped_tensors(tmp_path, tiny_net):
    from voicehub.models.checkpoints import load_strict

    state = dict(tiny_net.state_dict())
    state["dec.extra.weight"] = torch.zeros(1)
    state["dec.conv_pre.bias"] = torch.zeros(3)
    with pytest.raises(
        CheckpointError, match=r"unexpected: dec\.extra\.weight.*mis-shaped: dec\.conv_pre\.bias"
    ):
        load_strict(VitsSynthesizer(TINY), state, tmp_path / "x.ckpt")


def test_hub_loads_the_embedded_voice_by_name_and_path(joe_files):
    from voicehub import AutoModelForTextToSpeech

    by_name = AutoModelForTextToSpeech.from_pretrained("en_US-joe-medium", lazy_load=True)
    by_path = AutoModelForTextToSpeech.from_pretrained(joe_files[0], model_type="vits", lazy_load=True)
    assert by_name.model_type == by_path.model_type == "vits"
    assert by_name.files == by_path.files and by_name.sample_rate == 22050
