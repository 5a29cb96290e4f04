"""The per-sentence path's CFM at frame buckets (cfm/solver.py `solve_bucketed`) on tiny files, CPU fp32.

cuDNN builds plans per input shape, so a sentence of a never-seen length paid ~200 ms per DiT shape on
the H200. Bucketed, every chunk is right-padded to a multiple of FRAME_BUCKET frames and masked: the mel
equals the unpadded solve's up to float rounding, the noise draws are the same, and the DiT sees at most
one shape per bucket, the streamed path's CFM graph shapes. The SoVITS encoder likewise runs at the stream's
(token, phoneme) buckets (encoder_graphs.py `decode_encp_bucketed`): its features equal `decode_encp`'s up to
float rounding, and the encoder sees bucket multiples only.
"""

from __future__ import annotations

import pytest
import torch
from gpt_sovits_fixtures import REFERENCE_TEXT, random_reference, random_target

from voicehub.models.gpt_sovits import Voice, load
from voicehub.models.gpt_sovits.acoustic_graphs import CFM_FRAME_BUCKET, cfm_frame_buckets
from voicehub.models.gpt_sovits.cfm.solver import FRAME_BUCKET, padded_frames, solve, solve_bucketed
from voicehub.models.gpt_sovits.encoder_graphs import (
    MAX_PHONES,
    MAX_TOKENS,
    PHONE_BUCKET,
    TOKEN_BUCKET,
    decode_encp_bucketed,
)
from voicehub.models.gpt_sovits.params import GptSovitsParams
from voicehub.models.gpt_sovits.sovits import (
    decode_mel,
    load_sovits_v3,
    make_sovits_checkpoint,
)
from voicehub.models.gpt_sovits.sovits.synth import T_CHUNK
from voicehub.runtime.kv_cache import pick_bucket
from voicehub.text.options import Language

ENCODER_ATOL = 2e-6  # fp32 features of size O(1), as the streamed encoder graphs' test (seen: <= 2e-7)
RTOL = 1e-5  # max abs difference over the mel's largest magnitude (fp32: masked sums reorder a little)
PROMPT_TOKENS = 40  # the reference: floor(3.75 * 40) = 150 prompt frames


@pytest.fixture(scope="module")
def sovits(tmp_path_factory):
    d = tmp_path_factory.mktemp("buckets")
    return load_sovits_v3(make_sovits_checkpoint(d / "s2Gv3.pth", "tiny", seed=0))


@pytest.fixture(scope="module")
def prompt(sovits):
    return random_reference(sovits, PROMPT_TOKENS)


def _mel(sovits, prompt, n_tokens: int, solver, steps: int = 2, encoder=None, speed=1.0) -> torch.Tensor:
    codes, phones = random_target(sovits, n_tokens, seed=n_tokens)
    gen = torch.Generator().manual_seed(5)
    return decode_mel(
        sovits, prompt, codes, phones, steps, speed=speed, generator=gen, solver=solver, encoder=encoder
    )


def _encoder_shapes(sovits) -> tuple[list[tuple[int, int, int]], list]:
    """(content frames, phonemes) of every text encoder forward (y: [B, ssl, 2T], text: [B, P]) and the
    feature frames of every wns1 forward (fea: [B, inter2, N]), via hooks."""
    seen: list[tuple[int, ...]] = []
    hooks = [
        sovits.enc_p.register_forward_hook(lambda _m, a, _o: seen.append((a[0].shape[2], a[2].shape[1]))),
        sovits.wns1.register_forward_hook(lambda _m, a, _o: seen.append((a[0].shape[2],))),
    ]
    return seen, hooks


def _dit_frames(estimator) -> tuple[list[int], torch.utils.hooks.RemovableHandle]:
    """Frame counts of every DiT forward (x: [B, N, mel]) and of every text embedding, via hooks."""
    seen: list[int] = []
    hooks = [
        estimator.register_forward_hook(lambda _m, args, _out: seen.append(args[0].shape[1])),
        estimator.text_embed.register_forward_hook(lambda _m, args, _out: seen.append(args[0].shape[1])),
    ]
    return seen, hooks


