"""BigVGAN v2 24 kHz: official key layout, folder loading, weight-norm folding, the swappable activation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from voicehub.errors import CheckpointError
from voicehub.models.gpt_sovits.bigvgan import (
    BigVGAN,
    BigVGANConfig,
    anti_alias_snake_torch,
    load_bigvgan,
    make_bigvgan_folder,
    vocode,
)
from voicehub.models.gpt_sovits.bigvgan.checkpoint import V2_24KHZ_100BAND_256X, WEIGHTS_FILE
from voicehub.models.gpt_sovits.sovits.strict import file_layout

KEYS = Path(__file__).parent / "data" / "upstream_keys" / "bigvgan_v2_24khz_100band_256x.json"


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return make_bigvgan_folder(tmp_path_factory.mktemp("bigvgan"), "tiny", seed=0)


def _mel(frames: int = 12, seed: int = 0) -> torch.Tensor:
    return torch.randn(1, 100, frames, generator=torch.Generator().manual_seed(seed)) - 6


def test_full_layout_equals_official_generator_keys():
    with torch.device("meta"):
        model = BigVGAN(BigVGANConfig.from_json(V2_24KHZ_100BAND_256X, "published config"))
    expected = {k: tuple(v) for k, v in json.loads(KEYS.read_text())["keys"].items()}
    assert file_layout(model) == expected


def test_tiny_folder_vocodes_256_samples_per_frame(folder):
    model = load_bigvgan(folder)
    audio = vocode(model, _mel(12))
    assert audio.shape == (1, 12 * 256)
    assert torch.isfinite(audio).all() and audio.abs().max() <= 1.0 and audio.std() > 1e-3


def test_plain_weight_file_gives_the_same_audio(folder, tmp_path):
    # A generator saved after remove_weight_norm holds `weight`; fold with torch's own op here.
    state = torch.load(folder / WEIGHTS_FILE, weights_only=True)["generator"]
    plain = {}
    for k, v in state.items():
        if k.endswith(".weight_g"):
            owner = k[: -len(".weight_g")]
            plain[owner + ".weight"] = torch._weight_norm(state[owner + ".weight_v"], v, 0)
        elif not k.endswith(".weight_v"):
            plain[k] = v
    out = tmp_path / "plain"
    out.mkdir()
    (out / "config.json").write_text((folder / "config.json").read_text())
    torch.save({"generator": plain}, out / WEIGHTS_FILE)
    a, b = vocode(load_bigvgan(folder), _mel()), vocode(load_bigvgan(out), _mel())
    # float32 folding by two formulas: only rounding differs.
    assert (a - b).norm() / b.norm() < 1e-5


def test_missing_and_misshaped_tensors_are_named(folder, tmp_path):
    state = torch.load(folder / WEIGHTS_FILE, weights_only=True)["generator"]
    del state["resblocks.2.activations.1.act.beta"]
    state["conv_pre.weight_v"] = torch.zeros(3, 3, 3)
    out = tmp_path / "bad"
    out.mkdir()
    (out / "config.json").write_text((folder / "config.json").read_text())
    torch.save({"generator": state}, out / WEIGHTS_FILE)
    with pytest.raises(CheckpointError) as err:
        load_bigvgan(out)
    msg = str(err.value)
    assert "resblocks.2.activations.1.act.beta" in msg and "conv_pre.weight_v (3, 3, 3)" in msg
    assert WEIGHTS_FILE in msg


def test_folder_without_config_says_what_it_needs(tmp_path):
    with pytest.raises(CheckpointError, match="config.json"):
        load_bigvgan(tmp_path)


def test_activation_kernel_is_swappable_and_restorable(folder):
    model = load_bigvgan(folder)
    reference = vocode(model, _mel())
    calls = []

    def counting(*args):
        calls.append(args[0].shape)
        return anti_alias_snake_torch(*args)

    previous = model.set_activation_kernel(counting)
    assert previous is anti_alias_snake_torch
    assert torch.equal(vocode(model, _mel()), reference)
    n_acts = sum(len(b.activations) for b in model.resblocks) + 1
    assert len(calls) == n_acts
    model.set_activation_kernel(previous)
    calls.clear()
    vocode(model, _mel())
    assert not calls


def test_anti_aliased_snake_passes_a_constant_as_snake_of_it():
    # Both filters have unit DC gain, so a constant c comes out as snakebeta(c) away from edges.
    from voicehub.models.gpt_sovits.bigvgan.activation import AntiAliasActivation

    act = AntiAliasActivation(3, with_beta=True, logscale=True)
    with torch.no_grad():
        act.act.alpha.copy_(torch.tensor([0.0, 0.5, -0.3]))
        act.act.beta.copy_(torch.tensor([0.2, -0.1, 0.0]))
    c = torch.tensor([0.7, -1.2, 2.0])
    y = act(c.view(1, 3, 1).expand(1, 3, 64))
    a, b = act.act.alpha.exp(), act.act.beta.exp()
    expected = c + torch.sin(c * a) ** 2 / b
    assert y.shape == (1, 3, 64)
    assert torch.allclose(y[..., 8:-8], expected.view(1, 3, 1).expand(1, 3, 48), atol=2e-3)
