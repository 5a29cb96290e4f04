"""Architecture of a SoVITS v3 checkpoint, read from its own config and tensor shapes.

Upstream's hps (`config` in the file) gives the VITS encoder sizes; the DiT, MRTE, style encoder
and codebook sizes are constants in upstream's code, so they are read here from tensor shapes.
That lets a small test checkpoint in the official layout describe itself.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from voicehub.errors import CheckpointError


@dataclass(frozen=True)
class SoVITSV3Arch:
    # From the checkpoint's hps["model"]
    inter_channels: int = 192
    hidden_channels: int = 192
    filter_channels: int = 768
    n_heads: int = 2
    n_layers: int = 6
    kernel_size: int = 3
    gin_channels: int = 512
    # From tensor shapes (upstream constants)
    ssl_dim: int = 768
    n_bins: int = 1024
    n_q: int = 1
    n_symbols: int = 732
    mrte_hidden: int = 512
    style_in: int = 704  # linear-spectrogram bins the style encoder reads (of 1025)
    style_hidden: int = 128
    inter2: int = 512  # width of bridge / wns1 / the CFM condition
    wn_kernel: int = 5
    wn_layers: int = 8
    mel_dim: int = 100
    dit_dim: int = 1024
    dit_depth: int = 22
    dit_heads: int = 16
    dit_dim_head: int = 64
    dit_ff_mult: int = 2
    dit_conv_layers: int = 4

    def __post_init__(self) -> None:
        if self.mrte_hidden != self.gin_channels:
            raise CheckpointError(
                f"MRTE width {self.mrte_hidden} must equal gin_channels {self.gin_channels}"
            )
        if self.hidden_channels % self.n_heads or self.dit_dim % 16:
            raise CheckpointError("hidden_channels must divide by n_heads and the DiT width by 16")

    @classmethod
    def full(cls) -> SoVITSV3Arch:
        return cls()

    @classmethod
    def tiny(cls) -> SoVITSV3Arch:
        """Same layout, small enough for a CPU test in seconds."""
        return cls(
            inter_channels=16, hidden_channels=16, filter_channels=32, n_heads=2, n_layers=2, gin_channels=32,
            ssl_dim=32, n_bins=64, mrte_hidden=32, style_hidden=16, inter2=32, wn_layers=2,
            dit_dim=64, dit_depth=2, dit_heads=2, dit_dim_head=32, dit_conv_layers=1,
        )  # fmt: skip

    @classmethod
    def from_checkpoint(cls, hps: Mapping[str, Any], shapes: Mapping[str, tuple[int, ...]], source: str):
        """Sizes from hps["model"] and the tensor shapes of `source` (a name -> shape map)."""
        model = _section(hps, "model", source)

        def shape(key: str) -> tuple[int, ...]:
            if key not in shapes:
                raise CheckpointError(f"{source} lacks tensor {key}; it is not a SoVITS v3 checkpoint")
            return tuple(shapes[key])

        def count(pattern: str) -> int:
            return len({m.group(1) for k in shapes if (m := re.fullmatch(pattern, k))})

        wn_in = (
            "wns1.enc.in_layers.0.weight_v"
            if "wns1.enc.in_layers.0.weight_v" in shapes
            else "wns1.enc.in_layers.0.weight"
        )
        dit = "cfm.estimator."
        dim = shape(dit + "proj_out.weight")[1]
        dim_head = 2 * shape(dit + "rotary_embed.inv_freq")[0]
        try:
            return cls(
                inter_channels=int(model["inter_channels"]),
                hidden_channels=int(model["hidden_channels"]),
                filter_channels=int(model["filter_channels"]),
                n_heads=int(model["n_heads"]),
                n_layers=int(model["n_layers"]),
                kernel_size=int(model["kernel_size"]),
                gin_channels=int(model["gin_channels"]),
                ssl_dim=shape("ssl_proj.weight")[0],
                n_bins=shape("quantizer.vq.layers.0._codebook.embed")[0],
                n_q=count(r"quantizer\.vq\.layers\.(\d+)\._codebook\.embed"),
                n_symbols=shape("enc_p.text_embedding.weight")[0],
                mrte_hidden=shape("enc_p.mrte.c_pre.weight")[0],
                style_in=shape("ref_enc.spectral.0.fc.weight")[1],
                style_hidden=shape("ref_enc.spectral.0.fc.weight")[0],
                inter2=shape("bridge.0.weight")[0],
                wn_kernel=shape(wn_in)[2],
                wn_layers=count(r"wns1\.enc\.in_layers\.(\d+)\.bias"),
                mel_dim=shape("linear_mel.weight")[0],
                dit_dim=dim,
                dit_depth=count(r"cfm\.estimator\.transformer_blocks\.(\d+)\.attn\.to_q\.bias"),
                dit_heads=shape(dit + "transformer_blocks.0.attn.to_q.weight")[0] // dim_head,
                dit_dim_head=dim_head,
                dit_ff_mult=shape(dit + "transformer_blocks.0.ff.ff.0.0.weight")[0] // dim,
                dit_conv_layers=count(r"cfm\.estimator\.text_embed\.text_blocks\.(\d+)\.dwconv\.weight"),
            )
        except KeyError as exc:
            raise CheckpointError(
                f"{source}: config['model'] lacks {exc}; the file's config is incomplete"
            ) from exc

    def to_hps(self) -> dict[str, Any]:
        """A config dict in upstream's s2.json layout (what `make_sovits_checkpoint` writes)."""
        arch = asdict(self)
        model = {
            k: arch[k]
            for k in ("inter_channels", "hidden_channels", "filter_channels", "n_heads", "n_layers")
        }
        model.update(
            kernel_size=self.kernel_size, p_dropout=0.1, resblock="1", resblock_kernel_sizes=[3, 7, 11],
            resblock_dilation_sizes=[[1, 3, 5]] * 3, upsample_rates=[10, 8, 2, 2, 2],
            upsample_initial_channel=512, upsample_kernel_sizes=[16, 16, 8, 2, 2], n_layers_q=3,
            use_spectral_norm=False, gin_channels=self.gin_channels, semantic_frame_rate="25hz",
            freeze_quantizer=True, version="v3",
        )  # fmt: skip
        data = {
            "max_wav_value": 32768.0, "sampling_rate": 32000, "filter_length": 2048, "hop_length": 640,
            "win_length": 2048, "n_mel_channels": 128, "mel_fmin": 0.0, "mel_fmax": None, "add_blank": True,
            "n_speakers": 300, "cleaned_text": True,
        }  # fmt: skip
        train = {"segment_size": 20480, "fp16_run": True, "lora_rank": 0}
        return {"train": train, "data": data, "model": model, "version": "v3", "content_module": "cnhubert"}


def _section(hps: Any, name: str, source: str) -> Mapping[str, Any]:
    section = hps.get(name) if isinstance(hps, Mapping) else getattr(hps, name, None)
    if section is None:
        raise CheckpointError(f"{source} has no config[{name!r}]; it is not a GPT-SoVITS SoVITS checkpoint")
    return section if isinstance(section, Mapping) else vars(section)
