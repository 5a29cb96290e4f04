"""BigVGAN from its Hugging Face folder layout: `config.json` + `bigvgan_generator.pt`.

The official file holds {"generator": state_dict} saved with weight norm on (weight_g/weight_v);
a file saved after `remove_weight_norm` (plain `weight`) is accepted too, as upstream's loader
accepts both. Weight norm is folded at load either way.
"""

from __future__ import annotations

import json
import pickle
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from voicehub.errors import CheckpointError
from voicehub.models.gpt_sovits.bigvgan.model import BigVGAN, BigVGANConfig
from voicehub.models.gpt_sovits.sizes import Size, parse_size
from voicehub.models.gpt_sovits.sovits.strict import load_weight_normed, weight_norm_layers
from voicehub.models.gpt_sovits.weights import meta_device

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "bigvgan_generator.pt"
FOLDER_NAME = "models--nvidia--bigvgan_v2_24khz_100band_256x"  # under GPT_SoVITS/pretrained_models

# NVIDIA's published bigvgan_v2_24khz_100band_256x config (generator and audio fields).
V2_24KHZ_100BAND_256X: dict[str, Any] = {
    "resblock": "1",
    "upsample_rates": [4, 4, 2, 2, 2, 2],
    "upsample_kernel_sizes": [8, 8, 4, 4, 4, 4],
    "upsample_initial_channel": 1536,
    "resblock_kernel_sizes": [3, 7, 11],
    "resblock_dilation_sizes": [[1, 3, 5], [1, 3, 5], [1, 3, 5]],
    "use_tanh_at_final": False,
    "use_bias_at_final": False,
    "activation": "snakebeta",
    "snake_logscale": True,
    "num_mels": 100,
    "num_freq": 1025,
    "n_fft": 1024,
    "hop_size": 256,
    "win_size": 1024,
    "sampling_rate": 24000,
    "fmin": 0,
    "fmax": None,
    "fmax_for_loss": None,
}
TINY_OVERRIDES = {
    "upsample_initial_channel": 128,
    "resblock_kernel_sizes": [3],
    "resblock_dilation_sizes": [[1, 3]],
}
OUTPUT_RMS = 0.1  # target loudness of random-weight output


def _calibrate_output(model: BigVGAN, state: dict[str, torch.Tensor], gen: torch.Generator) -> None:
    # Scale conv_post so a typical log-mel gives audio of RMS ~OUTPUT_RMS, not a clipped square wave.
    load_weight_normed(model, state, "generated weights")
    mel = torch.randn(1, model.conf.num_mels, 16, generator=gen) * 2 - 6
    rms = model.conv_post(model.activation_post(model.body(mel))).std().item()
    state["conv_post.weight_g"] = state["conv_post.weight_g"] * (OUTPUT_RMS / max(rms, 1e-6))


def _resolve_folder(folder: Path) -> Path:
    # Accept a Hugging Face cache folder too (snapshots/<revision>/config.json), if it has one snapshot.
    if (folder / CONFIG_FILE).is_file():
        return folder
    snapshots = sorted(p for p in (folder / "snapshots").glob("*") if (p / CONFIG_FILE).is_file())
    if len(snapshots) == 1:
        return snapshots[0]
    raise CheckpointError(
        f"BigVGAN folder {folder} has no {CONFIG_FILE}; point it at "
        f"GPT_SoVITS/pretrained_models/{FOLDER_NAME} holding {CONFIG_FILE} and {WEIGHTS_FILE}"
    )


def load_bigvgan(
    folder: str | Path, *, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
) -> BigVGAN:
    """A ready BigVGAN (eval, weight norm folded in float32) on `device` in `dtype`, from its folder."""
    return prepare_bigvgan(folder)(torch.device(device), dtype)


def prepare_bigvgan(folder: str | Path) -> Callable[[torch.device, torch.dtype], BigVGAN]:
    """`load_bigvgan` in two steps: the folder read and the model built on the meta device now (no device
    touched), then the returned function's call puts the weights on a device in a dtype."""
    folder = _resolve_folder(Path(folder))
    config_path, weights_path = folder / CONFIG_FILE, folder / WEIGHTS_FILE
    try:
        cfg = json.loads(config_path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"cannot read BigVGAN config {config_path}: {exc}") from exc
    conf = BigVGANConfig.from_json(cfg, str(config_path))
    if not weights_path.is_file():
        raise CheckpointError(f"BigVGAN weights {weights_path} do not exist")
    try:
        # mmap (zip files; older pickles cannot be mapped): each tensor is read once, by the fold or the cast
        mmap = zipfile.is_zipfile(weights_path)
        ckpt = torch.load(weights_path, map_location="cpu", weights_only=True, mmap=mmap)
    except (pickle.UnpicklingError, RuntimeError, EOFError) as exc:
        raise CheckpointError(f"cannot read BigVGAN weights {weights_path}: {exc}") from exc
    if not isinstance(ckpt, dict) or not isinstance(ckpt.get("generator"), dict):
        raise CheckpointError(
            f"{weights_path} has no 'generator' state dict; it is not a BigVGAN generator file"
        )
    with meta_device():  # no throw-away random init: every value, the filters too, is in the file
        model = BigVGAN(conf)

    def finish(device: torch.device, dtype: torch.dtype) -> BigVGAN:
        load_weight_normed(model, ckpt["generator"], str(weights_path), device=device, dtype=dtype)
        return model.eval()

    return finish


@torch.no_grad()
def make_bigvgan_folder(path: str | Path, size: str = "tiny", seed: int = 0) -> Path:
    """Write a random-weight BigVGAN v2 24 kHz folder in the official layout (weight_g/weight_v).

    `full` has the real sizes; `tiny` keeps the 100-band, 256x layout with narrow channels.
    Weights are drawn so the output is finite and not constant. For tests and benchmarks.
    """
    tiny = parse_size(size) is Size.TINY
    cfg = dict(V2_24KHZ_100BAND_256X, **(TINY_OVERRIDES if tiny else {}))
    model = BigVGAN(BigVGANConfig.from_json(cfg, "generated config"))
    gen = torch.Generator().manual_seed(seed)
    state: dict[str, torch.Tensor] = {}
    wn = weight_norm_layers(model)
    for name, tensor in model.state_dict().items():
        owner, _, leaf = name.rpartition(".")
        if leaf == "weight" and owner in wn:
            state[f"{owner}.weight_v"] = torch.randn(tensor.shape, generator=gen)
            # Unit-norm slices keep activations near unit scale through the stack.
            state[f"{owner}.weight_g"] = torch.full((tensor.shape[0],) + (1,) * (tensor.dim() - 1), 1.0)
        elif leaf in ("alpha", "beta"):
            state[name] = 0.3 * torch.randn(tensor.shape, generator=gen)
        elif leaf == "bias":
            state[name] = 0.01 * torch.randn(tensor.shape, generator=gen)
        else:
            state[name] = tensor.clone()  # the fixed anti-aliasing filters
    _calibrate_output(model, state, gen)
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / CONFIG_FILE).write_text(json.dumps(cfg, indent=4))
    torch.save({"generator": state}, folder / WEIGHTS_FILE)
    return folder
