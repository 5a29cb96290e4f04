"""CUDA graphs of the SoVITS v3 encoder (`decode_encp`) in the streaming path.

Each window of a streamed sentence runs the encoder on the token prefix so far with the sentence's
phonemes (streaming.py step 2). Eagerly that is ~19 ms of small kernels on an H200, whatever the size;
replayed from a graph, a few. The graph runs `SynthesizerV3.decode_encp_masked` (one row, every length a
tensor) on right-padded static buffers:
- tokens padded to a multiple of TOKEN_BUCKET (25: the default stream_chunk_tokens, so a default
  stream's windows fill their bucket exactly and only a sentence's last prefix is padded);
- phonemes padded to a multiple of PHONE_BUCKET (constant through a sentence);
- the speed is part of the key (it sets the resampled content length, the graph's shapes).
The padded tokens and phonemes are masked in every encoder, the speed resampling reads the row's own
frames (`resample_rows`), and wns1 masks the features past the row's length: the replay equals
`decode_encp` of the unpadded prefix up to float rounding. Shapes past MAX_TOKENS / MAX_PHONES, or new
ones once MAX_GRAPHS are held, run `decode_encp` eagerly (said once per shape). A compiled forward set on
one of the encoder's modules drops the graphs (they would replay the old code). `decode_encp_bucketed`
runs the same padded layout eagerly: the per-sentence path, so cuDNN sees only bucket shapes.

`EncoderRowGraphs` does the same for the stream engine's batches (serving.py): the windows of several
streams at one speed replay one graph of (row bucket, token bucket, phoneme bucket, speed), the rows
right-padded as above and the missing rows padding too (zeros; each row is encoded alone, so they change
no real row). Its buckets are coarse (ENCODER_ROW_BUCKETS, ENGINE_TOKEN_BUCKETS, ENGINE_PHONE_BUCKETS):
the engine captures every shape a batch can take when it starts (a capture inside a round stalls every
stream), and with the streaming path's fine buckets those shapes were too many, so nearly every batch
ran eagerly (H200, 64 streams: 551 of 561 rows, the largest stage). Rows x token bucket is bounded by
MAX_ENCODER_ROW_TOKENS (a graph's memory), the count by MAX_ROW_GRAPHS; past either the caller runs the
rows eagerly and counts why (`eager_reason`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from voicehub.models.gpt_sovits.sovits.model import SynthesizerV3, encp_lengths
from voicehub.runtime.cuda_graphs import BucketedGraphRunner, GraphBudget, GraphPreset
from voicehub.runtime.eager_conv import without_cudnn
from voicehub.runtime.kv_cache import pick_bucket, round_up

TOKEN_BUCKET = 25  # semantic tokens: a prefix is right-padded to a multiple of this
PHONE_BUCKET = 32  # phonemes: a sentence's phonemes are right-padded to a multiple of this
MAX_TOKENS = 500  # longest prefix replayed from a graph (20 s at speed 1)
MAX_PHONES = 512  # most phonemes replayed from a graph
MAX_GRAPHS = 96  # encoder graphs kept; a new shape past that runs eagerly
# The stream engine's encoder calls hold the windows of one CFM batch (ServingConfig.max_cfm_batch, 16);
# its graphs pad rows, token prefixes and phonemes to these (the encoder's replay is launch-bound: a padded
# row or token costs little next to an eager call, ~40 ms on the H200): per speed 16 + 16 + 12 graphs
ENCODER_ROW_BUCKETS = (1, 4, 16)
ENGINE_TOKEN_BUCKETS = (50, 100, 200, MAX_TOKENS)
ENGINE_PHONE_BUCKETS = (64, 128, 256, MAX_PHONES)
# rows x token bucket of one engine graph: its output alone is rows x 3.75 frames a token x inter2 (512)
# values, 12 MB in fp16 at this bound (16 rows of 200-token prefixes, 8 s at speed 1)
MAX_ENCODER_ROW_TOKENS = 16 * 200
MAX_ROW_GRAPHS = 96  # engine encoder graphs kept; a new shape past that runs eagerly
log = logging.getLogger("voicehub.models.gpt_sovits")

EncoderKey = tuple[int, int, float]  # (token bucket, phoneme bucket, speed)
RowEncoderKey = tuple[int, int, int, float]  # (row bucket, token bucket, phoneme bucket, speed)


def forwards_of(module: torch.nn.Module) -> tuple:
    """The forwards set on instances in `module` (a compiled forward, runtime/compile.py, lives on its
    instance, the whole model's or a block's): a graph captured before such a swap runs the old code."""
    return tuple((name, f) for name, m in module.named_modules() if (f := vars(m).get("forward")) is not None)


def encoder_identity(model: SynthesizerV3) -> tuple:
    """What the encoder's graphs replay: the forwards set on its modules (a change drops the graphs)."""
    return tuple(forwards_of(m) for m in (model.quantizer, model.enc_p, model.bridge, model.wns1))


