"""HuBERT features: a random-weight folder in the official layout through the user's loader."""

import json

import pytest
import torch

from voicehub.errors import CheckpointError, ModelNotFoundError
from voicehub.models.gpt_sovits.ssl import (
    HUBERT_FRAME_SAMPLES,
    HubertEncoder,
    hubert_config,
    make_hubert_folder,
    reference_pad_samples,
)

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def hubert_dir(tmp_path_factory):
    return make_hubert_folder(tmp_path_factory.mktemp("pm") / "chinese-hubert-base", "tiny", seed=3)


@pytest.fixture(scope="module")
def encoder(hubert_dir):
    return HubertEncoder.from_folder(hubert_dir)


def test_official_layout_files(hubert_dir):
    assert sorted(p.name for p in hubert_dir.iterdir()) == [
        "config.json",
        "preprocessor_config.json",
        "pytorch_model.bin",
    ]
    keys = torch.load(hubert_dir / "pytorch_model.bin", weights_only=True)
    assert "encoder.pos_conv_embed.conv.weight_g" in keys and "encoder.pos_conv_embed.conv.weight_v" in keys


@pytest.mark.parametrize("size", ["tiny", "full"])
def test_tensor_names_and_shapes_are_transformers(size):
    # the published file is transformers' HubertModel state dict (weight norm as weight_g / weight_v)
    from voicehub.models.gpt_sovits.hubert_model import HubertModel

    config = hubert_config(size)
    with torch.device("meta"):
        ours = {k: tuple(v.shape) for k, v in HubertModel(config).state_dict().items()}
        theirs = transformers.HubertModel(transformers.HubertConfig(**config)).state_dict()
    names = {
        ".parametrizations.weight.original0": ".weight_g",
        ".parametrizations.weight.original1": ".weight_v",
    }
    renamed = {}
    for key, value in theirs.items():
        for new, old in names.items():
            key = key.replace(new, old)
        renamed[key] = tuple(value.shape)
    assert ours == renamed


def test_upstream_padding_is_9600_samples_for_v3():
    # upstream: np.zeros(int(hps.data.sampling_rate * 0.3)) appended to the 16 kHz audio; v3 data rate 32 kHz
    assert reference_pad_samples(32000) == 9600
    assert reference_pad_samples() == 9600


