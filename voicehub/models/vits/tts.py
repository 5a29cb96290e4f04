"""`VitsModel`: a Piper voice behind VoiceHub's `TTSModel` interface (generate and stream)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from voicehub.errors import CheckpointError, InvalidTextError
from voicehub.models.base import TTSModel
from voicehub.models.checkpoints import load_strict
from voicehub.models.vits.config import VitsArchitecture, VitsParams, VoiceConfig
from voicehub.models.vits.files import VoiceFiles, WeightFormat
from voicehub.models.vits.model import VitsSynthesizer
from voicehub.models.vits.phonemes import SUPPORTED_PHONEME_TYPES, Sentence, make_phonemizer, phoneme_ids
from voicehub.models.vits.streaming import decode_windows
from voicehub.models.vits.weights import architecture, read_ckpt, read_onnx
from voicehub.text.limits import check_text
from voicehub.types import AudioChunk, TTSOutput


class VitsModel(TTSModel):
    """A Piper VITS voice run by our PyTorch network.

    generate(): one decode per sentence, `sentence_silence` seconds between sentences.
    stream(): sentence by sentence; within a sentence the latent is decoded in windows
    (see streaming.py), so the first chunk comes after the first window, not the whole text.
    """

    model_type = "vits"

    def __init__(
        self,
        files: VoiceFiles,
        voice: VoiceConfig,
        device: torch.device,
        dtype: torch.dtype,
        phonemizer: str = "auto",
        lazy_load: bool = False,
    ) -> None:
        self.files = files
        self.voice = voice
        self.sample_rate = voice.sample_rate
        self.device = device
        self.dtype = dtype
        self._phonemizer_backend = phonemizer
        self._phonemizer: Any = None
        self._network: VitsSynthesizer | None = None
        self._load_lock = threading.Lock()
        if not lazy_load:
            self._load_weights()

    # -- loading ---------------------------------------------------------------------------

    @property
    def network(self) -> VitsSynthesizer:
        """The PyTorch network, reading the weights now if the model was loaded lazily."""
        if self._network is None:
            with self._load_lock:
                if self._network is None:
                    self._load_weights()
                    self.apply_pending_optimization()  # a load-time optimization_config applies now
        assert self._network is not None
        return self._network

    @property
    def is_runtime_loaded(self) -> bool:
        return self._network is not None

    def load_runtime(self) -> None:
        self.network  # noqa: B018 (reads the weights if lazy)

    def optimization_targets(self) -> list:
        """The reversible transforms of `optimize()` (see vits/optimization.py)."""
        from voicehub.models.vits.optimization import vits_transforms

        return vits_transforms(self)

    @property
    def architecture(self) -> VitsArchitecture:
        return self.network.arch

    def _load_weights(self) -> None:
        path = self.files.weights
        if self.files.format is WeightFormat.CKPT:
            state, hparams = read_ckpt(path)
            arch = architecture(state, lambda module, attr: None, hparams, path)
        else:
            state, attrs = read_onnx(path)
            arch = architecture(state, attrs, {}, path)
        self._check_voice_matches(arch)
        net = VitsSynthesizer(arch)
        load_strict(net, state, path, model="the VITS model")
        self._network = net.to(device=self.device, dtype=self.dtype).eval()

    def _check_voice_matches(self, arch: VitsArchitecture) -> None:
        v, where = self.voice, f"{str(self.files.config)!r} and {str(self.files.weights)!r}"
        if v.num_symbols is not None and v.num_symbols != arch.n_vocab:
            raise CheckpointError(
                f"{where} disagree: num_symbols {v.num_symbols} vs {arch.n_vocab} embeddings"
            )
        if v.max_symbol_id >= arch.n_vocab:
            raise CheckpointError(
                f"{where} disagree: phoneme_id_map uses id {v.max_symbol_id}, the model has {arch.n_vocab} symbols"
            )
        if v.num_speakers != arch.n_speakers:
            raise CheckpointError(
                f"{where} disagree: num_speakers {v.num_speakers} vs {arch.n_speakers} in the weights"
            )

    @contextlib.contextmanager
    def precision(self) -> Iterator[None]:
        """Within it, fp32 on CUDA is IEEE fp32: TF32 convolutions and matmuls are off, restored after.

        cuDNN convolutions default to TF32, whose rounding moves duration ceilings by a frame and
        samples by ~1e-2 against the CPU; speed-ups of that kind belong to the optimization layer.
        """
        if self.device.type != "cuda" or self.dtype != torch.float32:
            yield
            return
        saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
        torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
        try:
            yield
        finally:
            torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved

    def phonemize(self, text: str) -> Iterator[Sentence]:
        """Sentences of the text with their phonemes (espeak-ng; see phonemes.py)."""
        if self._phonemizer is None:
            self._phonemizer = make_phonemizer(
                self.voice.espeak_voice, self.voice.phoneme_type, self._phonemizer_backend
            )
        return self._phonemizer.sentences(text)

    # -- requests ----------------------------------------------------------------------------

    @property
    def speakers(self) -> list[str]:
        """Speaker names of a multi-speaker voice, in id order (empty for one speaker)."""
        return [name for name, _ in sorted(self.voice.speaker_id_map.items(), key=lambda kv: kv[1])]

    def _speaker_id(self, voice: Any) -> torch.Tensor | None:
        n = self.voice.num_speakers
        if n <= 1:
            if voice is not None:
                raise ValueError("this voice has a single speaker; leave voice=None")
            return None
        if voice is None:
            sid = 0  # Piper's default speaker
        elif isinstance(voice, bool) or not isinstance(voice, int | str):
            raise ValueError(f"voice must be a speaker id (int) or name (str), got {type(voice).__name__}")
        elif isinstance(voice, str):
            if voice not in self.voice.speaker_id_map:
                known = ", ".join(self.speakers[:20]) or "none named"
                raise ValueError(f"unknown speaker {voice!r}; this voice's speakers: {known}")
            sid = self.voice.speaker_id_map[voice]
        else:
            sid = voice
        if not 0 <= sid < n:
            raise ValueError(f"speaker id {sid} out of range; this voice has speakers 0..{n - 1}")
        return torch.tensor([sid], device=self.device)

    def _prepare(self, text: str, voice: Any, seed: int | None, params: dict[str, Any]) -> tuple:
        p = VitsParams.build(self.voice, **params)
        text = check_text(text, p.max_text_chars)
        sid = self._speaker_id(voice)
        gen = torch.Generator(device=self.device)
        if seed is None:
            gen.seed()
        else:
            gen.manual_seed(int(seed))
        return p, text, sid, gen

    def _latent(
        self, sentence: Sentence, p: VitsParams, g: torch.Tensor | None, gen: torch.Generator
    ) -> torch.Tensor:
        ids = phoneme_ids(sentence.phonemes, self.voice.phoneme_id_map)
        ids_t = torch.tensor([ids], dtype=torch.long, device=self.device)
        return self.network.latent(ids_t, g, p.noise_scale, p.length_scale, p.noise_w, gen)

    def _sentences(self, text: str) -> Iterator[tuple[Sentence, bool]]:
        """Sentences with an is-last flag, looking one sentence ahead."""
        it = iter(self.phonemize(text))
        current = next(it, None)
        if current is None:
            raise InvalidTextError(f"espeak-ng found nothing to speak in {text[:60]!r}")
        for following in it:
            yield current, False
            current = following
        yield current, True

    @torch.inference_mode()
    def generate(self, text: str, *, voice: Any = None, seed: int | None = None, **params: Any) -> TTSOutput:
        """The whole utterance: float32 [n] at `sample_rate`; each sentence decoded in one pass."""
        p, text, sid, gen = self._prepare(text, voice, seed, params)
        net = self.network
        g = net.speaker(sid)
        silence = np.zeros(round(p.sentence_silence * self.sample_rate), np.float32)
        pieces: list[np.ndarray] = []
        for sentence, is_last in self._sentences(text):
            with self.precision():
                z = self._latent(sentence, p, g, gen)
                pieces.append(net.decode(z, g)[0].float().cpu().numpy())
            if not is_last:
                pieces.append(silence)
        return TTSOutput(
            audio=np.concatenate(pieces).astype(np.float32), sample_rate=self.sample_rate, text=text
        )

    def stream(
        self, text: str, *, voice: Any = None, seed: int | None = None, **params: Any
    ) -> Iterator[AudioChunk]:
        """Chunks as they are made; concatenated they equal generate() up to the window cross-fades."""
        p, text, sid, gen = self._prepare(text, voice, seed, params)
        return self._stream(text, p, sid, gen)

    # torch wraps each step of a decorated generator, so inference mode never leaks to the caller.
    @torch.inference_mode()
    def _stream(
        self, text: str, p: VitsParams, sid: torch.Tensor | None, gen: torch.Generator
    ) -> Iterator[AudioChunk]:
        net = self.network
        g = net.speaker(sid)
        hop = net.arch.hop_length
        silence = np.zeros(round(p.sentence_silence * self.sample_rate), np.float32)
        index, offset = 0, 0
        for sentence, is_last_sentence in self._sentences(text):
            with self.precision():
                z = self._latent(sentence, p, g, gen)
            pieces = decode_windows(
                lambda zz: self._decode(zz, g), z, hop, p.window_frames, p.context_frames, p.crossfade_frames
            )
            for piece, is_last_window in pieces:
                if is_last_window and not is_last_sentence:
                    piece = np.concatenate([piece, silence])
                yield self._chunk(piece, sentence, index, offset, is_last_window and is_last_sentence)
                index, offset = index + 1, offset + len(piece)

    def _decode(self, z: torch.Tensor, g: torch.Tensor | None) -> torch.Tensor:
        with self.precision():  # not held across a yield: the caller's code runs between chunks
            return self.network.decode(z, g)

    def _chunk(
        self, audio: np.ndarray, sentence: Sentence, index: int, offset: int, is_last: bool
    ) -> AudioChunk:
        return AudioChunk(
            audio=audio,
            sample_rate=self.sample_rate,
            text=sentence.text,
            index=index,
            start_s=offset / self.sample_rate,
            is_last=is_last,
            phonemes=sentence.phoneme_str,
        )


def load_vits(
    files: VoiceFiles,
    device: str | torch.device = "cpu",
    dtype: Any = None,
    lazy_load: bool = False,
    phonemizer: str = "auto",
) -> VitsModel:
    """Read the voice JSON now (errors surface at once) and the weights now or on first use."""
    from voicehub.runtime.device import resolve_device, resolve_dtype

    dev = resolve_device(device)
    dt = resolve_dtype(dtype, torch.float32)
    voice = VoiceConfig.read(Path(files.config))
    if voice.phoneme_type not in SUPPORTED_PHONEME_TYPES:
        raise CheckpointError(
            f"{str(files.config)!r}: phoneme_type {voice.phoneme_type!r} is not supported; "
            f"supported: {', '.join(SUPPORTED_PHONEME_TYPES)}"
        )
    return VitsModel(files, voice, dev, dt, phonemizer=phonemizer, lazy_load=lazy_load)