def encoder_key(n_tokens: int, n_phones: int, speed: float) -> EncoderKey:
    """The graph that serves a prefix of n_tokens with n_phones phonemes at `speed`."""
    return round_up(n_tokens, TOKEN_BUCKET), round_up(n_phones, PHONE_BUCKET), float(speed)


@torch.no_grad()
def decode_encp_without_cudnn(
    model: SynthesizerV3, codes: torch.Tensor, text: torch.Tensor, ge: torch.Tensor, speed: float = 1.0
) -> torch.Tensor:
    """`model.decode_encp` itself, at the sentence's own shapes, on ATen's convolutions
    (runtime/eager_conv.py): nothing to plan at a new shape (conv_plan_probe_h200.json: 23 ms at a new
    length, 68-89 ms with cuDNN's plans). The per-sentence path's encoder when its CFM and vocoder replay
    graphs (pipeline.py)."""
    return without_cudnn(model.decode_encp)(codes, text, ge, speed)


@torch.no_grad()
def decode_encp_bucketed(
    model: SynthesizerV3, codes: torch.Tensor, text: torch.Tensor, ge: torch.Tensor, speed: float = 1.0
) -> torch.Tensor:
    """`model.decode_encp(codes [n_q, 1, T], text [1, P], ge, speed)` (same result up to float rounding)
    run eagerly at `encoder_key`'s padded shapes, the graphs' layout: cuDNN plans its convolutions per
    shape, so the per-sentence path reaches it at a few shapes. Past MAX_TOKENS / MAX_PHONES it pads to
    a multiple of the bucket all the same (a bounded number of shapes, at most a bucket of padding)."""
    n_tokens, n_phones = codes.shape[2], text.shape[1]
    t, p, _ = encoder_key(n_tokens, n_phones, speed)
    content, n_fea, mask = encp_lengths(n_tokens, speed)
    n = torch.tensor([n_tokens, n_phones, content, mask], device=codes.device)
    fea = model.decode_encp_masked(
        F.pad(codes, (0, t - n_tokens)), n[0:1], F.pad(text, (0, p - n_phones)), n[1:2], ge,
        n[2:3] if speed != 1 else None, encp_lengths(t, speed)[0], n[3:4],
    )  # fmt: skip
    return fea[:, :, :n_fea]


@dataclass
class _EncoderSlots:
    """Static inputs of one (tokens, phonemes, speed) graph (decode_encp_masked's layout, one row)."""

    codes: torch.Tensor  # [1, 1, T] long
    text: torch.Tensor  # [1, P] long
    ge: torch.Tensor  # [1, gin, 1]
    lengths: torch.Tensor  # [4] long: tokens, phonemes, content frames, wns1 mask frames
    n_content: int  # the resampled content frames of a full bucket (the graph's static size)