def test_features_shape_and_equal_transformers_loader(encoder, hubert_dir):
    wav = torch.randn(48000, generator=torch.Generator().manual_seed(0)) * 0.1  # 3 s at 16 kHz
    feats = encoder(wav)
    n = 48000 + 9600
    assert feats.shape == (1, 768, (n - 400) // HUBERT_FRAME_SAMPLES + 1)  # 400: receptive field of the convs
    # transformers' own from_pretrained is an independent path to the same weights
    ref_model = transformers.HubertModel.from_pretrained(hubert_dir, local_files_only=True).eval()
    with torch.no_grad():
        ref = ref_model(torch.cat([wav, torch.zeros(9600)])[None]).last_hidden_state.transpose(1, 2)
    torch.testing.assert_close(feats, ref, atol=1e-5, rtol=1e-5)


def test_padding_changes_features(encoder):
    wav = torch.randn(48000, generator=torch.Generator().manual_seed(1)) * 0.1
    assert encoder(wav, pad_samples=0).shape[-1] < encoder(wav).shape[-1]


def test_new_style_weight_names_and_safetensors(tmp_path, encoder):
    from safetensors.torch import save_file

    folder = tmp_path / "h"
    folder.mkdir()
    for name in ("config.json", "preprocessor_config.json"):
        (folder / name).write_text((encoder.folder / name).read_text())
    # newer transformers name the weight-norm halves parametrizations.weight.original0 (g) / original1 (v)
    new_names = {
        ".weight_g": ".parametrizations.weight.original0",
        ".weight_v": ".parametrizations.weight.original1",
    }
    state = {}
    for key, value in encoder.model.state_dict().items():
        for old, new in new_names.items():
            key = key.removesuffix(old) + new if key.endswith(old) else key
        state[key] = value.contiguous()
    assert "encoder.pos_conv_embed.conv.parametrizations.weight.original0" in state
    save_file(state, folder / "model.safetensors")
    wav = torch.randn(16000) * 0.1
    torch.testing.assert_close(HubertEncoder.from_folder(folder)(wav), encoder(wav))


def _folder_with_state(tmp_path, hubert_dir, edit):
    folder = tmp_path / "h"
    folder.mkdir()
    for name in ("config.json", "preprocessor_config.json"):
        (folder / name).write_text((hubert_dir / name).read_text())
    state = torch.load(hubert_dir / "pytorch_model.bin", weights_only=True)
    edit(state)
    torch.save(state, folder / "pytorch_model.bin")
    return folder


@pytest.mark.parametrize(
    "edit, words",
    [
        (lambda s: s.pop("encoder.layers.0.attention.k_proj.weight"), ["missing", "k_proj.weight"]),
        (lambda s: s.__setitem__("extra.weight", torch.zeros(1)), ["unexpected", "extra.weight"]),
        (
            lambda s: s.__setitem__("encoder.layer_norm.bias", torch.zeros(5)),
            ["mis-shaped", "layer_norm.bias"],
        ),
    ],
)
def test_strict_loading_names_the_tensor(tmp_path, hubert_dir, edit, words):
    folder = _folder_with_state(tmp_path, hubert_dir, edit)
    with pytest.raises(CheckpointError) as info:
        HubertEncoder.from_folder(folder)
    assert all(w in str(info.value) for w in words) and "pytorch_model.bin" in str(info.value)


def test_missing_folder_and_files(tmp_path, hubert_dir):
    with pytest.raises(ModelNotFoundError, match="chinese-hubert-base"):
        HubertEncoder.from_folder(tmp_path / "nowhere")
    folder = _folder_with_state(tmp_path, hubert_dir, lambda s: None)
    (folder / "preprocessor_config.json").unlink()
    with pytest.raises(ModelNotFoundError, match="preprocessor_config.json"):
        HubertEncoder.from_folder(folder)
    (folder / "preprocessor_config.json").write_text("{}")
    (folder / "pytorch_model.bin").unlink()
    with pytest.raises(ModelNotFoundError, match="pytorch_model.bin"):
        HubertEncoder.from_folder(folder)


def test_full_config_values_and_bad_size():
    full = hubert_config("full")
    assert (full["hidden_size"], full["num_hidden_layers"], full["intermediate_size"]) == (768, 12, 3072)
    json.dumps(full)  # writable as config.json
    with pytest.raises(ValueError, match="tiny, full"):
        hubert_config("huge")


@pytest.mark.parametrize(
    "key, value", [("do_stable_layer_norm", True), ("feat_extract_norm", "layer"), ("hidden_act", "relu")]
)
def test_config_this_module_does_not_implement_is_refused(tmp_path, hubert_dir, key, value):
    folder = _folder_with_state(tmp_path, hubert_dir, lambda s: None)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, key: value}))
    with pytest.raises(CheckpointError, match=f"{key}={value!r}"):
        HubertEncoder.from_folder(folder)


def test_unreadable_config_is_refused(tmp_path, hubert_dir):
    folder = _folder_with_state(tmp_path, hubert_dir, lambda s: None)
    (folder / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="config.json"):
        HubertEncoder.from_folder(folder)


def test_rejects_stereo_shape(encoder):
    with pytest.raises(ValueError, match=r"\[n\]"):
        encoder(torch.zeros(2, 16000))


@pytest.mark.gpu
def test_full_size_folder_on_gpu(tmp_path):
    folder = make_hubert_folder(tmp_path / "chinese-hubert-base", "full", seed=0)
    encoder = HubertEncoder.from_folder(folder, device="cuda", dtype=torch.float16)
    feats = encoder(torch.randn(48000, device="cuda") * 0.1)
    assert feats.shape == (1, 768, (48000 + 9600 - 400) // HUBERT_FRAME_SAMPLES + 1)
    assert feats.dtype == torch.float16 and torch.isfinite(feats).all()
