"""The three lifetimes of VITS configuration: the voice file, the network's shape, one request.

`VoiceConfig` is the Piper voice JSON (sample rate, phoneme ids, speakers, default scales).
`VitsArchitecture` is read from the checkpoint's tensor shapes and graph attributes (never from
the file name or the "quality" string). `VitsParams` holds one request's synthesis settings.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from voicehub.errors import CheckpointError
from voicehub.text.limits import MAX_TEXT_CHARS

PAD, BOS, EOS = "_", "^", "$"  # Piper's phoneme-id conventions (piper/const.py)


@dataclass(frozen=True)
class VoiceConfig:
    """What a Piper `.onnx.json` says about a voice."""

    path: Path
    sample_rate: int  # Hz
    phoneme_id_map: dict[str, tuple[int, ...]]
    espeak_voice: str
    phoneme_type: str
    num_symbols: int | None
    num_speakers: int
    speaker_id_map: dict[str, int]
    noise_scale: float
    length_scale: float
    noise_w: float

    @classmethod
    def read(cls, path: Path) -> VoiceConfig:
        """Parse and check a voice JSON; a missing or malformed key raises CheckpointError naming it."""
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CheckpointError(f"cannot read the voice config {str(path)!r}: {exc}") from exc
        if not isinstance(data, dict):
            raise CheckpointError(f"voice config {str(path)!r} is not a JSON object")
        return cls.from_dict(data, Path(path))

    @classmethod
    def from_dict(cls, data: dict[str, Any], path: Path) -> VoiceConfig:
        def need(key: str, where: dict[str, Any], section: str = "") -> Any:
            if key not in where:
                name = f"{section}.{key}" if section else key
                raise CheckpointError(
                    f"voice config {str(path)!r} has no {name!r}; it is not a Piper voice JSON "
                    "(use the .onnx.json that came with the voice)"
                )
            return where[key]

        id_map = need("phoneme_id_map", data)
        if not isinstance(id_map, dict) or not id_map:
            raise CheckpointError(f"voice config {str(path)!r}: 'phoneme_id_map' must be a non-empty object")
        for key in (PAD, BOS, EOS):
            if key not in id_map:
                raise CheckpointError(
                    f"voice config {str(path)!r}: 'phoneme_id_map' lacks the {key!r} symbol"
                )
        audio = need("audio", data)
        sample_rate = need("sample_rate", audio, "audio")
        if not isinstance(sample_rate, int) or sample_rate <= 0:
            raise CheckpointError(f"voice config {str(path)!r}: audio.sample_rate must be a positive integer")
        inference = data.get("inference", {})
        phoneme_type = str(data.get("phoneme_type", "espeak"))
        return cls(
            path=path,
            sample_rate=sample_rate,
            phoneme_id_map={str(k): tuple(int(i) for i in v) for k, v in id_map.items()},
            espeak_voice=str(data.get("espeak", {}).get("voice", "en-us")),
            phoneme_type=phoneme_type,
            num_symbols=data.get("num_symbols"),
            num_speakers=int(data.get("num_speakers", 1)),
            speaker_id_map={str(k): int(v) for k, v in data.get("speaker_id_map", {}).items()},
            noise_scale=float(inference.get("noise_scale", 0.667)),
            length_scale=float(inference.get("length_scale", 1.0)),
            noise_w=float(inference.get("noise_w", 0.8)),
        )

    @property
    def max_symbol_id(self) -> int:
        return max(i for ids in self.phoneme_id_map.values() for i in ids)


@dataclass(frozen=True)
class VitsArchitecture:
    """The network's hyperparameters, read from the checkpoint (see weights.architecture_from_*)."""

    n_vocab: int
    hidden_channels: int  # text-encoder width
    inter_channels: int  # latent z channels
    filter_channels: int  # text-encoder FFN width
    n_heads: int
    n_layers: int
    kernel_size: int  # text-encoder FFN kernel
    window_size: int  # relative-position attention reach, in tokens
    heads_share: bool  # one relative embedding shared by all heads
    resblock: str  # "1" (three dilated convs + three plain) or "2" (two dilated convs)
    resblock_kernel_sizes: tuple[int, ...]
    resblock_dilation_sizes: tuple[tuple[int, ...], ...]
    upsample_rates: tuple[int, ...]
    upsample_kernel_sizes: tuple[int, ...]
    upsample_initial_channel: int
    flow_n_flows: int
    flow_hidden_channels: int
    flow_kernel_size: int
    flow_dilation_rate: int
    flow_n_layers: int
    use_sdp: bool  # stochastic duration predictor (else the plain one)
    dp_filter_channels: int
    dp_kernel_size: int
    sdp_n_flows: int = 4
    sdp_num_bins: int = 10
    n_speakers: int = 1
    gin_channels: int = 0  # speaker-embedding width; 0 for one speaker

    def __post_init__(self) -> None:
        if self.hidden_channels % self.n_heads:
            raise CheckpointError(
                f"hidden size {self.hidden_channels} does not split into {self.n_heads} heads"
            )
        if self.resblock not in ("1", "2"):
            raise CheckpointError(f"unknown resblock kind {self.resblock!r}; known kinds: '1', '2'")
        if len(self.upsample_rates) != len(self.upsample_kernel_sizes):
            raise CheckpointError("upsample rates and kernel sizes differ in number")

    @property
    def hop_length(self) -> int:
        """Audio samples per latent frame."""
        return math.prod(self.upsample_rates)


