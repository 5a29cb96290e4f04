"""HuBERT content features for GPT-SoVITS (chinese-hubert-base), from the user's local folder only.

Upstream (TTS_infer_pack/TTS.py `_set_prompt_semantic`, inference_webui.py `get_tts_wav`) loads the
reference with `librosa.load(path, sr=16000)`, appends zeros, and runs the bare `HubertModel` on it:
the `Wav2Vec2FeatureExtractor` is loaded but not applied at inference, so no normalisation happens
here either. The zeros are `int(sovits_sample_rate * 0.3)` samples at 16 kHz, where the rate is the
SoVITS config's `data.sampling_rate` (32000 for v3), i.e. 9600 samples = 0.6 s, not 0.3 s.

The architecture is our own module (hubert_model.py) on transformers' tensor names; the folder's
config.json sizes it and its weights are read and checked here, strictly. Nothing reaches a model hub.
"""

from __future__ import annotations

import json
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from voicehub.errors import CheckpointError, ModelNotFoundError
from voicehub.models.checkpoints import rename_weight_norm
from voicehub.models.gpt_sovits import hubert_model
from voicehub.models.gpt_sovits.sizes import Size, parse_size
from voicehub.models.gpt_sovits.weights import Builder, assign_strict, meta_device, rebuild_missing
from voicehub.text.bert_tokenizer import read_json_object

HUBERT_SAMPLE_RATE = 16000  # Hz, what chinese-hubert-base was trained on
HUBERT_FOLDER = "chinese-hubert-base"  # its name inside upstream's pretrained_models/
HUBERT_FRAME_SAMPLES = 320  # 16 kHz samples per output frame (conv strides 5 * 2**6): 50 frames per second
REFERENCE_PAD_FACTOR = 0.3  # upstream: zeros = int(sovits data.sampling_rate * 0.3) samples
V3_SOVITS_SAMPLE_RATE = 32000  # v3 SoVITS data.sampling_rate (reference spectrogram rate)
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
CONFIG_MODEL = "the model from its config.json"  # what a folder's weights must match
# masked_spec_embed fills masked frames in training only; some exports leave it out (then zeros).
HUBERT_OPTIONAL = ("masked_spec_embed",)
HUBERT_COMPUTED: dict[tuple[str, str], Builder] = {
    ("HubertModel", "masked_spec_embed"): lambda t: torch.zeros(t.shape)
}


def reference_pad_samples(sovits_sample_rate: int = V3_SOVITS_SAMPLE_RATE) -> int:
    """Zeros upstream appends to the 16 kHz reference before HuBERT (9600 for v3)."""
    return int(sovits_sample_rate * REFERENCE_PAD_FACTOR)


def read_config(path: Path, defaults: Mapping[str, Any]) -> dict[str, Any]:
    """A folder's config.json over `defaults` (the values transformers' config class gives a key the file
    leaves out); an unreadable file raises CheckpointError."""
    return {**defaults, **read_json_object(path)}


def load_module(
    model: torch.nn.Module,
    state: Mapping[str, torch.Tensor],
    source: Path,
    device: torch.device,
    dtype: torch.dtype,
    optional: tuple[str, ...],
    computed: Mapping[tuple[str, str], Builder],
) -> torch.nn.Module:
    """`model` (built on the meta device) loaded strictly with `state`, each tensor cast once to `dtype` on
    `device`; `computed` rebuilds the `optional` tensors the file lacks. Returns it in eval mode."""
    assign_strict(
        model, state, str(source), device=device, dtype=dtype, model=CONFIG_MODEL, optional=optional
    )
    rebuild_missing(model, computed, device, dtype)
    return model.eval()


