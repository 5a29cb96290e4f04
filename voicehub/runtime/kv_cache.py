"""A preallocated key/value cache with explicit per-sequence lengths, for static-shape decoding.

Storage is allocated once for (layers, batch rows, heads, max slots, head dim). Each row's number of
valid slots lives in `lengths` (a device tensor the decode step reads and advances without a host
sync); the owner also tracks lengths on the host, and never infers them from buffer contents.
Attention in a step only looks at the first `n_slots` slots (a bucket) and masks slots at or beyond
each row's length, so padded or stale slots never enter attention.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def round_up(n: int, step: int) -> int:
    """The smallest multiple of `step` that is >= n (a bucket with no largest size)."""
    return -(-n // step) * step


def pick_bucket(n_slots_needed: int, buckets: Sequence[int]) -> int:
    """The smallest bucket holding `n_slots_needed` slots; ValueError if none does."""
    for size in sorted(buckets):
        if size >= n_slots_needed:
            return size
    raise ValueError(
        f"a sequence needs {n_slots_needed} KV slots, more than the largest bucket {max(buckets)}; "
        "raise max_seq_len / the bucket sizes in the engine config"
    )


class StaticKVCache:
    """k, v: [n_layer, batch, n_head, max_slots, head_dim]; lengths: [batch] long (valid slots per row)."""

    def __init__(
        self,
        n_layer: int,
        batch: int,
        n_head: int,
        max_slots: int,
        head_dim: int,
        *,
        device: torch.device | str,
        dtype: torch.dtype,
    ):
        shape = (n_layer, batch, n_head, max_slots, head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.lengths = torch.zeros(batch, dtype=torch.long, device=device)
        self._rows = torch.arange(batch, device=device)
        self._slots = torch.arange(max_slots, device=device)

    def narrow(self, n_rows: int) -> StaticKVCache:
        """A view of rows [0, n_rows) sharing storage: a batch bucket for a smaller step."""
        view = object.__new__(StaticKVCache)
        view.k, view.v, view.lengths = self.k[:, :n_rows], self.v[:, :n_rows], self.lengths[:n_rows]
        view._rows, view._slots = self._rows[:n_rows], self._slots
        return view

    @property
    def batch(self) -> int:
        return self.k.shape[1]

    @property
    def max_slots(self) -> int:
        return self.k.shape[3]

    def reset_row(self, row: int) -> None:
        """Free a row; its old contents stay in memory but are masked out by length 0."""
        # a slice, not lengths[row]: a 0-dim CUDA element set from a Python number is a blocking copy
        self.lengths[row : row + 1] = 0

    def fill_row(self, layer: int, row: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write a prompt's keys/values into slots [0, T) of one row. k, v: [n_head, T, head_dim].
        Call for every layer, then `set_length(row, T)`."""
        n = k.shape[1]
        if n > self.max_slots:
            raise ValueError(f"prompt of {n} tokens does not fit a KV cache of {self.max_slots} slots")
        self.k[layer, row, :, :n] = k
        self.v[layer, row, :, :n] = v

    def set_length(self, row: int, n_valid: int) -> None:
        self.lengths[row : row + 1] = n_valid  # a fill kernel, no wait for the device (see reset_row)

    def step_mask(self, n_slots: int) -> torch.Tensor:
        """bool [batch, 1, 1, n_slots]: slots a new token at position `lengths` may attend to,
        itself included (so a row is never fully masked)."""
        return (self._slots[:n_slots].unsqueeze(0) <= self.lengths.unsqueeze(1))[:, None, None, :]

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write each row's new key/value at slot `lengths[row]`. k, v: [batch, n_head, head_dim].
        Lengths advance once per step, after all layers (`advance`)."""
        self.k[layer, self._rows, :, self.lengths] = k
        self.v[layer, self._rows, :, self.lengths] = v

    def view(self, layer: int, n_slots: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of the first n_slots slots: [batch, n_head, n_slots, head_dim] each."""
        return self.k[layer, :, :, :n_slots], self.v[layer, :, :, :n_slots]

    def advance(self, active: torch.Tensor | None = None) -> None:
        """lengths += 1 for active rows (bool [batch]); all rows when None. In place, no host sync."""
        self.lengths.add_(1 if active is None else active.long())