@dataclass(frozen=True)
class VitsParams:
    """One request's synthesis settings; defaults come from the voice JSON's `inference` section.

    length_scale: > 1 speaks slower; `speed` (accepted by build, as every family takes it) divides
    it: speed 1.5 is length_scale / 1.5; noise_scale: latent noise;
    noise_w: duration noise; sentence_silence: seconds of silence between sentences;
    window_frames / context_frames / crossfade_frames: the streaming decoder's latent windows.
    """

    length_scale: float = 1.0
    noise_scale: float = 0.667
    noise_w: float = 0.8
    sentence_silence: float = 0.0
    max_text_chars: int = MAX_TEXT_CHARS
    window_frames: int = 48  # ~0.56 s at 22.05 kHz, hop 256
    context_frames: int = 24  # beyond the generator's receptive field (~12 frames each side)
    crossfade_frames: int = 2

    @classmethod
    def build(cls, voice: VoiceConfig, **params: Any) -> VitsParams:
        """Defaults from `voice`, overridden by `params`; an unknown name raises TypeError naming it."""
        names = {f.name for f in fields(cls)} | {"speed"}
        unknown = sorted(set(params) - names)
        if unknown:
            raise TypeError(
                f"unknown VITS parameter(s) {', '.join(unknown)}; valid: {', '.join(sorted(names))}"
            )
        base = cls(length_scale=voice.length_scale, noise_scale=voice.noise_scale, noise_w=voice.noise_w)
        speed = params.pop("speed", None)
        if speed is not None:
            if not speed > 0:
                raise ValueError(f"speed must be > 0 (1.0 is the voice's own rate), got {speed}")
            params["length_scale"] = params.get("length_scale", base.length_scale) / speed
        built = replace(base, **params)
        built.validate()
        return built

    def validate(self) -> None:
        """Raise ValueError naming the bad setting and the fix."""

        def check(ok: bool, message: str) -> None:
            if not ok:
                raise ValueError(message)

        check(
            self.length_scale > 0, f"length_scale must be > 0 (1.0 is normal speed), got {self.length_scale}"
        )
        check(self.length_scale <= 10, f"length_scale {self.length_scale} is over 10; use a value in (0, 10]")
        check(self.noise_scale >= 0, f"noise_scale must be >= 0 (0 turns noise off), got {self.noise_scale}")
        check(self.noise_w >= 0, f"noise_w must be >= 0 (0 turns duration noise off), got {self.noise_w}")
        check(
            0 <= self.sentence_silence <= 10,
            f"sentence_silence must be in [0, 10] seconds, got {self.sentence_silence}",
        )
        check(self.max_text_chars > 0, f"max_text_chars must be > 0, got {self.max_text_chars}")
        check(self.window_frames >= 4, f"window_frames must be >= 4, got {self.window_frames}")
        check(self.context_frames >= 0, f"context_frames must be >= 0, got {self.context_frames}")
        check(
            0 <= self.crossfade_frames <= self.window_frames,
            f"crossfade_frames must be in [0, window_frames={self.window_frames}], got {self.crossfade_frames}",
        )
