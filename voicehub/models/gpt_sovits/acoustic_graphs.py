"""CUDA graphs of GPT-SoVITS v3's acoustic stage in the streaming path: CFM pieces and vocoder windows.

Run eagerly, a streamed sentence's first chunk spends most of its time launching the CFM's and
BigVGAN's many small kernels (4 DiT steps: ~50 ms eager, ~15 ms as one graph). `AcousticGraphs`
replays both from graphs, one object per loaded model (`Pipeline.acoustic_graphs`, CUDA and a preset
other than 'off'). Shapes, and why each is what it is:
- CFM: a piece of N frames (reference prompt + context + new frames, N <= T_CHUNK) is right-padded to
  the next multiple of CFM_FRAME_BUCKET and solved with a mask: the DiT keeps padded frames out of every
  valid one (cfm/dit.py), so 15 buckets per (rows, sample_steps) serve every piece, and a padded solve
  equals the unpadded one up to float rounding (the attention takes its masked kernel).
- vocoder (vocoder_graphs.py): BigVGAN pads its borders (zeros in the convolutions, replication in the
  anti-aliased activations), so a right-padded window runs masked: each window (any length) replays the
  masked one-row graph of its frame bucket (SENTENCE_FRAME_BUCKETS: every window of 25-token chunks at the
  common speeds, 73-120 frames, replays the 128-frame graph), equal to vocoding it alone up to rounding.
- SoVITS encoder: the token prefix and the phonemes right-padded to buckets and masked, one graph per
  (tokens, phonemes, speed) (encoder_graphs.py); made for the model passed to the first `encode`.
- the stream engine's CFM batches (batch_acoustic.solve_pieces) replay the same graphs with more rows
  (CFM_ROW_BUCKETS; padded rows hold one valid frame each), captured on first use; its vocoder windows
  of one length replay (row bucket, length) graphs (VOCODER_ROW_BUCKETS; padded rows are zeros, and
  BigVGAN convolves each row alone), captured when the engine starts (serving.py) or on first use.
Graphs replay what eager runs on the same buffers. The CFM noise is drawn by the caller, as eagerly,
and copied into the static buffers, so the RNG stream is eager's. Outputs are cloned before the lock
is released: a later replay in the same memory pool may overwrite them.

When graphs are captured (the model's cuda_graph_preset): `full` captures every CFM frame bucket
(one row, the fast preset's steps) and every masked vocoder graph at load; `minimal` the CFM buckets and
vocoder buckets of the first LOAD_WINDOWS windows of each common (chunk, speed) for the default
voice (or a reference of T_REF frames, the prompt of every reference of 5 s or more); both capture
the encoder of each common (chunk, speed)'s first ENCODER_LOAD_WINDOWS windows for sentences of up to
ENCODER_LOAD_PHONES phonemes (common speeds: LOAD_SPEEDS), and `full` the first window's (the one the
first audio waits for) at every phoneme bucket up to MAX_PHONES; `lazy` each shape on first use; everything
not captured at load is captured on first use. The per-sentence path's whole mels replay the same masked
vocoder graphs (vocoder_graphs.vocode_mel: 10 shapes for every length).
The engine's window lengths are unbounded, so at most MAX_VOCODER_GRAPHS (rows, length) graphs are kept; a
new one past that runs eagerly, and says so (vocoder_graphs.py; the encoder likewise past its range).
What the solver or vocoder runs (the schedule, the step cache, the DiT's kernels, a compiled forward, the
activation kernel) is part of the graphs' identity: when an optimization changes it, the graphs are dropped.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import islice
from typing import Any

import torch

from voicehub.models.gpt_sovits.bigvgan import BigVGAN
from voicehub.models.gpt_sovits.cfm.dit import DiT
from voicehub.models.gpt_sovits.cfm.solver import FRAME_BUCKET, solve_padded
from voicehub.models.gpt_sovits.encoder_graphs import (
    MAX_PHONES,
    PHONE_BUCKET,
    EncoderGraphs,
    encoder_key,
    forwards_of,
)
from voicehub.models.gpt_sovits.presets import PRESETS, PresetName
from voicehub.models.gpt_sovits.sovits.model import SynthesizerV3
from voicehub.models.gpt_sovits.sovits.synth import T_CHUNK, T_REF
from voicehub.models.gpt_sovits.streaming import window_ends
from voicehub.models.gpt_sovits.vocoder_graphs import VocoderGraphs
from voicehub.models.gpt_sovits.window_shapes import cfm_piece_frames, stream_window_frames
from voicehub.runtime.cuda_graphs import BucketedGraphRunner, GraphPreset, parse_graph_preset
from voicehub.runtime.kv_cache import pick_bucket, round_up

CFM_FRAME_BUCKET = FRAME_BUCKET  # frames: a CFM piece is right-padded to a multiple of this
CFM_ROW_BUCKETS = (1, 2, 4, 8, 16)  # rows per CFM graph: 1 streamed piece; the stream engine's batches
COMMON_CHUNK_TOKENS = (25,)  # stream_chunk_tokens of the load-time shapes (the stream engine's default)
COMMON_SAMPLE_STEPS = (PRESETS[PresetName.FAST].sample_steps,)  # CFM steps of the load-time graphs
# Speeds of the load-time encoder and vocoder shapes: those of the presets whose CFM graphs load captures
# (fast 1.3, balanced 1.1: the default). The quality preset (1.0) captures its CFM (16 steps) on first use
# anyway, so its encoder and windows at load bought its first request nothing but load time.
LOAD_SPEEDS = tuple(sorted({p.speed for p in PRESETS.values() if p.sample_steps in COMMON_SAMPLE_STEPS}))
LOAD_WINDOWS = 2  # a sentence's first windows whose CFM and vocoder shapes `minimal` captures at load
ENCODER_LOAD_WINDOWS = 2  # a sentence's first windows whose encoder shapes load captures (full, minimal)
ENCODER_LOAD_PHONES = {GraphPreset.FULL: 128, GraphPreset.MINIMAL: 64}  # ... for up to these phonemes
# full: a sentence's first window at every phoneme bucket (a long sentence's first audio paid its capture,
# 50-90 ms, e2e_sentence_h200.json): 16 x 2 speeds, with the second window's keys 40 of MAX_GRAPHS
log = logging.getLogger("voicehub.models.gpt_sovits")


def _largest_first(key: tuple[int, int]) -> tuple[int, int]:
    """Sort key of (rows, frames) captures: largest first, so later captures reuse the pool's memory."""
    return -key[0] * key[1], -key[0]