class EncoderGraphs:
    """`decode_encp` of one streamed row replayed from graphs (see the module's docstring): one runner
    per speed over (tokens, phonemes) buckets, static inputs per key. Not thread-safe (AcousticGraphs
    locks)."""

    def __init__(self, model: SynthesizerV3, device: torch.device, max_graphs: int = MAX_GRAPHS):
        self.model, self.device = model, device
        self.runners: dict[float, BucketedGraphRunner] = {}
        self._slots: dict[EncoderKey, _EncoderSlots] = {}
        self.budget = GraphBudget(max_graphs)  # keys captured or being captured by the current runners
        self._keys = self.budget.keys
        self._identity: tuple | None = None

    def runner(self, speed: float) -> BucketedGraphRunner:
        """The graphs of `speed` (made on first need); all are dropped when what the encoder runs changed."""
        identity = encoder_identity(self.model)
        if identity != self._identity:
            self.reset()
            self._identity = identity
        runner = self.runners.get(speed)
        if runner is None:
            keys = [
                (t, p) for t in range(TOKEN_BUCKET, MAX_TOKENS + 1, TOKEN_BUCKET)
                for p in range(PHONE_BUCKET, MAX_PHONES + 1, PHONE_BUCKET)
            ]  # fmt: skip
            step = lambda key: self._step((*key, speed))  # noqa: E731
            # one warm-up call: it does any per-shape set-up (cuDNN plans) before the capture
            runner = BucketedGraphRunner(step, keys, GraphPreset.LAZY, self.device)
            self.runners[speed] = runner
        return runner

    def reset(self) -> None:
        for runner in self.runners.values():
            runner.reset()
        self.runners.clear()
        self._keys.clear()

    @property
    def captured(self) -> list[EncoderKey]:
        return [(t, p, s) for s, r in self.runners.items() for t, p in r.captured_buckets]

    def replayable(self, key: EncoderKey) -> bool:
        """Whether `key` replays a graph (captured, or in range with room to capture it). Call it after
        `runner`, which drops the graphs if what the encoder runs changed."""

        def say(_: str) -> None:
            log.warning(
                "SoVITS encoder of %d tokens, %d phonemes (buckets) at speed %g runs eagerly: graphs hold "
                "<= %d tokens, <= %d phonemes, at most %d shapes (%d captured)",
                *key, MAX_TOKENS, MAX_PHONES, self.budget.max_graphs, len(self._keys),
            )  # fmt: skip

        return self.budget.why_eager(key, key[0] > MAX_TOKENS or key[1] > MAX_PHONES, say) is None

    def capture(self, key: EncoderKey) -> None:
        """Capture `key` now unless it is captured or refused (its warm-up and capture run on the full bucket)."""
        runner = self.runner(key[2])
        if self.replayable(key) and key not in self._keys:
            self._slots_of(key)  # allocated outside the capture, as every static input
            self._keys.add(key)
            runner.run(key[:2])

    def _slots_of(self, key: EncoderKey) -> _EncoderSlots:
        slots = self._slots.get(key)
        if slots is None:
            n_tokens, n_phones, speed = key
            ge_dim = self.model.arch.gin_channels
            w = self.model.bridge[0].weight
            content, _, mask = encp_lengths(n_tokens, speed)
            lengths = torch.tensor([n_tokens, n_phones, content, mask], device=w.device)  # the full bucket
            slots = _EncoderSlots(
                torch.zeros(1, 1, n_tokens, dtype=torch.long, device=w.device),
                torch.zeros(1, n_phones, dtype=torch.long, device=w.device),
                torch.zeros(1, ge_dim, 1, dtype=w.dtype, device=w.device),
                lengths,
                content,
            )
            self._slots[key] = slots
        return slots

    def _step(self, key: EncoderKey) -> torch.Tensor:
        s, resampled = self._slots_of(key), key[2] != 1
        n = s.lengths
        return self.model.decode_encp_masked(
            s.codes, n[0:1], s.text, n[1:2], s.ge, n[2:3] if resampled else None, s.n_content, n[3:4]
        )

    def encode(self, codes: torch.Tensor, text: torch.Tensor, ge: torch.Tensor, speed: float) -> torch.Tensor:
        """`decode_encp(codes [1, 1, n], text [1, P], ge [1, gin, 1], speed)` -> [1, inter2, L] (a copy),
        from the graph of the padded shape, or eagerly where the shape is out of range."""
        assert codes.shape[:2] == (1, 1), "one row of one codebook, as the streaming path encodes"
        n_tokens, n_phones = codes.shape[2], text.shape[1]
        key = encoder_key(n_tokens, n_phones, speed)
        runner = self.runner(key[2])  # the identity check walks the modules: once per call
        if not self.replayable(key):  # eager at a shape no graph holds: no cuDNN plans to build
            return without_cudnn(self.model.decode_encp)(codes, text, ge, speed)
        s = self._slots_of(key)
        s.codes.zero_()
        s.codes[:, :, :n_tokens].copy_(codes)
        s.text.zero_()
        s.text[:, :n_phones].copy_(text)
        s.ge.copy_(ge)
        content, n_fea, mask = encp_lengths(n_tokens, speed)
        for buf, value in zip(s.lengths, (n_tokens, n_phones, content, mask)):
            buf.fill_(value)  # a fill kernel per length: no host-to-device copy to wait for
        self._keys.add(key)
        return runner.run(key[:2])[:, :, :n_fea].clone()


@dataclass
class _RowSlots:
    """Static inputs of one (rows, tokens, phonemes, speed) graph (decode_encp_masked's layout)."""

    codes: torch.Tensor  # [1, R, T] long
    text: torch.Tensor  # [R, P] long
    ge: torch.Tensor  # [R, gin, 1]
    lengths: torch.Tensor  # [4, R] long: tokens, phonemes, content frames, wns1 mask frames
    n_content: int  # the resampled content frames of a full token bucket (the graph's static size)


