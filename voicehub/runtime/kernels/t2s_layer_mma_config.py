"""The many-row stack's block configuration (`t2s_layer_mma_triton`): one MmaConfig per model shape.

Every field but those in RESULT_FREE changes the order of float operations or the MMA instruction, so a
config is fixed per model shape and never chosen by the batch size or the KV bucket (a row's numbers must not
depend on them); only RESULT_FREE fields may change with the batch or the KV bucket (BUCKET_CHANGES).
`benchmarks/t2s_layer_bench.py --mma-grid` searches it on a GPU; CONFIGS holds the winners.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

MIN_DOT = 16  # tl.dot's smallest tile side
# the fields that change where and when kernels run but no value (the GPU tests hold them to bitwise equality)
RESULT_FREE = frozenset(
    "pdl pdl_late pdl_attn ffn_tickets kv_evict_first kv_prefetch kv_prefetch_own w_prefetch gemm_stages attn_stages "
    "row_groups group_rows attn_stream".split()
)


@dataclass(frozen=True)
class MmaConfig:
    """Rows per GEMM program (block_m), outputs per qkv / out-proj / ffn2 / head program (block_n),
    the reduction chunk (block_k), hidden units per ffn1 program (ffn_block), KV slots per attention
    tile (attn_block) and tiles per attention program (attn_tiles: a program covers attn_block *
    attn_tiles slots, online softmax over its tiles; covering the whole cache, no merge pass), and warps;
    qkv / out / ffn1 / ffn2_splits: programs per output tile of that GEMM, each over a fixed part of K,
    the partials summed in a fixed order by the last to finish (`t2s_layer_mma_splitk_triton`; 1: whole K).
    Fields outside RESULT_FREE change the order of float operations or the MMA instruction (see the module)."""

    block_m: int = 16
    block_n: int = 32
    block_k: int = 64
    ffn_block: int = 64
    attn_block: int = 64
    attn_tiles: int = 1
    gemm_warps: int = 4
    attn_warps: int = 4
    # software pipelining depth of the GEMMs' K loops (Triton's num_stages): when loads issue, no effect on results
    gemm_stages: int = 3
    # the attention's tile loop: 1, each tile's K/V loads then its math; n > 1, Triton pipelines the loads
    # (cp.async into shared memory, n - 1 tiles ahead; the cache hint of kv_evict_first does not apply)
    attn_stages: int = 1
    pdl: bool = True  # programmatic dependent launch where the GPU has it (sm_90+): no effect on results
    # with pdl, a kernel lets the next one launch only once its own wait is over (at most two kernels on
    # the GPU at a time), not at its start: no effect on results
    pdl_late: bool = False
    # PDL on one edge only (pdl off): the attention kernel launches while its row group's qkv kernel runs (qkv
    # lets it at once) and loads its first K/V tile (earlier steps' slots) before it waits: no effect on results
    pdl_attn: bool = False
    qkv_splits: int = 1
    out_splits: int = 1
    ffn1_splits: int = 1
    ffn2_splits: int = 1
    # out-proj / ffn2 normalise the rows once per row block for ffn1 / qkv / the head (plain GEMMs then):
    # `t2s_layer_mma_prenorm_triton`
    prenorm: bool = False
    # 0: ffn1 and ffn2 as two kernels; n >= 1: one kernel (`t2s_ffn_fused_triton`), a program per (row block,
    # slice of ffn_dim / n hidden units) walking its slice ffn_chunk units at a time, the n partials of
    # a row block summed in slice order by the last to finish
    ffn_slices: int = 0
    ffn_chunk: int = 32
    # the out-projection inside the attention kernel (needs prenorm): each (row, head) program stores its
    # head's share of the row's out-projection (fp32), the row's last head to finish sums the shares in
    # head order and stores LN1 to x_ffn; no out-proj kernel
    attn_out: bool = False
    # ffn1 and ffn2 (ffn_slices 0) in one kernel whose programs take tickets, ffn2's tiles waiting for
    # their K range of h (`t2s_ffn_ticket_triton`): the same tiles and operations, no effect on results
    ffn_tickets: bool = False
    # the attention kernel reads K and V with evict_first (read once a step, ~60-100 MB a layer at 64 rows:
    # the weights and partials stay in L2 instead); no effect on results
    kv_evict_first: bool = False
    # tiles (attn_block slots each, from slot 0) of the next layer's K and V that each attention program
    # prefetches into L2 once its own tiles are read (cp.async.bulk.prefetch.L2, sm_90+; on the last layer the
    # next step's first): the next attention reads them from L2 while memory would sit idle during the GEMMs
    # between the two. 0: none. No effect on results
    kv_prefetch: int = 0
    # each attention program starts by prefetching its own span's K/V (below the row's length + 1) into L2 at once,
    # so the tile loop's later loads wait on L2, not memory (a pipeline with no registers or shared memory: the
    # register- and cp.async-pipelined loops lost to their occupancy). No effect on results
    kv_prefetch_own: bool = False
    # each attention program starts by prefetching into L2 its share of the weights the GEMMs after it read (this
    # layer's W1, W2, the next layer's W_qkv, W_o; the first row group's attention only): those GEMMs then wait
    # on L2, not memory (151 MB of weights a step miss a 50 MB L2). No effect on results
    w_prefetch: bool = False
    # the rows in up to row_groups groups of whole row blocks, each group's kernels on a CUDA stream of its
    # own (forked and joined inside the step), the groups' attentions taking turns (layer by layer, group by
    # group): one group's GEMM chain (latency-bound) runs beside another's attention (bandwidth-bound). A
    # row's kernels are those of a single group: no effect on results
    row_groups: int = 1
    # the fewest rows a row group takes (fewer groups at smaller batches: 16-row groups lost on an H100)
    group_rows: int = 1
    # with several row groups: every group's GEMMs on a stream of higher priority, the attentions in turn on
    # the caller's stream (`t2s_layer_mma_groups.GroupStreams`): the block scheduler starts a GEMM's programs
    # before pending attention programs. Where kernels run, not what they compute: no effect on results
    attn_stream: bool = False

    def __post_init__(self) -> None:
        if self.attn_out and not self.prenorm:
            raise ValueError("MmaConfig.attn_out needs prenorm (its last head stores LN1 for a plain ffn1)")
        if self.pdl_late and not self.pdl:
            raise ValueError("MmaConfig.pdl_late needs pdl (it moves PDL's launch of the next kernel)")
        if self.pdl_attn and self.pdl:
            raise ValueError("MmaConfig.pdl_attn is PDL on the qkv -> attention edge alone: pdl must be off")
        if self.ffn_tickets and self.ffn_slices:
            raise ValueError("MmaConfig.ffn_tickets runs the unfused pair's tiles: ffn_slices must be 0")
        if self.kv_prefetch < 0:
            raise ValueError(f"MmaConfig.kv_prefetch counts tiles: >= 0 (0: none), got {self.kv_prefetch}")
        if self.gemm_stages < 1 or self.attn_stages < 1:
            raise ValueError("MmaConfig.gemm_stages and attn_stages must be >= 1 (1: no pipelining)")
        for name, value in vars(self).items():
            # the power-of-two rule spares the flags (bools), the pipelining depths, the prefetch's tile count
            # and ffn_slices 0 (no fused FFN)
            counts = ("gemm_stages", "attn_stages", "kv_prefetch")
            spared = name in counts or (name == "ffn_slices" and value == 0)
            if isinstance(value, bool) or spared:
                continue
            if value < 1 or value & (value - 1):
                raise ValueError(f"MmaConfig.{name} must be a power of two, got {value}")
        for name in ("block_m", "block_n", "block_k", "ffn_block", "ffn_chunk"):
            if getattr(self, name) < MIN_DOT:
                raise ValueError(f"MmaConfig.{name} must be >= {MIN_DOT} (tl.dot's smallest tile)")


# (dim, ffn_dim, n_head, vocab) -> config. v3: tuned on the H200 by `t2s_layer_bench.py --mma-grid`
# (benchmarks/results/t2s_layer_mmagrid_h200.json: 64 rows 2,106 -> 1,375 us a step in session 6; then
# t2s_layer_mmagrid_ffn_h200.json: 1,379 -> 1,337 us, 128 rows 2,247 -> 2,018 us, 16 rows 973 -> 961 us). K chunks of 256;
# attention programs walk 8 tiles of 128 slots (a whole 1,024-slot bucket in one program: no partials,
# no merge); QKV, FFN1 and FFN2 split K in 2, 2 and 4 fixed parts; each layer's norm once a row
# (prenorm); PDL off (slower for this stack on the H200). The fused FFN (ffn_slices 4-32) was slower:
# 1,753-2,275 us at 64 rows. attn_out (session 12, t2s_rows_probe_h200_f16374d.json): 64 rows 1,149 -> 1,125 us at
# KV length 480; closed loop 1-64 streams +1.5-8%, 128 streams -6.5% (t2s_batch_triton_h200*.json).
# Session 13 (t2s_rows_probe_h200.json, t2s_layer_mmagrid_attnout_h200.json): ffn_tickets (1,127 -> 1,173 us at
# 64 rows, KV 480) and pdl_late (1,335-1,343 us) slower; a grid from this entry finds no faster single change.
# Session 21 (t2s_rows_probe_h100_l2.json, H100): kv_evict_first 1,290 -> 1,253 us at 64 rows, KV 480, and
# 1,535 -> 1,496 at 730 (bit-equal); weights prefetched into L2 beside attention (a side-stream kernel) slower.
# Session 22 (t2s_rows_probe_h100_stages.json, H100): attn_stages 2 / 3 (the tile loop pipelined, bit-equal)
# slower, 1,250 -> 1,341 / 1,453 us at 64 rows, KV 480.
# Session 25 (t2s_rows_probe_h100_row_groups.json, H100): row_groups 2 (two groups of 32 rows whose attentions take
# turns) 1,516 -> 1,383 us at 64 rows, KV 730, equal at 480; four groups of 16 slower (1,570 / 1,970 us): groups
# of at least 32 rows. Closed loop (t2s_batch_triton_h100_3ac7dfe*.json): 64 streams +2.2%, 128 streams +1.3%.
# Session 27 (t2s_batch_triton_h100_e7d9d12*.json, H100): this entry against row_groups 1, 64 streams +0.9%, 128
# streams +3.3%; attn_stream within 1.4% either way and PDL with groups 4-8% slower (t2s_rows_probe_h100_e7d9d12_*.json).
# Session 28 (H100, one group, 64 rows, KV 480; bit-equal, then removed): ffn1 + ffn2 + the next qkv as one
# cooperative persistent kernel 1,240 -> 1,288 us (t2s_rows_probe_h100_9ebd213_chain.json; a grid barrier costs
# about a kernel boundary, launch_floor_h100_9ebd213.json), attention programs of two rows sharing W_o's reads
# 1,240 -> 1,362 us (t2s_rows_probe_h100_2cbb388_attn_pair.json).
# Session 29 (H100, t2s_rows_probe_h100_ce52759_block_m.json): block_m 32 / 64 bit-equal on sm_90 but slower
# (1,261 -> 1,259-1,335 / 1,649 us at 64 rows, KV 480; 1,385 -> 1,442-1,564 / 1,899 at 730).
# Session 30 (H100, t2s_rows_probe_h100_3469411.json, 64 rows): one row group 1,242 / 1,496 us and K/V without evict_first
# 1,370 / 1,444 against this entry's 1,237-1,251 / 1,354-1,356 at KV 480 / 730: both stay.
# gemm_stages 3 (t2s_rows_probe_h100_ee9efac_stages.json, bit-equal): 1,244-1,255 -> 1,161 us at KV 480, 1,348-1,351 ->
# 1,375 at 730; in the engine (session 31) a gain only at 64 rows and up to 512 slots: BUCKET_CHANGES below.
# Sessions 31-33 (removed): the out-projection's tiles in the attention's launch (out_tickets; tiles waiting on
# their row block's heads) 1,544 us against the two kernels' 1,313 and this entry's 1,168 at 64 rows, KV 480 (H100,
# t2s_rows_probe_out_tiles_h100_2f14ef0.json); the attention's next K/V tile prefetched into registers (187 registers)
# 1,317, attn_stages 2 with two row groups 1,300 (t2s_rows_probe_attn_prefetch_h100_2f14ef0.json).
# Session 34 (removed): the q / k / v projection inside the attention kernel (attn_in: each (row, head) program projects
# its own q, k, v; no qkv kernel) 1,772 us, 1,406 with the groups' attentions free to overlap, against 1,165-1,178 at 64
# rows, KV 480 (H100, t2s_rows_probe_attn_in_h100_3212074.json).
CONFIGS = {
    (512, 2048, 16, 1025): MmaConfig(
        block_k=256,
        attn_block=128,
        attn_tiles=8,
        attn_warps=2,
        gemm_stages=2,
        pdl=False,
        qkv_splits=2,
        ffn1_splits=2,
        ffn2_splits=4,
        prenorm=True,
        attn_out=True,
        kv_evict_first=True,
        row_groups=2,
        group_rows=32,
    )  # fmt: skip
}


@dataclass(frozen=True)
class BucketChange:
    """RESULT_FREE fields changed for a step of min_rows..max_rows rows (max_rows None: no upper bound)
    whose KV bucket has at most max_slots slots: a field whose best value depends on the batch's or the
    cache's size. Only RESULT_FREE fields (ValueError otherwise): a row's numbers must not depend on its
    batch or bucket."""

    max_slots: int
    change: dict
    min_rows: int = 1
    max_rows: int | None = None

    def __post_init__(self) -> None:
        if not self.change:
            raise ValueError("BucketChange changes no field")
        if outside := sorted(set(self.change) - RESULT_FREE):
            raise ValueError(f"BucketChange at {self.max_slots} slots changes {outside}, fields outside "
                             "RESULT_FREE: a row's numbers would depend on its batch or bucket")  # fmt: skip
        top = self.min_rows if self.max_rows is None else self.max_rows
        if self.max_slots < 1 or not 1 <= self.min_rows <= top:
            raise ValueError(f"BucketChange needs max_slots >= 1 and 1 <= min_rows <= max_rows, got max_slots"
                             f" {self.max_slots}, rows {self.min_rows}..{self.max_rows}")  # fmt: skip

    def holds(self, n_rows: int, n_slots: int) -> bool:
        top = n_rows if self.max_rows is None else self.max_rows
        return n_slots <= self.max_slots and self.min_rows <= n_rows <= top


# (dim, ffn_dim, n_head, vocab) -> BucketChanges: the first that holds a step changes CONFIGS' entry there.
# v3, session 31 (H100, the engine's replay at 16-128 streams, t2s_batch_triton_h100_4a3c498_*.json; KV
# buckets 256-768): gemm_stages 3 up to 512 slots -1.8% / -2.0% a step at 64 rows (1,255 / 1,258 -> 1,232 /
# 1,233 us), +0.9% / +1.1% at 128 rows and +0.5% at 16 and 32 (bit-equal: RESULT_FREE's GPU test); at every
# bucket (768 too) -1.6% at 64 rows, +2.1% at 128. One 64-row step (t2s_layer_mmagrid_{stages,stages4,attn480,
# attn730}_*h100_c1a01aa.json): -2% at KV 240 and 350, -7% at 480, -0.4% at 600, +1.2-1.7% at 730; gemm_stages
# 4 slower than 3 at each. With it the engine ran 49,725 tokens/s at 64 streams
# (t2s_batch_triton_h100_c1a01aa.json; attention fields re-searched: the entry wins)
BUCKET_CHANGES: dict[tuple[int, int, int, int], tuple[BucketChange, ...]] = {
    (512, 2048, 16, 1025): (BucketChange(512, {"gemm_stages": 3}, min_rows=33, max_rows=64),),
}


def config_for(
    dim: int, ffn_dim: int, n_head: int, vocab: int, n_rows: int | None = None, n_slots: int | None = None
) -> MmaConfig:
    """The table's entry, else the defaults with the reduction chunk no wider than the model; given a step's
    n_rows and n_slots (both or neither), with the first of BUCKET_CHANGES that holds the step applied."""
    if (n_rows is None) != (n_slots is None):
        raise ValueError("config_for takes a step's n_rows and n_slots together (or neither: the entry)")
    key = (dim, ffn_dim, n_head, vocab)
    entry = CONFIGS.get(key) or MmaConfig(block_k=max(MIN_DOT, min(64, 1 << (dim - 1).bit_length())))
    if n_rows is not None:
        for bucket in BUCKET_CHANGES.get(key, ()):
            if bucket.holds(n_rows, n_slots):
                return replace(entry, **bucket.change)
    return entry
