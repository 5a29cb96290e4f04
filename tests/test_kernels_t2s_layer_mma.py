"""The many-row T2S stack (`t2s_layer_mma_triton`, op t2s_layer_stack_rows) against the torch definition,
its batch invariance, and the row engine's use of it.

CPU tests run the kernels in Triton's interpreter on tiny shapes, with blocks small enough that rows
cross a row block's edge (block_m 16, 18 rows), the reduction has several chunks and lengths cross
attention blocks; cache slots past each row's length are NaN, so a stale read fails the comparison.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import sys

import pytest
import torch
from t2s_layer_inputs import (
    MAX_SLOTS,
    N_SLOTS,
    SHAPE,
    as_float,
    random_embed,
    random_weights,
    stack_inputs,
    token_inputs,
    weights_as,
)
from test_kernels import rel_l2

from voicehub.models.gpt_sovits.t2s.checkpoint import load_t2s
from voicehub.models.gpt_sovits.t2s.decode import T2SSamplingParams, decode
from voicehub.models.gpt_sovits.t2s.make_checkpoint import make_t2s_checkpoint, random_prompt
from voicehub.models.gpt_sovits.t2s.scheduler import T2SRowEngine
from voicehub.models.gpt_sovits.t2s.static import StaticDecodeConfig, StepKernels, T2SRequest
from voicehub.runtime.kernels import registry
from voicehub.runtime.kernels import t2s_layer as ref
from voicehub.runtime.kernels.registry import T2S_EMBED_STACK_ROWS, T2S_LAYER_STACK, T2S_LAYER_STACK_ROWS
from voicehub.runtime.scheduler import ContinuousScheduler

FP32_TOL, FP16_TOL = 1e-5, 1e-2  # rel. L2
MODULE = "voicehub.runtime.kernels.t2s_layer_mma_triton"
BLOCKS = {"block_m": 16, "block_n": 16, "block_k": 16, "ffn_block": 32, "attn_block": 16}
# split-K in every GEMM: qkv and out-proj (K 32: 2 chunks) one chunk a split, ffn1 two empty splits of
# four, ffn2 (K 128: 8 chunks) two chunks a split
SPLITS = {"qkv_splits": 2, "out_splits": 2, "ffn1_splits": 4, "ffn2_splits": 4}
# the fused FFN (`t2s_ffn_fused_triton`): ffn_dim 128 in 4 slices of two 16-unit chunks, or in 8 slices
# of one 32-unit chunk (slices 4-7 empty: they add 0), or whole (one slice: no partials, no counter)
FUSED = {0: {}, 1: {"ffn_slices": 1, "ffn_chunk": 16}, 4: {"ffn_slices": 4, "ffn_chunk": 16},
         8: {"ffn_slices": 8, "ffn_chunk": 32}}  # fmt: skip
# 18 rows: two row blocks; lengths at the bucket's end, empty, mid-block and on block edges
LENGTHS = [71, 0, 33, 45, 5, 16, 15, 17, 1, 2, 64, 47, 48, 31, 32, 60, 9, 70]


@pytest.fixture(scope="module")
def mk():
    """The many-row Triton module, its kernels interpreted on the CPU."""
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed (pip install triton): the many-row stack is untested here")
    module = sys.modules.get(MODULE)
    if module is not None and type(module._qkv_kernel).__name__ != "InterpretedFunction":
        pytest.skip(f"{MODULE} was imported for a GPU before these tests; run them in their own process")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRITON_INTERPRET", "1")
        reason = registry.available(T2S_LAYER_STACK_ROWS, "triton", "cpu")
        if reason is not None:
            pytest.skip(f"Triton interpreter unusable here: {reason}")
        yield importlib.import_module(MODULE)


# attn_tiles: 1 (a program per 16-slot block, merged), 2 (two tiles per program, online softmax,
# merged), 8 (128 slots: one program covers the whole 80-slot cache, no merge); split: SPLITS;
# prenorm: the norms computed once per row block by out-proj / ffn2 (`t2s_layer_mma_prenorm_triton`);
# fused: FUSED's key
@pytest.mark.parametrize(("dtype", "tiles", "split", "prenorm", "fused", "attn_out"),
                         [(torch.float32, 1, False, False, 0, False), (torch.float16, 1, False, False, 0, False),
                          (torch.float32, 2, False, False, 0, False), (torch.float16, 8, False, False, 0, False),
                          (torch.float32, 2, True, False, 0, False), (torch.float16, 8, True, False, 0, False),
                          (torch.float16, 1, False, True, 0, False), (torch.float32, 2, True, True, 0, False),
                          (torch.float32, 2, True, False, 4, False), (torch.float16, 8, False, False, 8, False),
                          (torch.float32, 8, False, False, 1, False), (torch.float16, 2, True, True, 4, False),
                          (torch.float32, 1, True, True, 0, True),
                          (torch.float32, 2, True, True, 4, True)])  # fmt: skip
def test_stack_matches_the_definition_across_row_blocks(mk, dtype, tiles, split, prenorm, fused, attn_out):
    x, w, k, v, lengths = stack_inputs(len(LENGTHS), dtype, LENGTHS)
    k_want, v_want = as_float(k), as_float(v)
    want = ref.decode_stack_reference(
        x.double(), weights_as(w, torch.Tensor.double), k_want, v_want, lengths, N_SLOTS
    )
    cfg = mk.MmaConfig(
        **BLOCKS,
        attn_tiles=tiles,
        prenorm=prenorm,
        **(SPLITS if split else {}),
        **FUSED[fused],
        attn_out=attn_out,
    )
    got = mk.decode_stack_mma(x, w, k, v, lengths, N_SLOTS, config=cfg)
    tol = FP32_TOL if dtype == torch.float32 else FP16_TOL
    assert got.dtype == dtype and rel_l2(got, want) <= tol
    assert rel_l2(as_float(k), k_want) <= tol and rel_l2(as_float(v), v_want) <= tol
    assert not got.isnan().any()


# the merge path, one program per cache, split-K, split-K with prenorm, the fused FFN, and the v3 table's kind
# (whole cache, split-K, prenorm, the out-projection in the attention kernel); each case ~25 s interpreted
@pytest.mark.parametrize(("tiles", "split", "prenorm", "fused", "attn_out"),
                         [(1, False, False, 0, False), (8, False, False, 0, False), (2, True, False, 0, False),
                          (2, True, True, 0, False), (2, True, False, 4, False), (8, True, True, 0, True)])  # fmt: skip
def test_a_row_does_not_depend_on_its_batch_position_or_bucket(mk, tiles, split, prenorm, fused, attn_out):
    # bitwise: a row alone (batch of 1, row 0) equals the same row inside a batch of 5 with other
    # lengths (at index 3) and in the second row block of 18 rows, for two KV buckets
    cfg = mk.MmaConfig(
        **BLOCKS,
        attn_tiles=tiles,
        prenorm=prenorm,
        **(SPLITS if split else {}),
        **FUSED[fused],
        attn_out=attn_out,
    )
    x, w, k, v, lengths = stack_inputs(len(LENGTHS), torch.float16, LENGTHS)
    five = mk.decode_stack_mma(x[:5], w, k[:, :5].clone(), v[:, :5].clone(), lengths[:5], N_SLOTS, config=cfg)
    big = mk.decode_stack_mma(x, w, k.clone(), v.clone(), lengths, N_SLOTS, config=cfg)
    assert len(set(lengths[:5].tolist())) == 5
    for row, n_slots in ((3, N_SLOTS), (3, 48), (17, N_SLOTS)):
        one = slice(row, row + 1)
        alone = mk.decode_stack_mma(
            x[one], w, k[:, one].clone(), v[:, one].clone(), lengths[one], n_slots, config=cfg
        )
        assert torch.equal(alone[0], big[row]), (row, n_slots)
        if row < 5:
            assert torch.equal(alone[0], five[row]), (row, n_slots)


def test_pipelined_attention_tiles_give_the_same_bits(mk):
    # attn_stages 3: the tile loop written for Triton's pipeliner (on a GPU its K/V loads run two tiles
    # ahead) visits the same tiles with the same math: bitwise the plain loop, with programs of two
    # tiles (merged) and the out-projection in the attention kernel, as the v3 table has it
    x, w, k, v, lengths = stack_inputs(len(LENGTHS), torch.float16, LENGTHS)
    plain = mk.MmaConfig(**BLOCKS, attn_tiles=2, prenorm=True, **SPLITS, attn_out=True)
    want = mk.decode_stack_mma(x, w, k.clone(), v.clone(), lengths, N_SLOTS, config=plain)
    piped = dataclasses.replace(plain, attn_stages=3)
    assert torch.equal(mk.decode_stack_mma(x, w, k.clone(), v.clone(), lengths, N_SLOTS, config=piped), want)
    assert not want.isnan().any()


@pytest.mark.parametrize("tiles", [1, 8])
def test_first_kv_tile_loaded_before_the_wait_gives_the_same_bits(mk, tiles):
    # pdl_attn: each attention program loads its first tile of K/V (the slots below the row's length) before
    # it waits for the qkv kernel, and loads it again where the tile holds the slot qkv just wrote (lengths
    # 0-15 here, in the first 16-slot tile; on the CPU nothing runs early, the peeled first tile is what is
    # checked): bitwise the plain loop, in programs of one tile (blocks past the length: no live slot) and
    # of the whole cache, K and V as written
    x, w, k, v, lengths = stack_inputs(len(LENGTHS), torch.float16, LENGTHS)
    plain = mk.MmaConfig(**BLOCKS, attn_tiles=tiles, prenorm=True, **SPLITS, attn_out=True, pdl=False)
    k_want, v_want = k.clone(), v.clone()
    want = mk.decode_stack_mma(x, w, k_want, v_want, lengths, N_SLOTS, config=plain)
    early = dataclasses.replace(plain, pdl_attn=True)
    got = mk.decode_stack_mma(x, w, k, v, lengths, N_SLOTS, config=early)
    assert torch.equal(got, want)
    for cache, cache_want in ((k, k_want), (v, v_want)):
        torch.testing.assert_close(cache, cache_want, rtol=0, atol=0, equal_nan=True)
    assert not want.isnan().any()


def test_row_groups_split_whole_row_blocks_and_give_the_same_bits(mk):
    # 34 rows in two groups (32 + 2; on the CPU one after another): bitwise one call over all rows
    cfg = mk.MmaConfig(**BLOCKS)
    assert mk.row_spans(64, dataclasses.replace(cfg, row_groups=2)) == [(0, 32), (32, 64)]
    assert mk.row_spans(64, dataclasses.replace(cfg, row_groups=4)) == [(0, 16), (16, 32), (32, 48), (48, 64)]
    assert mk.row_spans(48, dataclasses.replace(cfg, row_groups=2)) == [(0, 32), (32, 48)]
    assert mk.row_spans(20, dataclasses.replace(cfg, row_groups=2)) == [(0, 20)]  # one row block: one group
    wide = dataclasses.replace(cfg, row_groups=4, group_rows=32)  # at least 32 rows a group but the last
    assert mk.row_spans(32, wide) == [(0, 32)]
    assert mk.row_spans(64, wide) == [(0, 32), (32, 64)]
    assert mk.row_spans(80, wide) == [(0, 48), (48, 80)]
    assert mk.row_spans(128, wide) == [(0, 32), (32, 64), (64, 96), (96, 128)]
    x, w, k, v, lengths = stack_inputs(34, torch.float32, (LENGTHS * 2)[:34])
    k_want, v_want = k.clone(), v.clone()
    want = mk.decode_stack_mma(x, w, k_want, v_want, lengths, N_SLOTS, config=cfg)
    for change in ({"row_groups": 2}, {"row_groups": 2, "attn_stream": True}):
        kc, vc = k.clone(), v.clone()
        got = mk.decode_stack_mma(x, w, kc, vc, lengths, N_SLOTS, config=dataclasses.replace(cfg, **change))
        assert torch.equal(got, want), change
        for cache, cache_want in ((kc, k_want), (vc, v_want)):  # NaN past each row's slots: never read
            torch.testing.assert_close(cache, cache_want, rtol=0, atol=0, equal_nan=True)


def test_a_steps_counters_are_zeroed_together_and_every_kernel_leaves_them_at_zero(mk):
    # split-K, prenorm and attn_out each count: the groups' counters are zeroed together (one fill in a
    # step's graph), and a step leaves them at 0, so the same scratch serves the next step as it is
    cfg = mk.MmaConfig(**BLOCKS, **SPLITS, prenorm=True, attn_out=True, row_groups=2)
    x, w, k, v, lengths = stack_inputs(34, torch.float32, (LENGTHS * 2)[:34])
    spans = mk.row_spans(34, cfg)
    scratch = mk.Scratch.allocate_groups([hi - lo for lo, hi in spans], w, k.shape[3], cfg)
    for s in scratch:
        assert {id(c) for c in s.counters} == {id(s.gemm_count), id(s.row_count), id(s.out_count)}
        assert not any(c.any() for c in s.counters)
    want = mk.decode_stack_mma(x, w, k.clone(), v.clone(), lengths, N_SLOTS, config=cfg)
    for _ in range(2):
        got = torch.empty_like(want)
        mk.step_groups(scratch, spans, x, w, k.clone(), v.clone(), lengths, N_SLOTS, cfg, got)
        assert torch.equal(got, want)
        assert not any(c.any() for s in scratch for c in s.counters)
    # nothing counts: no counters, no fill (the one-element placeholders are never read)
    assert mk.Scratch.allocate(34, w, k.shape[3], mk.MmaConfig(**BLOCKS)).counters == ()


@pytest.mark.parametrize("splits", [1, 2, 8])
def test_split_linear_sums_in_a_fixed_order_and_leaves_its_counters_at_zero(mk, splits):
    # K 128 in chunks of 16: 8 chunks in 1, 2 or 8 splits; twice on one scratch (the counters reset)
    cfg = mk.MmaConfig(**BLOCKS, ffn2_splits=splits)
    x, w, k, _, _ = stack_inputs(18, torch.float32, LENGTHS)
    s = mk.Scratch.allocate(18, w, k.shape[3], cfg)
    s.h.copy_(torch.randn(s.h.shape, generator=torch.Generator().manual_seed(5)))
    want = s.h.double() @ w.layers[0].ffn2_weight.double().T
    outs = []
    for _ in range(2):
        s.out_ffn.fill_(float("nan"))
        mk.ffn2_stage(s, w.layers[0], w.eps, cfg)
        outs.append(s.out_ffn.clone())
        assert splits == 1 or not s.gemm_count.any()  # one split: no counter (an unzeroed placeholder)
    assert rel_l2(outs[0], want) <= FP32_TOL and torch.equal(outs[0], outs[1])
    if splits > 1:  # the partials' fixed-order sum, from the scratch the kernel left behind
        n_tiles = SHAPE["dim"] // BLOCKS["block_n"]
        part = s.gemm_part[: 2 * n_tiles * splits * 16 * 16].view(2, n_tiles, splits, 16, 16)
        summed = part[:, :, 0].clone()
        for i in range(1, splits):
            summed += part[:, :, i]
        summed = summed.permute(0, 2, 1, 3).reshape(32, SHAPE["dim"])[:18]
        assert torch.equal(summed, outs[0])


@pytest.mark.parametrize("splits", [1, 2])
def test_prenorm_out_proj_stores_ln1_once_per_row_block_as_ffn1_would(mk, splits):
    # out-proj with prenorm stores LN1(x_attn + out + b_o) in x_ffn: bitwise what ffn1 without prenorm
    # keeps (the interpreter rounds both forms alike), every row of both row blocks (18 rows: one
    # partial block), the row counters back at 0; twice on one scratch (the counters reset)
    x, w, k, _, _ = stack_inputs(18, torch.float32, LENGTHS)
    layer, g = w.layers[0], torch.Generator().manual_seed(6)
    on = mk.MmaConfig(**BLOCKS, out_splits=splits, prenorm=True)
    s = mk.Scratch.allocate(18, w, k.shape[3], on)
    s.attn.copy_(torch.randn(s.attn.shape, generator=g))
    s.x_attn.copy_(torch.randn(s.x_attn.shape, generator=g))
    for _ in range(2):
        s.x_ffn.fill_(float("nan"))
        mk.out_proj_stage(s, layer, w.eps, on)
        assert s.row_count.shape == (2,) and not s.row_count.any()
        got = s.x_ffn.clone()
        s.x_ffn.fill_(float("nan"))
        mk.ffn1_stage(s, layer, w.eps, mk.MmaConfig(**BLOCKS))  # no prenorm: LN1 per program, kept
        assert torch.equal(got, s.x_ffn)
    want = torch.nn.functional.layer_norm(
        s.x_attn.double() + s.attn.double() @ layer.out_weight.double().T + layer.out_bias.double(),
        (SHAPE["dim"],), layer.norm1_weight.double(), layer.norm1_bias.double(), w.eps,
    )  # fmt: skip
    assert rel_l2(got, want) <= FP32_TOL


@pytest.mark.parametrize(("slices", "prenorm"), [(1, False), (4, False), (8, False), (4, True)])
def test_fused_ffn_equals_ffn1_then_ffn2_and_sums_its_slices_in_order(mk, slices, prenorm):
    # one fused kernel leaves s.out_ffn as ffn1 + ffn2 do (fp32, within the tolerance: other sum orders),
    # x_ffn (LN1, the residual) bitwise as ffn1 keeps it, and with prenorm x_attn (LN2) as ffn2 stores
    # it; every row of both row blocks, the counters back at 0; twice on one scratch (they reset)
    x, w, k, _, _ = stack_inputs(18, torch.float32, LENGTHS)
    layer, g = w.layers[0], torch.Generator().manual_seed(7)
    off = mk.MmaConfig(**BLOCKS, prenorm=prenorm)
    on = mk.MmaConfig(**BLOCKS, prenorm=prenorm, **FUSED[slices])
    s = mk.Scratch.allocate(18, w, k.shape[3], on)
    for t in (s.out_attn, s.x_attn, s.x_ffn):
        t.copy_(torch.randn(t.shape, generator=g))
    want_s = mk.Scratch.allocate(18, w, k.shape[3], off)
    for name in ("out_attn", "x_attn", "x_ffn"):
        getattr(want_s, name).copy_(getattr(s, name))
    mk.ffn1_stage(want_s, layer, w.eps, off)
    mk.ffn2_stage(want_s, layer, w.eps, off)
    assert s.h.shape[0] == 1  # no hidden units between kernels
    outs = []
    for _ in range(2):
        s.out_ffn.fill_(float("nan"))
        if prenorm:
            s.x_attn.fill_(float("nan"))
        mk.ffn1_stage(s, layer, w.eps, on)
        mk.ffn2_stage(s, layer, w.eps, on)  # nothing: the fused ffn1_stage ran the whole FFN
        outs.append(s.out_ffn.clone())
        # (the counters unused, one slice or no prenorm, are unzeroed placeholders)
        assert (slices == 1 or not s.gemm_count.any()) and (not prenorm or not s.row_count.any())
    assert rel_l2(outs[0], want_s.out_ffn) <= FP32_TOL and torch.equal(outs[0], outs[1])
    assert torch.equal(s.x_ffn, want_s.x_ffn)
    if prenorm:
        assert rel_l2(s.x_attn, want_s.x_attn) <= FP32_TOL
    if slices > 1:  # the slices' fixed-order sum, from the partials the kernel left behind
        part = s.gemm_part[: 2 * slices * 16 * SHAPE["dim"]].view(2, slices, 16, SHAPE["dim"])
        summed = part[:, 0].clone()
        for i in range(1, slices):
            summed += part[:, i]
        assert torch.equal(summed.reshape(32, SHAPE["dim"])[:18], outs[0])
        if slices == 8:  # ffn_dim 128 in 32-unit chunks: slices 4-7 own no hidden units
            assert not part[:, 4:].any()


# whole K (no partials), split-K (ffn1: two empty splits of four; ffn2: two hidden tiles a split), fp16
@pytest.mark.parametrize(("dtype", "split", "prenorm"),
                         [(torch.float32, False, False), (torch.float32, True, True), (torch.float16, True, True)])  # fmt: skip
def test_ticketed_ffn_is_bitwise_ffn1_then_ffn2_and_leaves_its_counters_at_zero(mk, dtype, split, prenorm):
    # one kernel of tickets leaves h, out_ffn, x_ffn and (prenorm) x_attn bitwise as the two kernels do,
    # both row blocks; twice on one scratch: the ticket, ended, ready and split counters back at 0
    x, w, k, _, _ = stack_inputs(18, dtype, LENGTHS)
    layer, g = w.layers[0], torch.Generator().manual_seed(7)
    off = mk.MmaConfig(**BLOCKS, prenorm=prenorm, **(SPLITS if split else {}))
    on = mk.MmaConfig(**BLOCKS, prenorm=prenorm, **(SPLITS if split else {}), ffn_tickets=True)
    s, want_s = mk.Scratch.allocate(18, w, k.shape[3], on), mk.Scratch.allocate(18, w, k.shape[3], off)
    for name in ("out_attn", "x_attn", "x_ffn"):
        getattr(s, name).copy_(torch.randn(getattr(s, name).shape, generator=g))
        getattr(want_s, name).copy_(getattr(s, name))
    mk.ffn1_stage(want_s, layer, w.eps, off)
    mk.ffn2_stage(want_s, layer, w.eps, off)
    for _ in range(2):
        for t in (s.out_ffn, s.h) + ((s.x_attn,) if prenorm else ()):
            t.fill_(float("nan"))
        mk.ffn1_stage(s, layer, w.eps, on)
        mk.ffn2_stage(s, layer, w.eps, on)  # nothing: the ticketed ffn1_stage ran both
        for name in ("h", "out_ffn", "x_ffn", "x_attn"):
            assert torch.equal(getattr(s, name), getattr(want_s, name)), name
        counts = (
            s.ticket[1],
            s.ticket[3],
            s.ticket[4],
        )  # per ffn1 tile, per ffn2 tile, ticket / ended / ready
        assert not any(c.any() for c in counts) and (not prenorm or not s.row_count.any())
    assert not want_s.ticket


def test_registry_serves_the_rows_op_with_the_shapes_own_blocks(mk):
    x, w, k, v, lengths = stack_inputs(3, torch.float32, LENGTHS[:3])
    want = ref.decode_stack_reference(
        x.double(), weights_as(w, torch.Tensor.double), as_float(k), as_float(v), lengths, N_SLOTS
    )
    assert registry.reference(T2S_LAYER_STACK_ROWS) is ref.decode_stack_reference
    assert registry.get(T2S_LAYER_STACK_ROWS, "triton") is mk.decode_stack_mma
    assert (
        rel_l2(registry.get(T2S_LAYER_STACK_ROWS, "triton")(x, w, k, v, lengths, N_SLOTS), want) <= FP32_TOL
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_embed_rows_op_is_the_embedding_then_the_rows_stack_bit_for_bit(mk, dtype):
    # one kernel for torch's gathers, product and sum (`embed_audio_at`): the stack sees the same x
    cfg = mk.MmaConfig(**BLOCKS, **SPLITS, prenorm=True, attn_out=True)
    _, w, k, v, lengths = stack_inputs(18, dtype, LENGTHS)
    embed, (tokens, pos) = random_embed(50, 200, SHAPE["dim"], dtype), token_inputs(18)
    x = ref.embed_reference(tokens, pos, embed)
    k_want, v_want = k.clone(), v.clone()
    want = mk.decode_stack_mma(x, w, k_want, v_want, lengths, N_SLOTS, config=cfg)
    got = mk.embed_stack_mma(tokens, pos, embed, w, k, v, lengths, N_SLOTS, config=cfg)
    assert torch.equal(got, want) and not got.isnan().any()
    for cache, cache_want in ((k, k_want), (v, v_want)):
        torch.testing.assert_close(cache, cache_want, rtol=0, atol=0, equal_nan=True)
    assert registry.reference(T2S_EMBED_STACK_ROWS) is ref.embed_stack_reference
    assert registry.get(T2S_EMBED_STACK_ROWS, "triton") is mk.embed_stack_mma
    with pytest.raises(ValueError, match="integer tokens"):
        mk.embed_stack_mma(tokens.float(), pos, embed, w, k, v, lengths, N_SLOTS)
    with pytest.raises(ValueError, match="caches"):
        mk.embed_stack_mma(tokens[:3], pos[:3], embed, w, k, v, lengths, N_SLOTS)


def test_stack_asks_the_table_for_the_steps_rows_and_kv_bucket(mk, monkeypatch):
    # the table's entry for this step (BUCKET_CHANGES: RESULT_FREE fields chosen by the batch and the cache)
    x, w, k, v, lengths = stack_inputs(3, torch.float32, [3, 0, 17])
    asked, table = [], mk.config_for
    monkeypatch.setattr(mk, "config_for", lambda *key: asked.append(key) or table(*key))
    mk.decode_stack_mma(x, w, k, v, lengths, N_SLOTS)
    assert asked == [(SHAPE["dim"], SHAPE["ffn_dim"], SHAPE["n_head"], SHAPE["vocab"], 3, N_SLOTS)]


def test_stack_refuses_mismatched_arguments_and_configs(mk):
    x, w, k, v, lengths = stack_inputs(1, torch.float32, [3])
    with pytest.raises(ValueError, match="caches"):
        mk.decode_stack_mma(x, w, k[:, :, :1], v[:, :, :1], lengths, N_SLOTS)
    with pytest.raises(ValueError, match="n_slots"):
        mk.decode_stack_mma(x, w, k, v, lengths, MAX_SLOTS + 1)
    with pytest.raises(ValueError, match="power of two"):
        mk.MmaConfig(attn_block=48)
    with pytest.raises(ValueError, match="smallest tile"):
        mk.MmaConfig(block_m=8)
    with pytest.raises(ValueError, match="power of two"):
        mk.MmaConfig(ffn2_splits=3)
    with pytest.raises(ValueError, match="needs prenorm"):
        mk.MmaConfig(attn_out=True)
    with pytest.raises(ValueError, match="power of two"):
        mk.MmaConfig(ffn_slices=3)
    with pytest.raises(ValueError, match="smallest tile"):
        mk.MmaConfig(ffn_slices=4, ffn_chunk=8)
    with pytest.raises(ValueError, match="pdl_late needs pdl"):
        mk.MmaConfig(pdl=False, pdl_late=True)
    with pytest.raises(ValueError, match="pdl_attn is PDL on the qkv -> attention edge alone"):
        mk.MmaConfig(pdl=True, pdl_attn=True)
    with pytest.raises(ValueError, match="ffn_slices must be 0"):
        mk.MmaConfig(ffn_slices=4, ffn_tickets=True)
    with pytest.raises(ValueError, match="must be >= 1"):
        mk.MmaConfig(attn_stages=0)
    assert random_weights(**SHAPE).head_weight.shape == (SHAPE["vocab"], SHAPE["dim"])


# -- through the row engine ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = make_t2s_checkpoint(tmp_path_factory.mktemp("t2s") / "tiny.ckpt", "tiny", seed=0)
    return load_t2s(path, dtype="float32")


ENGINE = StaticDecodeConfig(max_batch=2, max_seq_len=64, kv_buckets=(32, 48), stop_check_interval=4)


def _requests(config, forced: list[int]) -> list[T2SRequest]:
    return [
        T2SRequest(
            *random_prompt(config, 9 + 4 * i, 12 + 3 * i, i), T2SSamplingParams.greedy(force_n_tokens=n)
        )
        for i, n in enumerate(forced)
    ]


def test_row_engine_steps_with_the_rows_stack_and_single_streams_keep_theirs(tiny):
    # wiring: kernel_backend=triton gives StepKernels both stacks; the row engine calls only the rows one
    calls = {"layers": 0, "rows": 0}

    def counting(name):
        def stack(*args):
            calls[name] += 1
            return ref.decode_stack_reference(*args)

        return stack

    kernels = StepKernels(layer_stack=counting("layers"), layer_stack_rows=counting("rows"))
    assert kernels.for_rows().layer_stack is kernels.layer_stack_rows
    assert kernels.for_rows().embed_stack is None  # no rows embed op: the model's embedding, then the stack
    embed_rows = dataclasses.replace(kernels, embed_stack_rows=ref.embed_stack_reference)
    assert embed_rows.for_rows().embed_stack is ref.embed_stack_reference
    assert StepKernels(layer_stack=kernels.layer_stack).for_rows().layer_stack is kernels.layer_stack
    model, config = tiny
    engine = T2SRowEngine(model, ENGINE, preset="off")
    engine.set_step_kernels(kernels)
    sched = ContinuousScheduler(engine)
    handles = [sched.submit(r) for r in _requests(config, [10, 6])]
    sched.run_until_idle()
    assert calls["rows"] >= 9 and calls["layers"] == 0
    assert engine.kernels is kernels  # the engine keeps what it was given (undo restores it)
    for h, r in zip(handles, _requests(config, [10, 6])):
        eager = decode(model, r.phone_ids, r.bert, r.prompt_tokens, r.params)
        assert h.result().tokens.tolist() == eager.tokens.tolist()


def test_row_engine_greedy_tokens_with_the_mma_stack_equal_eager(mk, tiny):
    model, config = tiny
    engine = T2SRowEngine(model, ENGINE, preset="off")
    engine.set_step_kernels(
        StepKernels(
            layer_stack=registry.resolve(T2S_LAYER_STACK, "triton", "cpu"),
            layer_stack_rows=registry.resolve(T2S_LAYER_STACK_ROWS, "triton", "cpu"),
            embed_stack_rows=registry.resolve(T2S_EMBED_STACK_ROWS, "triton", "cpu"),
        )
    )
    sched = ContinuousScheduler(engine)
    reqs = _requests(config, [7, 4])  # rows of different lengths; the second finishes and rides along
    handles = [sched.submit(r) for r in reqs]
    sched.run_until_idle()
    for h, r in zip(handles, reqs):
        eager = decode(model, r.phone_ids, r.bert, r.prompt_tokens, r.params)
        assert h.result().tokens.tolist() == eager.tokens.tolist()
        assert len(set(eager.tokens.tolist())) > 1  # non-degenerate: the comparison can fail