def cfm_frame_buckets(step: int = CFM_FRAME_BUCKET, largest: int = T_CHUNK) -> tuple[int, ...]:
    """Frame buckets of the CFM graphs: the multiples of `step` up to the first that holds `largest`
    (every bucket a multiple of 8 frames, as the masked attention kernels like their rows aligned)."""
    return tuple(range(step, round_up(largest, step) + 1, step))


@dataclass
class _CfmSlots:
    """Static inputs of one (rows, frames) CFM graph (solve_padded's layout)."""

    mu: torch.Tensor  # [R, F, text_dim]
    prompt_x: torch.Tensor  # [R, mel, F]
    keep: torch.Tensor  # [R, 1, F]
    noise: torch.Tensor  # [R, mel, F]
    mask: torch.Tensor  # [R, F] bool


class CfmGraphs:
    """CFM solves of right-padded, masked rows replayed from graphs: one runner per sample_steps over
    (rows, frames) buckets, static input buffers per bucket. Not thread-safe (AcousticGraphs locks)."""

    def __init__(
        self,
        estimator: DiT,
        device: torch.device,
        row_buckets: Sequence[int] = CFM_ROW_BUCKETS,
        frame_buckets: Sequence[int] | None = None,
    ):
        self.estimator, self.device = estimator, device
        self.row_buckets = tuple(sorted(row_buckets))
        self.frame_buckets = tuple(sorted(frame_buckets or cfm_frame_buckets()))
        self.runners: dict[int, BucketedGraphRunner] = {}  # sample_steps -> its graphs
        self._slots: dict[tuple[int, int], _CfmSlots] = {}
        self._identity: tuple | None = None

    def keys(self) -> list[tuple[int, int]]:
        """(rows, frames) buckets, largest first: a shared pool reuses the largest capture's memory."""
        return [(r, f) for r in reversed(self.row_buckets) for f in reversed(self.frame_buckets)]

    def key(self, n_rows: int, n_frames: int) -> tuple[int, int]:
        return pick_bucket(n_rows, self.row_buckets), pick_bucket(n_frames, self.frame_buckets)

    def runner(self, n_steps: int) -> BucketedGraphRunner:
        """The graphs of `n_steps` (made on first need); all are dropped when the solver changed."""
        est = self.estimator
        identity = (est.schedule, est.step_cache, est.kernels, est.weights_version, forwards_of(est))
        if identity != self._identity:
            self.reset()
            self._identity = identity
        runner = self.runners.get(n_steps)
        if runner is None:
            step = lambda key: self._step(n_steps, key)  # noqa: E731
            runner = BucketedGraphRunner(step, self.keys(), GraphPreset.LAZY, self.device)
            self.runners[n_steps] = runner
        return runner

    def reset(self) -> None:
        for runner in self.runners.values():
            runner.reset()
        self.runners.clear()

    def capture(self, n_steps: int, key: tuple[int, int]) -> None:
        """Capture the graph of `key` now unless it is (its warm-up and one replay run on zeros)."""
        runner = self.runner(n_steps)
        if key not in runner.captured_buckets:
            self._slots_of(key)  # allocated outside the capture, as every static input
            runner.run(key)

    def _step(self, n_steps: int, key: tuple[int, int]) -> torch.Tensor:
        s = self._slots_of(key)
        return solve_padded(self.estimator, s.mu, s.prompt_x, s.keep, s.noise, n_steps, s.mask)

    def _slots_of(self, key: tuple[int, int]) -> _CfmSlots:
        slots = self._slots.get(key)
        if slots is None:
            n_rows, n = key
            w = self.estimator.proj_out.weight
            mel_dim, text_dim = (
                self.estimator.proj_out.out_features,
                self.estimator.text_embed.freqs_cis.shape[1],
            )
            new = lambda *shape: torch.zeros(*shape, device=w.device, dtype=w.dtype)  # noqa: E731
            mask = torch.ones(n_rows, n, device=w.device, dtype=torch.bool)  # what a capture's warm-up sees
            slots = _CfmSlots(new(n_rows, n, text_dim), new(n_rows, mel_dim, n), new(n_rows, 1, n) + 1,
                              new(n_rows, mel_dim, n), mask)  # fmt: skip
            self._slots[key] = slots
        return slots

    def solve_rows(
        self, rows: Sequence[tuple[torch.Tensor, torch.Tensor, torch.Tensor]], n_steps: int
    ) -> list[torch.Tensor]:
        """Rows (mu [N, text_dim], normalised prompt mel [mel, P], noise [mel, N]; P < N) solved in one
        replay -> each row's x [mel, N] (a copy; its first P frames are 0), as `solve` of the row alone
        up to float rounding. Padding: frames past a row's N and rows past len(rows) (one valid frame
        each, so no attention row is wholly masked)."""
        key = self.key(len(rows), max(mu.shape[0] for mu, _, _ in rows))
        runner = self.runner(n_steps)
        s = self._slots_of(key)
        for t in (s.mu, s.prompt_x, s.keep, s.noise, s.mask):
            t.zero_()
        for i, (mu, prompt, noise) in enumerate(rows):
            n, p = mu.shape[0], prompt.shape[1]
            s.mu[i, :n] = mu
            s.prompt_x[i, :, :p] = prompt
            s.noise[i, :, :n] = noise
            s.keep[i, :, p:n] = 1
            s.mask[i, :n] = True
        s.mask[len(rows) :, 0] = True
        x = runner.run(key)
        return [x[i, :, : mu.shape[0]].clone() for i, (mu, _, _) in enumerate(rows)]


