"""Padded, masked prefill of T2S prompts into static KV-cache rows: a capturable unit per length bucket.

The eager prefill (`decode.encode_prompt`) runs the prompt at its exact length, so every length is a new
shape: ~400 kernel launches from the host per prompt, then 2 x n_layer copies into the cache. Here a
prompt is laid out as [phonemes | prompt tokens | padding] in a bucket of `n_slots` positions
(multiples of PREFILL_BUCKET up to the engine's prompt room), and every length the computation depends on
is a device tensor (n_text, n_audio per row), so one CUDA graph per (rows, n_slots) serves every prompt
of that bucket:
- embeddings: phonemes (+ BERT, + text positions) where t < n_text, tokens (+ audio positions t - n_text)
  where n_text <= t < n_text + n_audio, chosen per position on the device;
- attention mask from the lengths (`prompt_mask`): `model.prompt_attention` on the real positions, padded
  keys never attended by real queries (padded queries see the real keys and themselves, so they stay
  finite: a fully masked row would give NaN, and NaN in a padded K/V slot would poison decode's
  0-weighted sum over it);
- each layer's K/V written straight into the cache rows `rows`, slots [0, n_slots); decode ignores slots
  at or beyond a row's length (`kv_cache.step_mask`, the kernels' n_valid) and overwrites slot `length`
  first, so the padding's K/V never matters;
- the next-token logits gathered at the last real position, and the rows' cache lengths set, on the device.
The unit is written for R rows, each with its own lengths and destination row (distinct: index_copy_ with
a repeated row is a race, unless both write the same values). `load` keys its graphs on the exact row
count, from `row_counts` (a single-stream decoder loads one row: (1,)); `load_padded` fills a call of the
smallest row count that holds its prompts with copies of the last one (same destination, same values), so
an owner with one row count runs every prompt at the same shape however many share the call.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F

from voicehub.models.gpt_sovits.t2s.config import BERT_DIM
from voicehub.models.gpt_sovits.t2s.model import T2SModel
from voicehub.runtime.cuda_graphs import BucketedGraphRunner, GraphPreset, parse_graph_preset
from voicehub.runtime.kv_cache import StaticKVCache, pick_bucket

PREFILL_BUCKET = 64  # prompt positions per length bucket (a multiple of 16: aligned attention tiles)
# Buckets `minimal` captures at load: prompts of a 3-10 s reference (75-250 tokens) with its phonemes and a
# short-to-medium sentence (40-200 phonemes) fall in 128-448; the e2e workload (150 tokens + 80 phonemes
# with the sentence's) is 256. The rest is captured on first use.
COMMON_PREFILL_SLOTS = (128, 192, 256, 320, 384, 448)


def prefill_buckets(prompt_room: int, step: int = PREFILL_BUCKET) -> tuple[int, ...]:
    """Length buckets of the padded prefill: multiples of `step` up to `prompt_room` (itself the last)."""
    if prompt_room < 1 or step < 1:
        raise ValueError(f"prompt_room and step must be >= 1, got {prompt_room}, {step}")
    return tuple(sorted({*range(step, prompt_room, step), prompt_room}))


@dataclass
class PrefillBuffers:
    """Static inputs and outputs of the padded prefill for up to R rows, S positions (allocated once).

    phone_ids, audio_ids: [R, S] long (phoneme ids at positions [0, n_text), prompt tokens at
    [n_text, n_text + n_audio); other entries are read but never used); bert: [R, 1024, S] in the model
    dtype; n_text, n_audio, rows (destination cache row): [R] long; logits: [R, V] the output."""

    phone_ids: torch.Tensor
    audio_ids: torch.Tensor
    bert: torch.Tensor
    n_text: torch.Tensor
    n_audio: torch.Tensor
    rows: torch.Tensor
    logits: torch.Tensor

    @classmethod
    def allocate(
        cls, n_rows: int, n_slots: int, vocab_size: int, dtype: torch.dtype, device: torch.device
    ) -> PrefillBuffers:
        def longs(*shape: int) -> torch.Tensor:
            return torch.zeros(shape, dtype=torch.long, device=device)

        bert = torch.zeros(n_rows, BERT_DIM, n_slots, dtype=dtype, device=device)
        logits = torch.zeros(n_rows, vocab_size, dtype=dtype, device=device)
        n_text = torch.ones(n_rows, dtype=torch.long, device=device)  # never 0: every query sees a key
        rows = torch.arange(n_rows, device=device)
        return cls(longs(n_rows, n_slots), longs(n_rows, n_slots), bert, n_text, longs(n_rows), rows, logits)

    def narrow(self, n_rows: int) -> PrefillBuffers:
        """Rows [0, n_rows), sharing storage (a batch bucket)."""
        return PrefillBuffers(*(getattr(self, f.name)[:n_rows] for f in fields(self)))


def prompt_mask(n_text: torch.Tensor, n_audio: torch.Tensor, n_slots: int) -> torch.Tensor:
    """bool [R, 1, S, S], True = may attend, from n_text, n_audio [R] long (on their device, no sync).
    Real queries: `model.prompt_attention` (phonemes see all phonemes; tokens see all phonemes and earlier
    tokens); no real query sees a padded key. Padded queries see the real keys and themselves."""
    pos = torch.arange(n_slots, device=n_text.device)
    t, k = pos[:, None], pos[None, :]  # query, key: [S, 1], [1, S]
    n_text, n_real = n_text[:, None, None], (n_text + n_audio)[:, None, None]  # [R, 1, 1]
    sees_text = k < n_text
    sees_earlier = (t >= n_text) & (k <= t) & (k < n_real)
    return (sees_text | sees_earlier | (t == k))[:, None]


def embed_prompts(model: T2SModel, buf: PrefillBuffers, n_slots: int) -> torch.Tensor:
    """[phonemes | tokens | padding] embedded with upstream's positions: [R, S, D] (`encode_prompt`'s xy,
    padded). Each position's value is computed as embed_text / embed_audio compute it."""
    text_pos, audio_pos = model.ar_text_position, model.ar_audio_position
    assert n_slots <= text_pos.pe.shape[0], "prefill buckets stay within the sinusoid table"
    pos = torch.arange(n_slots, device=buf.n_text.device)[None]  # [1, S]
    is_text = pos < buf.n_text[:, None]  # [R, S]
    text = model.ar_text_embedding(buf.phone_ids[:, :n_slots])
    text = text + model.bert_proj(buf.bert[:, :, :n_slots].transpose(1, 2))
    text = text + text_pos.alpha * text_pos.pe[:n_slots]
    audio_at = (pos - buf.n_text[:, None]).clamp(min=0)  # [R, S]: a token's position among the tokens
    audio = model.ar_audio_embedding(buf.audio_ids[:, :n_slots]) + audio_pos.alpha * audio_pos.pe[audio_at]
    return torch.where(is_text[..., None], text, audio)


