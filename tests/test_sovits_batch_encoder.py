"""The SoVITS v3 encoder of many windows in one right-padded call (`decode_encp_padded`, `encode_rows`)
against `decode_encp` of each row alone, on the tiny `make-checkpoint` set, CPU, fp32.

Rows differ in token count, phoneme count, speed and style; each padded row must equal its solo call
within fp32 rounding (padded BLAS/conv calls and softmaxes over masked zeros reorder a few sums), and
the same batch with its masks widened to the padded length must not.
"""

from __future__ import annotations

import pytest
import torch

from voicehub.models.gpt_sovits.batch_acoustic import EncoderRow, encode_rows
from voicehub.models.gpt_sovits.sovits import load_sovits_v3

ATOL = 2e-6  # fp32 features of size O(1); seen: <= 2e-7
ROWS = [(9, 14, 1.0), (25, 6, 1.0), (4, 20, 1.25), (16, 11, 0.8)]  # (tokens, phonemes, speed)


@pytest.fixture(scope="module")
def sovits(tiny_set):
    return load_sovits_v3(tiny_set / "sovits.pth").eval()


def _rows(sovits) -> list[EncoderRow]:
    g = torch.Generator().manual_seed(3)
    a = sovits.arch
    return [
        EncoderRow(
            owner=i,
            tokens=torch.randint(0, a.n_bins, (n_tokens,), generator=g),
            phones=torch.randint(1, a.n_symbols, (n_phones,), generator=g),
            ge=torch.randn(1, a.gin_channels, 1, generator=g),  # one style per row
            speed=speed,
        )
        for i, (n_tokens, n_phones, speed) in enumerate(ROWS)
    ]


def _solo(sovits, row: EncoderRow) -> torch.Tensor:
    return sovits.decode_encp(row.tokens[None, None], row.phones[None], row.ge, row.speed)


def test_padded_rows_equal_each_row_alone(sovits):
    rows = _rows(sovits)
    got, calls = encode_rows(sovits, rows)
    assert calls.eager == {"no_graphs": len(rows)}  # no graphs given: every row ran eagerly, and is said so
    for row, fea in zip(rows, got):
        want = _solo(sovits, row)
        assert fea.shape == want.shape, row.owner
        torch.testing.assert_close(fea, want, atol=ATOL, rtol=1e-5, msg=f"row {row.owner}")
    # one row alone is decode_encp itself, bit for bit
    assert torch.equal(encode_rows(sovits, rows[:1])[0][0], _solo(sovits, rows[0]))


def test_the_check_fails_without_the_masks(sovits):
    """The same padded batch with every row's lengths set to the padded length (padding taken for
    content): rows shorter than the longest no longer equal their solo calls."""
    rows = _rows(sovits)
    n_tok, n_ph = max(len(r.tokens) for r in rows), max(len(r.phones) for r in rows)
    codes = torch.zeros(1, len(rows), n_tok, dtype=torch.long)
    text = torch.zeros(len(rows), n_ph, dtype=torch.long)
    for i, r in enumerate(rows):
        codes[0, i, : len(r.tokens)], text[i, : len(r.phones)] = r.tokens, r.phones
    ge, speeds = torch.cat([r.ge for r in rows]), [r.speed for r in rows]
    masked, lengths = sovits.decode_encp_padded(
        codes, [len(r.tokens) for r in rows], text, [len(r.phones) for r in rows], ge, speeds
    )
    unmasked, _ = sovits.decode_encp_padded(codes, [n_tok] * len(rows), text, [n_ph] * len(rows), ge, speeds)
    for i, (row, n) in enumerate(zip(rows, lengths)):
        want = _solo(sovits, row)
        assert (masked[i : i + 1, :, :n] - want).abs().max() < ATOL
        if len(row.tokens) < n_tok:  # every padded row here is also padded in phonemes
            assert (unmasked[i : i + 1, :, :n] - want).abs().max() > 100 * ATOL, i