def build_acoustic_graphs(
    estimator: DiT, vocoder: BigVGAN, preset: GraphPreset | str, device: torch.device
) -> AcousticGraphs | None:
    """The model's acoustic graphs on CUDA with a capturing preset; None (eager calls) otherwise."""
    if device.type != "cuda" or parse_graph_preset(preset) is GraphPreset.OFF:
        return None
    return AcousticGraphs(estimator, vocoder, preset, device)


class AcousticGraphs:
    """The streaming path's encoder, CFM and vocoder graphs of one loaded model (module docstring).

    `solve` and `vocode_mel` have the signatures of `cfm.solver.solve` (one row) and `bigvgan.vocode`, and
    `encode` that of `SynthesizerV3.decode_encp` with the model first, so streaming.py takes them as its
    strategies. The encoder graphs are made for the SoVITS model whose CFM this is, on first need. Calls
    from several threads take turns (one lock: the static buffers serve one call at a time).
    """

    def __init__(self, estimator: DiT, vocoder: BigVGAN, preset: GraphPreset | str, device: torch.device):
        self.preset = parse_graph_preset(preset)
        if self.preset is GraphPreset.OFF or device.type != "cuda":
            raise ValueError(
                f"acoustic graphs need a CUDA device and a capturing preset, got {device} and "
                f"{self.preset.value!r}; stream eagerly instead (Pipeline.acoustic_graphs None)"
            )
        self.cfm = CfmGraphs(estimator, device)
        self.vocoder = VocoderGraphs(vocoder, device)
        self.encoder: EncoderGraphs | None = None
        self.device = device
        self._lock = threading.Lock()

    def encoder_of(self, model: SynthesizerV3) -> EncoderGraphs:
        """The encoder graphs of `model` (made on first call; the model must be this CFM's)."""
        if self.encoder is None or self.encoder.model is not model:
            if model.cfm.estimator is not self.cfm.estimator:
                raise ValueError("encode() takes the SoVITS model whose CFM these graphs solve")
            self.encoder = EncoderGraphs(model, self.device)
        return self.encoder

    @torch.inference_mode()
    def encode(
        self, model: SynthesizerV3, codes: torch.Tensor, text: torch.Tensor, ge: torch.Tensor, speed: float
    ) -> torch.Tensor:
        """`model.decode_encp(codes [1, 1, n], text [1, P], ge [1, gin, 1], speed)` -> [1, inter2, L] from
        the graph of the padded (tokens, phonemes, speed) (eagerly where that is out of range)."""
        with self._lock:
            return self.encoder_of(model).encode(codes, text, ge, speed)

    @torch.inference_mode()
    def solve(
        self, estimator: DiT, mu: torch.Tensor, prompt: torch.Tensor, noise: torch.Tensor, n_steps: int
    ) -> torch.Tensor:
        """`solve(estimator, mu [1, N, text_dim], prompt [1, mel, P], noise [1, mel, N], n_steps)` -> [1, mel, N]
        from the graph of N's frame bucket (right-padded, masked)."""
        assert estimator is self.cfm.estimator and mu.shape[0] == 1, "one row of this model's CFM"
        with self._lock:
            return self.cfm.solve_rows([(mu[0], prompt[0], noise[0])], n_steps)[0][None]

    @torch.inference_mode()
    def solve_rows(
        self, rows: Sequence[tuple[torch.Tensor, torch.Tensor, torch.Tensor]], n_steps: int
    ) -> list[torch.Tensor]:
        """`CfmGraphs.solve_rows` for batches of any size (split into groups of the largest row bucket)."""
        most = self.cfm.row_buckets[-1]
        with self._lock:
            return [
                x
                for lo in range(0, len(rows), most)
                for x in self.cfm.solve_rows(rows[lo : lo + most], n_steps)
            ]

    @torch.inference_mode()
    def vocode_mel(self, vocoder: BigVGAN, mel: torch.Tensor) -> torch.Tensor:
        """`vocode(vocoder, mel [1, num_mels, n])` for a streamed window or a whole sentence's mel, any n ->
        audio [1, n * hop], from masked graphs (`VocoderGraphs.vocode_mel`: equal up to float rounding)."""
        assert vocoder is self.vocoder.vocoder and mel.shape[0] == 1, "one mel of this model's vocoder"
        with self._lock:
            return self.vocoder.vocode_mel(mel)

    def vocoder_eager_reason(self, n_rows: int, n_frames: int) -> str | None:
        """`VocoderGraphs.eager_reason`: None when n_rows windows of n_frames replay a graph."""
        with self._lock:
            return self.vocoder.eager_reason(n_rows, n_frames)

    @torch.inference_mode()
    def vocode_rows(self, vocoder: BigVGAN, mels: Sequence[torch.Tensor]) -> torch.Tensor:
        """Windows [num_mels, n] of one length (`vocoder_eager_reason` None) -> audio [len(mels), n * hop]
        from one replay of the (row bucket, n) graph, each row as `vocode` of its window alone."""
        assert vocoder is self.vocoder.vocoder, "windows of this model's vocoder"
        with self._lock:
            return self.vocoder.vocode_rows(mels)

    @torch.inference_mode()
    def capture_vocoder(self, shapes: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
        """Capture vocoder graphs of (rows, frames) `shapes` (largest first: later captures reuse the
        pool's memory), each once; returns the graphs' keys that exist now."""
        with self._lock:
            for n_rows, n_frames in sorted(shapes, key=_largest_first):
                self.vocoder.capture(n_frames, n_rows)
            return sorted({self.vocoder.key(r, n) for r, n in shapes} & set(self.vocoder.captured))

    @torch.inference_mode()
    def capture_masked_vocoder(self, keys: Sequence[tuple[int, int, str]]) -> list[tuple[int, int, str]]:
        """Capture masked vocoder graphs of `keys` (each once); returns those held now."""
        with self._lock:
            self.vocoder.capture_masked(keys)
            return [k for k in keys if k in self.vocoder.captured]

    @torch.inference_mode()
    def capture_cfm(self, keys: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
        """Capture CFM graphs of (rows, frames) `keys` at COMMON_SAMPLE_STEPS (each once; largest first: later
        captures reuse the pool's memory); returns the keys held now at those steps."""
        with self._lock:
            for n_steps in COMMON_SAMPLE_STEPS:
                for key in sorted(keys, key=_largest_first):
                    self.cfm.capture(n_steps, key)
            held = set.intersection(*(set(self.cfm.runner(n).captured_buckets) for n in COMMON_SAMPLE_STEPS))
            return sorted(set(keys) & held)

    def load_time_shapes(
        self, prompt_frames: int | None
    ) -> tuple[list[tuple[int, int]], list[tuple[int, int, str]]]:
        """What the preset captures at load: (CFM (rows, frames) buckets, masked vocoder keys), for a
        voice whose reference prompt has `prompt_frames` frames (None: T_REF, a reference of >= 5 s).
        The encoder's: `encoder_load_keys`."""
        if self.preset is GraphPreset.FULL:
            return [k for k in self.cfm.keys() if k[0] == 1], self.vocoder.masked_keys()
        if self.preset is not GraphPreset.MINIMAL:
            return [], []
        configs = [(c, s) for c in COMMON_CHUNK_TOKENS for s in LOAD_SPEEDS]
        frames = [
            f for c, s in configs for f in stream_window_frames(self.vocoder.vocoder, c, s, LOAD_WINDOWS)
        ]
        p = T_REF if prompt_frames is None else prompt_frames
        cfm = [self.cfm.key(1, n) for c, s in configs for n in cfm_piece_frames(p, c, s, LOAD_WINDOWS)]
        vocoder = sorted({self.vocoder.masked_key(n) for n in frames}, key=lambda k: -k[1])
        return list(dict.fromkeys(cfm)), vocoder

    def encoder_load_keys(self) -> list[tuple[int, int, float]]:
        """Encoder (tokens, phonemes, speed) keys the preset captures at load: each common (chunk,
        speed)'s first ENCODER_LOAD_WINDOWS windows, every phoneme bucket up to ENCODER_LOAD_PHONES (the
        first window up to MAX_PHONES with `full`)."""
        most = ENCODER_LOAD_PHONES.get(self.preset, 0)
        first_most = MAX_PHONES if self.preset is GraphPreset.FULL else most
        keys = {
            encoder_key(end, p, s)
            for c in COMMON_CHUNK_TOKENS
            for k, end in enumerate(islice(window_ends(c), ENCODER_LOAD_WINDOWS))
            for s in LOAD_SPEEDS
            for p in range(PHONE_BUCKET, (first_most if k == 0 else most) + 1, PHONE_BUCKET)
        }
        return sorted(keys, key=lambda k: (k[2], -k[0], -k[1]))  # largest first per speed (one pool each)

    @torch.inference_mode()
    def capture_at_load(
        self, prompt_frames: int | None = None, encoder: SynthesizerV3 | None = None
    ) -> dict[str, Any]:
        """Capture `load_time_shapes` (each once: a shape captured before is kept), and with `encoder`
        (the SoVITS model) `encoder_load_keys`; returns what was captured."""
        cfm_keys, vocoder_keys = self.load_time_shapes(prompt_frames)
        encoder_keys = self.encoder_load_keys() if encoder is not None else []
        seconds = {}
        with self._lock:
            t0 = time.perf_counter()
            for key in encoder_keys:
                self.encoder_of(encoder).capture(key)
            t1 = time.perf_counter()
            for n_steps in COMMON_SAMPLE_STEPS:
                for key in cfm_keys:
                    self.cfm.capture(n_steps, key)
            t2 = time.perf_counter()
            self.vocoder.capture_masked(vocoder_keys)
            seconds = {"encoder": t1 - t0, "cfm": t2 - t1, "vocoder": time.perf_counter() - t2}
        return {"cfm_buckets": cfm_keys, "cfm_steps": list(COMMON_SAMPLE_STEPS), "vocoder_masked": vocoder_keys,
                "encoder_keys": encoder_keys, "capture_s": seconds}  # fmt: skip

    def n_captured(self) -> int:
        """Graphs held now over the CFM, vocoder and encoder (cheap: the engine reads it every round)."""
        runners = [*self.cfm.runners.values(), self.vocoder.runner]
        if self.encoder is not None:
            runners += list(self.encoder.runners.values())
        return sum(r.n_captured for r in runners if r is not None)

    def info(self) -> dict[str, Any]:
        """JSON-ready: the preset and what is captured now."""
        return {
            "preset": self.preset.value,
            "cfm": {str(n): len(r.captured_buckets) for n, r in self.cfm.runners.items()},
            "vocoder": len(self.vocoder.captured),
            "encoder": 0 if self.encoder is None else len(self.encoder.captured),
        }