class EncoderRowGraphs:
    """The stream engine's batched `decode_encp` replayed from graphs (module docstring): one runner
    per speed over (rows, tokens, phonemes) buckets, static inputs per key. Used by the engine's thread
    alone (its own graphs and pools, not the streaming path's `EncoderGraphs`)."""

    def __init__(
        self,
        model: SynthesizerV3,
        device: torch.device,
        max_graphs: int = MAX_ROW_GRAPHS,
        row_buckets: Sequence[int] = ENCODER_ROW_BUCKETS,
        max_row_tokens: int = MAX_ENCODER_ROW_TOKENS,
        capture_on_use: bool = True,
        token_buckets: Sequence[int] = ENGINE_TOKEN_BUCKETS,
        phone_buckets: Sequence[int] = ENGINE_PHONE_BUCKETS,
    ):
        self.model, self.device = model, device
        # False: only `capture` captures; another key runs eagerly ('not_captured'), since a capture in
        # the middle of a round (a warm-up with its cuDNN plans, then the capture) stalls every stream
        self.capture_on_use = capture_on_use
        self.row_buckets, self.max_row_tokens = tuple(sorted(row_buckets)), max_row_tokens
        assert self.row_buckets[0] == 1, "a batch of one window replays a graph too"
        self.token_buckets, self.phone_buckets = tuple(sorted(token_buckets)), tuple(sorted(phone_buckets))
        self.runners: dict[float, BucketedGraphRunner] = {}
        self._slots: dict[RowEncoderKey, _RowSlots] = {}
        self.budget = GraphBudget(max_graphs)  # keys captured or being captured by the current runners
        self._keys = self.budget.keys
        self._identity: tuple | None = None

    def check(self) -> None:
        """Drop every graph if what the encoder runs changed (walks the modules: once per batch)."""
        identity = encoder_identity(self.model)
        if identity != self._identity:
            for runner in self.runners.values():
                runner.reset()
            self.runners.clear()
            self._keys.clear()
            self._identity = identity

    def runner(self, speed: float) -> BucketedGraphRunner:
        runner = self.runners.get(speed)
        if runner is None:
            keys = [k[:3] for k in self.all_keys(speed)]
            step = lambda key: self._step((*key, speed))  # noqa: E731
            # one warm-up call: it does any per-shape set-up (cuDNN plans) before the capture
            runner = BucketedGraphRunner(step, keys, GraphPreset.LAZY, self.device)
            self.runners[speed] = runner
        return runner

    @property
    def captured(self) -> list[RowEncoderKey]:
        return [(r, t, p, s) for s, run in self.runners.items() for r, t, p in run.captured_buckets]

    @property
    def n_captured(self) -> int:
        return sum(run.n_captured for run in self.runners.values())

    def all_keys(self, speed: float) -> list[RowEncoderKey]:
        """Every graph at `speed`: each (row, token, phoneme) bucket whose rows x tokens fit max_row_tokens."""
        return [
            (r, t, p, float(speed)) for r in self.row_buckets for t in self.token_buckets for p in self.phone_buckets
            if r == 1 or r * t <= self.max_row_tokens
        ]  # fmt: skip

    def rows_per_call(self, n_tokens: int) -> int:
        """Most rows one graph holds when its longest prefix has n_tokens (rows x bucket bounded)."""
        t = pick_bucket(n_tokens, self.token_buckets)
        return max([r for r in self.row_buckets if r * t <= self.max_row_tokens], default=1)

    def is_in_range(self, n_tokens: int, n_phones: int) -> bool:
        """Whether a window of n_tokens, n_phones fits a graph at all (else it runs eagerly, 'too_long')."""
        return n_tokens <= self.token_buckets[-1] and n_phones <= self.phone_buckets[-1]

    def key(self, n_rows: int, n_tokens: int, n_phones: int, speed: float) -> RowEncoderKey:
        """The graph of n_rows windows (n_rows <= the largest row bucket) of <= n_tokens, <= n_phones
        (`is_in_range`)."""
        return (
            pick_bucket(n_rows, self.row_buckets), pick_bucket(n_tokens, self.token_buckets),
            pick_bucket(n_phones, self.phone_buckets), float(speed),
        )  # fmt: skip

    def eager_reason(self, key: RowEncoderKey) -> str | None:
        """None when `key` replays a graph (captured, or in range with room to capture it); else why its
        rows run eagerly: 'too_long' (past MAX_TOKENS / MAX_PHONES, or rows x tokens past max_row_tokens)
        or 'graph_limit' (max_graphs held), or 'not_captured' (capture_on_use off). Call `check` first."""
        reason = self._why_eager(key)
        if reason is None and not self.capture_on_use and key not in self._keys:
            return "not_captured"
        return reason

    def _why_eager(self, key: RowEncoderKey) -> str | None:
        r, t, p, _ = key
        too_many = t > self.token_buckets[-1] or p > self.phone_buckets[-1]
        is_long = too_many or (r > 1 and r * t > self.max_row_tokens)

        def say(_: str) -> None:
            log.warning(
                "stream engine: SoVITS encoder of %d rows, %d tokens, %d phonemes (buckets) at speed %g runs "
                "eagerly: graphs hold <= %d tokens, <= %d phonemes, rows x tokens <= %d, at most %d shapes "
                "(%d captured)", *key, self.token_buckets[-1], self.phone_buckets[-1], self.max_row_tokens,
                self.budget.max_graphs,
                len(self._keys),
            )  # fmt: skip

        return self.budget.why_eager(key, is_long, say)

    def capture(self, keys: Sequence[RowEncoderKey]) -> list[RowEncoderKey]:
        """Capture `keys` now (each once, unless refused; largest first: later captures reuse the pool's
        memory) -> the keys captured now or before."""
        self.check()
        for key in sorted(keys, key=lambda k: (k[3], -k[0] * k[1], -k[2])):
            if self._why_eager(key) is None and key not in self._keys:
                self._slots_of(key)  # allocated outside the capture, as every static input
                self._keys.add(key)
                self.runner(key[3]).run(key[:3])
        return sorted(set(keys) & set(self.captured))

    def _slots_of(self, key: RowEncoderKey) -> _RowSlots:
        slots = self._slots.get(key)
        if slots is None:
            n_rows, n_tokens, n_phones, speed = key
            w = self.model.bridge[0].weight
            content, _, mask = encp_lengths(n_tokens, speed)
            lengths = torch.tensor([[n_tokens], [n_phones], [content], [mask]], device=w.device)
            slots = _RowSlots(
                torch.zeros(1, n_rows, n_tokens, dtype=torch.long, device=w.device),
                torch.zeros(n_rows, n_phones, dtype=torch.long, device=w.device),
                torch.zeros(n_rows, self.model.arch.gin_channels, 1, dtype=w.dtype, device=w.device),
                lengths.expand(4, n_rows).contiguous(),  # the full bucket, in every row
                content,
            )
            self._slots[key] = slots
        return slots

    def _step(self, key: RowEncoderKey) -> torch.Tensor:
        s, resampled = self._slots_of(key), key[3] != 1
        n = s.lengths
        return self.model.decode_encp_masked(
            s.codes, n[0], s.text, n[1], s.ge, n[2] if resampled else None, s.n_content, n[3]
        )

    def encode(
        self, rows: Sequence[tuple[torch.Tensor, torch.Tensor, torch.Tensor]], speed: float
    ) -> list[torch.Tensor]:
        """rows: (tokens [T], phonemes [P], ge [1, gin, 1]) at one speed, for whose key `eager_reason`
        said None -> each row's `decode_encp` [1, inter2, n] (views of one copy), from one replay of the
        (row bucket, tokens, phonemes, speed) graph. Padded rows: zero tokens, phonemes and style, with
        the full bucket's lengths (what the capture saw)."""
        key = self.key(len(rows), max(len(t) for t, _, _ in rows), max(len(p) for _, p, _ in rows), speed)
        s = self._slots_of(key)
        s.codes.zero_()
        s.text.zero_()
        full = (key[1], key[2], s.n_content, encp_lengths(key[1], speed)[2])  # a padded row's lengths
        lengths = [[value] * key[0] for value in full]
        n_fea = []
        for i, (tokens, phones, _) in enumerate(rows):
            s.codes[0, i, : len(tokens)] = tokens
            s.text[i, : len(phones)] = phones
            content, n, mask = encp_lengths(len(tokens), speed)
            for j, value in enumerate((len(tokens), len(phones), content, mask)):
                lengths[j][i] = value
            n_fea.append(n)
        s.ge[: len(rows)] = torch.cat([ge for _, _, ge in rows])
        s.ge[len(rows) :].zero_()
        host = torch.tensor(lengths, dtype=torch.long)
        if s.lengths.is_cuda:
            host = host.pin_memory()  # an async copy: no wait for the GPU's queue
        s.lengths.copy_(host, non_blocking=True)
        self._keys.add(key)
        fea = self.runner(speed).run(key[:3])[: len(rows)].clone()
        return [fea[i : i + 1, :, :n] for i, n in enumerate(n_fea)]