def read_weights(path: Path) -> dict[str, torch.Tensor]:
    """A state dict from a .safetensors or torch .bin file; unreadable files raise CheckpointError."""
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            return load_file(str(path))
        # mmap (zip files; older pickles cannot be mapped): tensors are read once, by the cast to the model's dtype
        mmap = zipfile.is_zipfile(path)
        state = torch.load(str(path), map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as exc:  # torch and safetensors raise many types for a corrupt file
        raise CheckpointError(f"cannot read weights file {str(path)!r}: {exc}") from exc
    if not isinstance(state, Mapping):
        raise CheckpointError(f"weights file {str(path)!r} holds a {type(state).__name__}, not a state dict")
    return dict(state)


def find_weights(folder: Path) -> Path:
    for name in WEIGHT_FILES:
        if (folder / name).is_file():
            return folder / name
    raise ModelNotFoundError(f"no weights in {str(folder)!r}: put {' or '.join(WEIGHT_FILES)} there")


def check_hubert_folder(folder: str | Path) -> Path:
    """The folder, after checking it holds config.json, preprocessor_config.json and weights."""
    folder = Path(folder)
    fix = (
        f"put upstream's {HUBERT_FOLDER} folder (config.json, preprocessor_config.json, pytorch_model.bin) "
        f"at {str(folder)!r}, e.g. copy GPT_SoVITS/pretrained_models/{HUBERT_FOLDER} from a GPT-SoVITS install"
    )
    if not folder.is_dir():
        raise ModelNotFoundError(f"HuBERT folder {str(folder)!r} does not exist: {fix}")
    for name in ("config.json", "preprocessor_config.json"):
        if not (folder / name).is_file():
            raise ModelNotFoundError(f"HuBERT folder {str(folder)!r} has no {name}: {fix}")
    find_weights(folder)
    return folder


class HubertEncoder(torch.nn.Module):
    """chinese-hubert-base: 16 kHz audio -> content features [1, hidden, T], T = 50 per second."""

    def __init__(self, model: hubert_model.HubertModel, folder: Path):
        super().__init__()
        self.model = model
        self.folder = folder

    @classmethod
    def from_folder(
        cls, folder: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
    ) -> HubertEncoder:
        """Load a chinese-hubert-base folder (architecture from its config.json), strictly, in eval mode."""
        return cls.prepare(folder)(torch.device(device), dtype)

    @classmethod
    def prepare(cls, folder: str | Path) -> Callable[[torch.device, torch.dtype], HubertEncoder]:
        """`from_folder` in two steps: the folder read and the model built on the meta device now (no
        device touched), then the returned function's call puts the weights on a device in a dtype."""
        folder = check_hubert_folder(folder)
        config = read_config(folder / "config.json", hubert_config("full"))
        hubert_model.check_config(config, str(folder / "config.json"))
        with meta_device():
            model = hubert_model.HubertModel(config)
        weights = find_weights(folder)
        # the published file says weight_g / weight_v; newer transformers save parametrizations.weight.original0/1
        state = rename_weight_norm(read_weights(weights), set(model.state_dict()))

        def finish(device: torch.device, dtype: torch.dtype) -> HubertEncoder:
            loaded = load_module(model, state, weights, device, dtype, HUBERT_OPTIONAL, HUBERT_COMPUTED)
            return cls(loaded, folder)

        return finish

    @property
    def hidden_size(self) -> int:
        return self.model.hidden_size

    @torch.inference_mode()
    def forward(self, wav16k: torch.Tensor, pad_samples: int = reference_pad_samples()) -> torch.Tensor:
        """Content features of 16 kHz audio, as upstream's prompt path computes them.

        wav16k: [n] float at 16 kHz (not normalised, as upstream); `pad_samples` zeros are appended
        (upstream: `reference_pad_samples(sovits data.sampling_rate)`). Returns [1, hidden, T] in the
        model's dtype, on its device.
        """
        if wav16k.dim() != 1:
            raise ValueError(f"expected 16 kHz mono audio of shape [n], got {tuple(wav16k.shape)}")
        param = next(self.model.parameters())
        x = torch.cat([wav16k.to(param), torch.zeros(pad_samples, dtype=param.dtype, device=param.device)])
        hidden = self.model(x[None])  # [1, T, hidden]
        return hidden.transpose(1, 2)


def hubert_config(size: str) -> dict:
    """config.json values: `full` = chinese-hubert-base's real values, `tiny` = a 1-layer test model of width 768."""
    conv = {"conv_kernel": [10, 3, 3, 3, 3, 2, 2], "conv_stride": [5, 2, 2, 2, 2, 2, 2], "conv_bias": False}
    full = {
        "architectures": ["HubertModel"], "model_type": "hubert", "hidden_size": 768, "num_hidden_layers": 12,
        "num_attention_heads": 12, "intermediate_size": 3072, "hidden_act": "gelu", "conv_dim": [512] * 7, **conv,
        "feat_extract_norm": "group", "feat_extract_activation": "gelu", "feat_proj_layer_norm": True,
        "num_conv_pos_embeddings": 128, "num_conv_pos_embedding_groups": 16, "num_feat_extract_layers": 7,
        "do_stable_layer_norm": False, "layer_norm_eps": 1e-5, "hidden_dropout": 0.1, "attention_dropout": 0.1,
        "activation_dropout": 0.0, "feat_proj_dropout": 0.1, "final_dropout": 0.1, "layerdrop": 0.1,
        "apply_spec_augment": True, "mask_time_prob": 0.05, "mask_time_length": 10, "mask_feature_prob": 0.0,
        "mask_feature_length": 10, "initializer_range": 0.02, "vocab_size": 32, "pad_token_id": 0,
        "bos_token_id": 1, "eos_token_id": 2, "use_weighted_layer_sum": False, "classifier_proj_size": 256,
    }  # fmt: skip
    if parse_size(size) is Size.FULL:
        return full
    # Width stays 768 so the tiny features feed a SoVITS with the real ssl_dim; depth and convs shrink.
    tiny = {
        "num_hidden_layers": 1,
        "intermediate_size": 256,
        "conv_dim": [64] * 7,
        "num_conv_pos_embeddings": 16,
    }
    return {**full, **tiny}


def make_hubert_folder(path: str | Path, size: str = "tiny", seed: int = 0) -> Path:
    """Write a random-weight chinese-hubert-base folder in the official layout (a test artefact, not a model).

    Files: config.json, preprocessor_config.json, pytorch_model.bin (weight-norm halves named weight_g /
    weight_v, as in the published file). Returns the folder.
    """
    values = hubert_config(size)
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model = hubert_model.HubertModel(values)
    hubert_model.init_random(model, values["initializer_range"])
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    torch.save(state, folder / "pytorch_model.bin")
    (folder / "config.json").write_text(json.dumps(values, indent=2))
    preprocessor = {
        "do_normalize": True, "feature_extractor_type": "Wav2Vec2FeatureExtractor", "feature_size": 1,
        "padding_side": "right", "padding_value": 0, "return_attention_mask": False, "sampling_rate": 16000,
    }  # fmt: skip
    (folder / "preprocessor_config.json").write_text(json.dumps(preprocessor, indent=2))
    return folder
