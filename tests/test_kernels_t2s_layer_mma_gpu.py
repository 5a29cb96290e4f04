"""The many-row T2S stack (`t2s_layer_mma_triton`) at full size on a CUDA GPU: against the torch
definition, batch invariance, the fields of RESULT_FREE bitwise (PDL, tickets, L2 policy, pipelined
GEMM K loops and attention tiles, row groups and their streams), row groups inside a CUDA graph
capture, and the rows embed op (T2S_EMBED_STACK_ROWS) in one. The CPU interpreter's tests of the same
kernels are in test_kernels_t2s_layer_mma.py.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib

import pytest
import torch
from t2s_layer_inputs import FULL, check_full_size_stack, random_embed, random_weights
from test_kernels_t2s_layer_mma import MODULE

from voicehub.runtime.kernels import registry
from voicehub.runtime.kernels import t2s_layer as ref
from voicehub.runtime.kernels.registry import T2S_EMBED_STACK_ROWS, T2S_LAYER_STACK_ROWS


@pytest.mark.gpu
# the table's config (through the registry), one attention program per (row, head) over the whole
# cache (128-slot tiles x 8: no merge) for fp16, and split-K in every GEMM (fp16, fp32); prenorm: the
# norms once per row block (out-proj / ffn2), whole K and split; fused: the FFN in one kernel, that many
# slices (ffn_chunk 32 for fp16, 16 for fp32: its two weight chunks a pipeline stage in shared memory)
@pytest.mark.parametrize(
    ("dtype", "attn_tiles", "split", "prenorm", "fused", "attn_out"),
    [(torch.float16, None, False, False, 0, False), (torch.float32, None, False, False, 0, False),
     (torch.float16, 8, False, False, 0, False), (torch.float16, 8, True, False, 0, False), (torch.float32, 8, True, False, 0, False),
     (torch.float16, 8, False, True, 0, False), (torch.float16, 8, True, True, 0, False), (torch.float32, 8, True, True, 0, False),
     (torch.float16, 8, True, False, 8, False), (torch.float16, 8, False, True, 4, False), (torch.float16, 8, False, False, 1, False),
     (torch.float32, 8, True, False, 16, False),
     (torch.float16, 8, True, True, 0, True), (torch.float32, 1, False, True, 0, True), (torch.float16, 8, False, True, 4, True)],
)  # fmt: skip
def test_cuda_full_size_rows_stack_matches_the_definition_and_is_batch_invariant(
    dtype, attn_tiles, split, prenorm, fused, attn_out
):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    stack = registry.resolve(T2S_LAYER_STACK_ROWS, "triton", "cuda")
    if attn_tiles is not None:
        mk = importlib.import_module(MODULE)
        # split: ffn2 (K 2048) 8 splits of two 128-chunks, qkv / out / ffn1 (K 512) 2, 4 and 8 of 4, 1, 1 chunks
        splits = {"qkv_splits": 2, "out_splits": 4, "ffn1_splits": 4, "ffn2_splits": 8} if split else {}
        if fused:
            splits.update(ffn_slices=fused, ffn_chunk=32 if dtype == torch.float16 else 16)
        stack = functools.partial(mk.decode_stack_mma, config=mk.MmaConfig(block_k=128, attn_block=128,
                                                                           attn_tiles=attn_tiles, prenorm=prenorm,
                                                                           attn_out=attn_out, **splits))  # fmt: skip
    lengths = torch.tensor([730, 0, 1023, 300, 17, 511, 64, 65, 1, 900, 5, 640, 128, 129, 33, 700, 450, 2, 999, 256],
                           device="cuda")  # fmt: skip
    n_rows = lengths.numel()  # two row blocks of 16
    w = random_weights(**FULL, dtype=dtype, device="cuda")
    g = torch.Generator(device="cuda").manual_seed(3)  # the CPU's randn of 0.8G values takes seconds
    shape = (FULL["n_layer"], n_rows, FULL["n_head"], 1024, 32)
    k, v = (torch.randn(shape, generator=g, device="cuda").to(dtype) for _ in range(2))
    x = torch.randn(n_rows, FULL["dim"], generator=g, device="cuda").to(dtype)
    got = check_full_size_stack(stack, x, w, k, v, lengths, dtype)
    # bitwise: run to run, a row alone (smaller bucket) and at another place in another batch
    assert torch.equal(stack(x, w, k.clone(), v.clone(), lengths, 1024), got)
    for row in (3, 17):
        one = slice(row, row + 1)
        alone = stack(x[one], w, k[:, one].clone(), v[:, one].clone(), lengths[one], 768)
        assert torch.equal(alone[0], got[row]), row
    five = [5, 3, 0, 17, 9]
    mixed = stack(x[five], w, k[:, five].clone(), v[:, five].clone(), lengths[five], 1024)
    assert torch.equal(mixed, got[five])


# the table's config with fields of RESULT_FREE changed: each must leave every bit as it was
RESULT_FREE_CHANGES = [
    {"pdl": True}, {"pdl": True, "pdl_late": True}, {"pdl_attn": True}, {"ffn_tickets": True}, {"kv_evict_first": False},
    {"kv_prefetch": 2}, {"kv_prefetch": 8}, {"kv_prefetch_own": True}, {"w_prefetch": True},
    {"kv_prefetch": 2, "kv_prefetch_own": True, "w_prefetch": True, "pdl_attn": True},
    {"gemm_stages": 1}, {"gemm_stages": 3}, {"attn_stages": 2}, {"attn_stages": 3},
    {"row_groups": 1}, {"row_groups": 2, "group_rows": 1},
    {"row_groups": 4, "group_rows": 1}, {"row_groups": 2, "group_rows": 1, "attn_stream": True},
]  # fmt: skip


def test_result_free_changes_cover_exactly_the_result_free_fields():
    from voicehub.runtime.kernels.t2s_layer_mma_config import RESULT_FREE, MmaConfig

    changed = {name for change in RESULT_FREE_CHANGES for name in change}
    assert changed == RESULT_FREE
    assert RESULT_FREE <= {f.name for f in dataclasses.fields(MmaConfig)}


@pytest.mark.gpu
@pytest.mark.parametrize(
    "change", RESULT_FREE_CHANGES, ids=lambda c: "+".join(f"{k}={v}" for k, v in c.items())
)
@pytest.mark.parametrize("n_rows", [1, 20, 64])
def test_cuda_full_size_result_free_flags_are_bitwise(n_rows, change):
    # the v3 table's config with a field that must not change a value changed: PDL (and launching the next
    # kernel after the wait, or on the qkv -> attention edge alone, the first K/V tile loaded before the
    # wait; the next layer's K/V prefetched into L2, two tiles or all, the program's own, the next GEMMs' weights,
    # all with pdl_attn), ffn1 + ffn2 as one kernel of tickets
    # (64 rows: four row blocks of ffn2 tiles waiting at once),
    # K/V's L2 policy, the GEMMs' K loops unpipelined or 3 deep, the attention's tile loop pipelined
    # (cp.async), the rows in one group or in groups of 16 / 32+ rows on parallel streams;
    # logits, k and v bitwise the table's, twice (the ticket counters reset)
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    if {
        "kv_prefetch",
        "kv_prefetch_own",
        "w_prefetch",
    } & change.keys() and torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("the L2 bulk prefetch needs sm_90+ (the stack refuses it before it launches)")
    mk = importlib.import_module(MODULE)
    base = mk.config_for(FULL["dim"], FULL["ffn_dim"], FULL["n_head"], FULL["vocab"])
    on = dataclasses.replace(base, **change)
    if on == base:
        pytest.skip(f"the table already has {change}")
    w = random_weights(**FULL, dtype=torch.float16, device="cuda")
    g = torch.Generator(device="cuda").manual_seed(4)
    lengths = torch.randint(0, 1024, (n_rows,), generator=g, device="cuda")
    shape = (FULL["n_layer"], n_rows, FULL["n_head"], 1024, 32)
    k, v = (torch.randn(shape, generator=g, device="cuda").half() for _ in range(2))
    x = torch.randn(n_rows, FULL["dim"], generator=g, device="cuda").half()
    outs = []
    for cfg in (base, on, on):
        kc, vc = k.clone(), v.clone()
        outs.append((mk.decode_stack_mma(x, w, kc, vc, lengths, 1024, config=cfg), kc, vc))
    want = outs[0]
    for got in outs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert not want[0].isnan().any()


@pytest.mark.gpu
def test_cuda_a_row_is_the_same_alone_and_in_a_step_that_takes_a_bucket_change():
    # the table's BUCKET_CHANGES through the registry (v3: gemm_stages 3 at 33-64 rows up to 512 slots): a
    # 64-row step at 512 slots takes the change, each checked row alone (one row) the entry; logits bitwise
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    mk = importlib.import_module(MODULE)
    stack = registry.resolve(T2S_LAYER_STACK_ROWS, "triton", "cuda")
    key = (FULL["dim"], FULL["ffn_dim"], FULL["n_head"], FULL["vocab"])
    n_rows, n_slots = 64, 512
    assert mk.config_for(*key, n_rows, n_slots) != mk.config_for(*key, 1, n_slots), "no bucket change to test"
    w = random_weights(**FULL, dtype=torch.float16, device="cuda")
    g = torch.Generator(device="cuda").manual_seed(5)
    lengths = torch.randint(0, n_slots - 1, (n_rows,), generator=g, device="cuda")
    shape = (FULL["n_layer"], n_rows, FULL["n_head"], 1024, 32)
    k, v = (torch.randn(shape, generator=g, device="cuda").half() for _ in range(2))
    x = torch.randn(n_rows, FULL["dim"], generator=g, device="cuda").half()
    got = stack(x, w, k.clone(), v.clone(), lengths, n_slots)
    assert not got.isnan().any()
    for row in (0, 37, 63):
        one = slice(row, row + 1)
        alone = stack(x[one], w, k[:, one].clone(), v[:, one].clone(), lengths[one], n_slots)
        assert torch.equal(alone[0], got[row]), row


@pytest.mark.gpu
@pytest.mark.parametrize("attn_stream", [False, True])
def test_cuda_row_groups_capture_in_a_graph_and_replay_the_same_bits(attn_stream):
    # the groups' side streams forked and joined inside a CUDA graph capture (as the row engine captures its
    # steps), their attentions ordered by events (or on the caller's stream, the GEMMs on high-priority
    # streams): the replay's logits, k and v bitwise one group's eager step
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    mk = importlib.import_module(MODULE)
    table = mk.config_for(FULL["dim"], FULL["ffn_dim"], FULL["n_head"], FULL["vocab"])
    base = dataclasses.replace(table, row_groups=1)
    on = dataclasses.replace(table, row_groups=2, group_rows=32, attn_stream=attn_stream)
    w = random_weights(**FULL, dtype=torch.float16, device="cuda")
    g = torch.Generator(device="cuda").manual_seed(5)
    lengths = torch.randint(0, 1024, (64,), generator=g, device="cuda")
    shape = (FULL["n_layer"], 64, FULL["n_head"], 1024, 32)
    k, v = (torch.randn(shape, generator=g, device="cuda").half() for _ in range(2))
    x = torch.randn(64, FULL["dim"], generator=g, device="cuda").half()
    kw, vw = k.clone(), v.clone()
    want = mk.decode_stack_mma(x, w, kw, vw, lengths, 1024, config=base)
    mk.decode_stack_mma(x, w, k.clone(), v.clone(), lengths, 1024, config=on)  # compiled before the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = mk.decode_stack_mma(x, w, k, v, lengths, 1024, config=on)
    graph.replay()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(got, want) and torch.equal(k, kw) and torch.equal(v, vw)


@pytest.mark.gpu
def test_cuda_embed_rows_op_is_the_embedding_then_the_stack_bitwise_in_a_graph():
    # T2S_EMBED_STACK_ROWS (one embedding kernel, then the table's stack, the groups' counters zeroed by one
    # fill) captured and replayed twice: logits, k and v bitwise the x-taking op's on torch's embedding
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    stack = registry.resolve(T2S_LAYER_STACK_ROWS, "triton", "cuda")
    embed_stack = registry.resolve(T2S_EMBED_STACK_ROWS, "triton", "cuda")
    w = random_weights(**FULL, dtype=torch.float16, device="cuda")
    embed = random_embed(FULL["vocab"], 2048, FULL["dim"], torch.float16, device="cuda")
    g = torch.Generator(device="cuda").manual_seed(6)
    lengths = torch.randint(0, 1024, (64,), generator=g, device="cuda")
    tokens = torch.randint(0, FULL["vocab"], (64,), generator=g, device="cuda")
    pos = torch.randint(0, 2048, (64,), generator=g, device="cuda")
    shape = (FULL["n_layer"], 64, FULL["n_head"], 1024, 32)
    k, v = (torch.randn(shape, generator=g, device="cuda").half() for _ in range(2))
    kw, vw = k.clone(), v.clone()
    want = stack(ref.embed_reference(tokens, pos, embed), w, kw, vw, lengths, 1024)
    embed_stack(tokens, pos, embed, w, k.clone(), v.clone(), lengths, 1024)  # compiled before the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = embed_stack(tokens, pos, embed, w, k, v, lengths, 1024)
    for _ in range(2):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(got, want) and torch.equal(k, kw) and torch.equal(v, vw)
    assert not want.isnan().any()