def prefill_rows(model: T2SModel, cache: StaticKVCache, buf: PrefillBuffers, n_slots: int) -> torch.Tensor:
    """The capturable unit: prefill R prompts padded to n_slots positions into cache rows `buf.rows`.

    Writes each layer's K/V at slots [0, n_slots) of those rows, sets their lengths to n_text + n_audio and
    returns buf.logits [R, V], the next-token logits at each row's last real position. Only device
    tensors are read; n_slots is the one static choice (the bucket), so a graph per bucket replays it."""
    x = embed_prompts(model, buf, n_slots)  # [R, S, D]
    mask = prompt_mask(buf.n_text, buf.n_audio, n_slots)
    for i, layer in enumerate(model.h.layers):
        q, k, v = layer.project_qkv(x)  # [R, H, S, D/H]
        cache.k[i, :, :, :n_slots].index_copy_(0, buf.rows, k)
        cache.v[i, :, :, :n_slots].index_copy_(0, buf.rows, v)
        # the attention of `T2SModel.prefill` (the eager path), with the padded keys masked: keep them one
        x = layer.finish(x, F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    n_real = buf.n_text + buf.n_audio
    cache.lengths.index_copy_(0, buf.rows, n_real)
    last = (n_real - 1)[:, None, None].expand(-1, 1, x.shape[2])  # [R, 1, D]
    buf.logits.copy_(model.logits(x.gather(1, last)[:, 0]))
    return buf.logits


class PaddedPrefill:
    """Owns the padded prefill of one model into one static KV cache: its buffers and its graphs, one per
    (rows, length bucket) key, captured as `preset` says (`full`: every key at construction; `minimal`:
    one row and COMMON_PREFILL_SLOTS; `lazy`: each on first use; `off`: eager calls of the same unit).

    `load(rows, prompts)` writes prompts into cache rows and returns their first logits. The unit is a pure
    function of its input buffers (it writes the same K/V, lengths and logits each call), so capture
    warm-ups, even on first use mid-run, leave nothing behind but what the load itself writes."""

    def __init__(
        self,
        model: T2SModel,
        cache: StaticKVCache,
        prompt_room: int,
        preset: GraphPreset | str,
        row_counts: tuple[int, ...] = (1,),
        bucket: int = PREFILL_BUCKET,
    ):
        self.model, self.cache = model, cache
        w = model.ar_predict_layer.weight
        self.buckets = prefill_buckets(min(prompt_room, cache.max_slots), bucket)
        self.row_counts = tuple(sorted(row_counts))
        if self.row_counts[-1] > cache.batch:
            # the buffers' destination rows start as 0..n-1: a capture's warm-up would write past the cache
            raise ValueError(f"row_counts {self.row_counts}: the cache holds {cache.batch} rows")
        self.buf = PrefillBuffers.allocate(
            self.row_counts[-1], self.buckets[-1], model.config.vocab_size, w.dtype, w.device
        )
        keys = [(r, s) for r in self.row_counts for s in self.buckets]
        common = [(self.row_counts[0], s) for s in COMMON_PREFILL_SLOTS if s in self.buckets]
        self.graphs = BucketedGraphRunner(
            self._unit, keys, preset, w.device, common_buckets=common or keys[:1]
        )

    @property
    def prompt_room(self) -> int:
        return self.buckets[-1]

    def _unit(self, key: tuple[int, int]) -> torch.Tensor:
        n_rows, n_slots = key
        return prefill_rows(self.model, self.cache, self.buf.narrow(n_rows), n_slots)

    def capture_at_load(self, preset: GraphPreset | str | None = None) -> None:
        """Capture what `preset` (default: the one given at construction) captures at load: keys already
        captured (on first use) are kept. The preset is the owner's, which may set it after construction."""
        if preset is not None:
            self.graphs.preset = parse_graph_preset(preset)
        self.graphs.capture_at_load()

    def load(
        self, rows: list[int], prompts: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
    ) -> torch.Tensor:
        """Prefill prompts (phone_ids [Tx] long, bert [1024, Tx], tokens [Ty] long, on the device) into
        cache `rows` (one each, distinct, len(rows) one of `row_counts`); returns their next-token logits
        [n, V] (a view of the static output: read it before the next load). Sets the rows' cache lengths;
        touches no other row."""
        if len(rows) not in self.row_counts:
            raise ValueError(
                f"{len(rows)} prompts at once; this prefill takes {self.row_counts} (exact row counts)"
            )
        return self.load_padded(rows, prompts)  # an exact row count: no padding rows

    def load_padded(
        self, rows: list[int], prompts: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
    ) -> torch.Tensor:
        """`load` for 1..max(row_counts) prompts, run at the smallest row count that holds them: the padding
        rows repeat the last prompt and its destination row (the same values written twice). A prompt's
        numbers then depend only on that row count and its length bucket, so a caller that groups prompts
        by `bucket_of` and keeps one row count gets the same K/V and logits for a prompt alone or in a group.
        Prompts on the host fill each buffer with one copy from pinned memory (no wait for the device's
        queue). Returns logits [len(rows), V] (a view of the static output: read it before the next load)."""
        n = len(rows)
        assert n == len(prompts) and len(set(rows)) == n, "one prompt per distinct row"
        n_call = next((c for c in self.row_counts if c >= n), None)
        if n == 0 or n_call is None:
            raise ValueError(f"{n} prompts at once; this prefill takes 1..{self.row_counts[-1]}")
        n_slots = self.bucket_of(max(p.shape[0] + t.shape[0] for p, _, t in prompts))
        pad = n_call - n
        self._fill(rows + rows[-1:] * pad, prompts + prompts[-1:] * pad, n_slots)
        return self.graphs.run((n_call, n_slots))[:n]

    def bucket_of(self, n_real: int) -> int:
        """The length bucket of a prompt of n_real positions (ValueError beyond the room)."""
        if n_real > self.prompt_room:
            raise ValueError(
                f"prompt of {n_real} positions exceeds the padded prefill's room of {self.prompt_room}"
            )
        return pick_bucket(n_real, self.buckets)

    def _fill(
        self, rows: list[int], prompts: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]], n_slots: int
    ) -> None:
        buf = self.buf.narrow(len(rows))
        device = buf.rows.device
        lengths = torch.tensor([[p.shape[0], t.shape[0], row] for row, (p, _, t) in zip(rows, prompts)])
        if device.type != "cuda" or any(x.is_cuda for prompt in prompts for x in prompt):
            for r, (phone_ids, bert, tokens) in enumerate(prompts):  # row by row, on the device
                n_text, n_audio = phone_ids.shape[0], tokens.shape[0]
                buf.phone_ids[r, :n_text] = to_device(phone_ids, device)
                buf.bert[r, :, :n_text] = to_device(bert, device)
                buf.audio_ids[r, n_text : n_text + n_audio] = to_device(tokens, device)
        else:  # laid out on the host, one copy per buffer; bert in float32 (cast on the device), only as
            # wide as the longest phonemes: its columns past a row's n_text are never used
            phone = torch.zeros(len(rows), n_slots, dtype=torch.long)
            n_bert = max(p.shape[0] for p, _, _ in prompts)
            audio, bert_host = torch.zeros_like(phone), torch.zeros(len(rows), BERT_DIM, n_bert)
            for r, (phone_ids, bert, tokens) in enumerate(prompts):
                n_text, n_audio = phone_ids.shape[0], tokens.shape[0]
                phone[r, :n_text], bert_host[r, :, :n_text] = phone_ids, bert
                audio[r, n_text : n_text + n_audio] = tokens
            buf.phone_ids[:, :n_slots] = to_device(phone, device)
            buf.audio_ids[:, :n_slots] = to_device(audio, device)
            buf.bert[:, :, :n_bert] = to_device(bert_host, device)
        lengths = to_device(lengths, device)
        buf.n_text.copy_(lengths[:, 0])
        buf.n_audio.copy_(lengths[:, 1])
        buf.rows.copy_(lengths[:, 2])


def to_device(x: torch.Tensor, device: torch.device) -> torch.Tensor:
    """x on `device`; from the host to CUDA through pinned memory, without waiting for the device's queue
    (a copy from pageable memory waits for it)."""
    if x.device == device:
        return x
    if device.type == "cuda" and x.device.type == "cpu":
        return x.pin_memory().to(device, non_blocking=True)
    return x.to(device)