# 13, 21, 50 tokens: one chunk of 198, 228, 337 frames; 300: two chunks (934 and 491 frames, the
# second prompted by the first's output), none a bucket multiple.
@pytest.mark.parametrize("n_tokens", [13, 21, 50, 300])
def test_bucketed_mel_equals_the_unpadded_solve(sovits, prompt, n_tokens):
    exact = _mel(sovits, prompt, n_tokens, solve)
    bucketed = _mel(sovits, prompt, n_tokens, solve_bucketed)
    assert bucketed.shape == exact.shape == (1, 100, int(n_tokens * 3.75))
    diff = (bucketed - exact).abs().max() / exact.abs().max()
    assert diff < RTOL, f"{n_tokens} tokens: max abs diff {diff:.2e} of the mel's scale"


def test_dit_shapes_are_bounded_by_the_buckets(sovits, prompt):
    lengths = [5, 9, 17, 23, 31, 47, 61, 77, 90, 111, 140, 170]  # 150 prompt + 18 .. 637 frames
    est = sovits.cfm.estimator
    frames = {}
    for name, solver in (("exact", solve), ("bucketed", solve_bucketed)):
        seen, hooks = _dit_frames(est)
        try:
            for n in lengths:
                _mel(sovits, prompt, n, solver, steps=1)
        finally:
            for h in hooks:
                h.remove()
        frames[name] = set(seen)
    # The hooks see every length unpadded (so they would see a leak), and only bucket shapes bucketed.
    assert len(frames["exact"]) == len(lengths)
    assert frames["bucketed"] <= set(cfm_frame_buckets())
    spanned = {padded_frames(PROMPT_TOKENS * 15 // 4 + n * 15 // 4) for n in lengths}
    assert frames["bucketed"] == spanned and len(spanned) < len(lengths)


def test_buckets_are_the_streamed_graphs_buckets():
    assert FRAME_BUCKET == CFM_FRAME_BUCKET
    buckets = cfm_frame_buckets()
    assert all(padded_frames(n) == pick_bucket(n, buckets) for n in range(1, T_CHUNK + 1))


def test_rows_and_frames_past_the_largest_bucket(sovits):
    """Two rows of 1000 frames (past the graphs' 960): a multiple of the bucket all the same."""
    est = sovits.cfm.estimator
    g = torch.Generator().manual_seed(3)
    n, p = 1000, 100
    mu = torch.randn(2, n, est.text_embed.freqs_cis.shape[1], generator=g)
    prompt = torch.randn(2, sovits.arch.mel_dim, p, generator=g)
    noise = torch.randn(2, sovits.arch.mel_dim, n, generator=g)
    seen, hooks = _dit_frames(est)
    try:
        with torch.no_grad():
            out = solve_bucketed(est, mu, prompt, noise, 2)
    finally:
        for h in hooks:
            h.remove()
    with torch.no_grad():
        want = solve(est, mu, prompt, noise, 2)
    assert set(seen) == {1024}
    assert out.shape == want.shape and torch.count_nonzero(out[..., :p]) == 0
    assert (out - want).abs().max() / want.abs().max() < RTOL


def test_the_pipeline_solves_sentences_at_buckets(tiny_set, reference_wav):
    pipe = load(tiny_set).pipeline
    ref = pipe.reference(Voice(reference_wav, REFERENCE_TEXT, "en"))
    sentence = pipe.text_features("A short test sentence.", Language.EN)
    seen, hooks = _dit_frames(pipe.sovits.cfm.estimator)
    try:
        for n in (5, 9):
            params = GptSovitsParams.build("balanced", speed=1.0, force_n_tokens=n, sample_steps=1)
            pipe.synthesize_sentence(ref, sentence, params, seed=0)
    finally:
        for h in hooks:
            h.remove()
    assert seen and all(f % FRAME_BUCKET == 0 for f in seen), sorted(set(seen))


# Token / phoneme counts that are not bucket multiples (and some that are), at speeds that resample the
# content; the last pair is past MAX_TOKENS / MAX_PHONES, where the buckets go on as multiples.
@pytest.mark.parametrize(
    "n_tokens, n_phones, speed",
    [(13, 7, 1.0), (26, 33, 1.0), (50, 32, 1.0), (21, 45, 0.8), (37, 70, 1.3), (99, 1, 1.1), (510, 520, 0.9)],
)
def test_bucketed_encoder_equals_decode_encp(sovits, n_tokens, n_phones, speed):
    g, a = torch.Generator().manual_seed(n_tokens + n_phones), sovits.arch
    codes = torch.randint(0, a.n_bins, (1, 1, n_tokens), generator=g)
    text = torch.randint(1, a.n_symbols, (1, n_phones), generator=g)
    ge = torch.randn(1, a.gin_channels, 1, generator=g)
    with torch.inference_mode():
        exact = sovits.decode_encp(codes, text, ge, speed)
        seen, hooks = _encoder_shapes(sovits)
        try:
            bucketed = decode_encp_bucketed(sovits, codes, text, ge, speed)
        finally:
            for h in hooks:
                h.remove()
    assert bucketed.shape == exact.shape
    assert (bucketed - exact).abs().max() < ENCODER_ATOL
    t, p = -(-n_tokens // TOKEN_BUCKET) * TOKEN_BUCKET, -(-n_phones // PHONE_BUCKET) * PHONE_BUCKET
    assert seen[0] == (2 * t, p), "the text encoder ran at the buckets"
    assert (t > MAX_TOKENS) == (n_tokens > MAX_TOKENS) and (p > MAX_PHONES) == (n_phones > MAX_PHONES)


@pytest.mark.parametrize("n_tokens, speed", [(13, 1.0), (50, 1.0), (300, 1.0), (21, 0.8), (37, 1.25)])
def test_mel_with_both_buckets_equals_the_unbucketed_mel(sovits, prompt, n_tokens, speed):
    exact = _mel(sovits, prompt, n_tokens, solve, speed=speed)
    bucketed = _mel(sovits, prompt, n_tokens, solve_bucketed, encoder=decode_encp_bucketed, speed=speed)
    assert bucketed.shape == exact.shape
    diff = (bucketed - exact).abs().max() / exact.abs().max()
    assert diff < RTOL, f"{n_tokens} tokens at speed {speed}: max abs diff {diff:.2e} of the mel's scale"


@pytest.mark.parametrize("speed", [1.0, 0.9])
def test_encoder_shapes_are_bounded_by_the_buckets(sovits, prompt, speed):
    lengths = [5, 9, 17, 23, 31, 47, 61, 77]  # 25 phonemes each (_target)
    shapes = {}
    for name, encoder in (("exact", None), ("bucketed", decode_encp_bucketed)):
        seen, hooks = _encoder_shapes(sovits)
        try:
            for n in lengths:
                _mel(sovits, prompt, n, solve_bucketed, steps=1, encoder=encoder, speed=speed)
        finally:
            for h in hooks:
                h.remove()
        shapes[name] = set(seen)
    # the hooks see every length unpadded (so they would see a leak), and only bucket multiples bucketed
    assert len(shapes["exact"]) == 2 * len(lengths)
    text_shapes = {s for s in shapes["bucketed"] if len(s) == 2}
    assert all(y % (2 * TOKEN_BUCKET) == 0 and p == PHONE_BUCKET for y, p in text_shapes), text_shapes
    buckets = {-(-n // TOKEN_BUCKET) * TOKEN_BUCKET for n in lengths}  # 25 .. 100: 4 buckets
    assert {y // 2 for y, _ in text_shapes} == buckets
    assert len(shapes["bucketed"]) == 2 * len(buckets)  # one wns1 width per token bucket too


def test_the_pipeline_encodes_sentences_at_buckets(tiny_set, reference_wav):
    pipe = load(tiny_set).pipeline
    ref = pipe.reference(Voice(reference_wav, REFERENCE_TEXT, "en"))
    sentence = pipe.text_features("A short test sentence.", Language.EN)
    seen, hooks = _encoder_shapes(pipe.sovits)
    try:
        for n, speed in ((5, 1.0), (9, 1.0), (31, 1.2)):
            params = GptSovitsParams.build("balanced", speed=speed, force_n_tokens=n, sample_steps=1)
            pipe.synthesize_sentence(ref, sentence, params, seed=0)
    finally:
        for h in hooks:
            h.remove()
    text_shapes = [s for s in seen if len(s) == 2]
    assert len(text_shapes) == 3, seen
    assert all(y % (2 * TOKEN_BUCKET) == 0 and p % PHONE_BUCKET == 0 for y, p in text_shapes), text_shapes
