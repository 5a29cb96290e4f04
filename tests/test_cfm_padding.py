"""CFM rows of different lengths in one right-padded batch (the serving engine's CFM batches): with a
mask, a row's valid frames come out as they do alone, whatever the padding holds."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from voicehub.models.gpt_sovits.batch_acoustic import CfmPiece, solve_pieces
from voicehub.models.gpt_sovits.cfm import solve
from voicehub.models.gpt_sovits.sovits import load_sovits_v3, make_sovits_checkpoint

LENGTHS = (37, 50, 23)
ATOL = 2e-5  # fp32: the padded batch reorders a few sums


@pytest.fixture(scope="module")
def estimator(tmp_path_factory):
    path = make_sovits_checkpoint(tmp_path_factory.mktemp("cfm") / "s2Gv3.pth", "tiny", seed=0)
    return load_sovits_v3(path).eval().cfm.estimator


def _rows(estimator, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    mel, text = estimator.proj_out.out_features, estimator.text_embed.freqs_cis.shape[1]
    return [
        (
            torch.randn(1, n, mel, generator=g),
            torch.randn(1, n, mel, generator=g),
            torch.randn(1, n, text, generator=g),
        )
        for n in LENGTHS
    ]


def _velocity(estimator, x, cond, mu, mask=None):
    b = x.shape[0]
    text_emb, d_emb = estimator.condition(mu, torch.full((b,), 0.25), mask)
    return estimator(x, cond, text_emb, torch.full((b,), 0.5), d_emb, mask)


def _padded(tensors, n: int, fill: float) -> torch.Tensor:
    return torch.cat([F.pad(t, (0, 0, 0, n - t.shape[1]), value=fill) for t in tensors])


@pytest.mark.parametrize("fill", [0.0, 3.0], ids=["zeros", "garbage"])
def test_masked_rows_equal_each_row_alone(estimator, fill):
    rows = _rows(estimator)
    n = max(LENGTHS)
    mask = torch.stack([torch.arange(n) < length for length in LENGTHS])
    with torch.no_grad():
        alone = [_velocity(estimator, *row)[0] for row in rows]
        batch = _velocity(estimator, *(_padded([r[k] for r in rows], n, fill) for k in range(3)), mask)
        unmasked = _velocity(estimator, *(_padded([r[k] for r in rows], n, fill) for k in range(3)))
    for i, length in enumerate(LENGTHS):
        assert (batch[i, :length] - alone[i]).abs().max() < ATOL, i
    # Without the mask the padding leaks into the shorter rows' valid frames: the test can fail.
    assert (unmasked[2, : LENGTHS[2]] - alone[2]).abs().max() > 1e-3


def test_solve_pieces_of_other_prompts_and_lengths_equal_solve_alone(estimator):
    """The engine's CFM batch: rows with their own prompt length and frame count, right-padded."""
    g = torch.Generator().manual_seed(1)
    mel, text = estimator.proj_out.out_features, estimator.text_embed.freqs_cis.shape[1]
    shapes = [(12, 37), (20, 50), (5, 23)]  # (prompt frames, all frames)
    pieces = [
        CfmPiece(
            None,
            torch.randn(n, text, generator=g),
            torch.randn(mel, p, generator=g),
            torch.randn(mel, n, generator=g),
            3,
        )
        for p, n in shapes
    ]
    with torch.no_grad():
        batch = solve_pieces(estimator, pieces)
        for piece, got in zip(pieces, batch):
            alone = solve(estimator, piece.mu[None], piece.prompt[None], piece.noise[None], 3)
            p = piece.prompt.shape[1]
            assert got.shape == (1, mel, piece.n_frames - p)
            assert (got - alone[:, :, p:]).abs().max() < ATOL
