#!/usr/bin/env bash
# Process start to first audio of several trees, compared in one device call (issue 4): the lent machines
# differ by 25% between calls and `import torch` alone moves by a second between children, so variants
# are only compared within a call, in rounds of rotating order, on one set of warm on-disk caches.
#   bash benchmarks/startup_ab.sh NAME=TREE [NAME=TREE ...]   (ROUNDS=4; TREE: a copy of a VoiceHub tree
#   with this script's e2e_bench.py; the first tree installs .whl/ through gpu_session.sh)
# Writes $OUT/startup_ab.json (every child's figures and each variant's medians) and prints the table.
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"; WORK=/tmp/startup_ab; mkdir -p "$WORK"
ROUNDS="${ROUNDS:-4}"
names=(); trees=()
for arg in "$@"; do names+=("${arg%%=*}"); trees+=("$(cd "${arg#*=}" && pwd)"); done
(cd "${trees[0]}" && PARTS=none OUT="$WORK" bash benchmarks/gpu_session.sh > /dev/null 2>&1)
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
CACHES="$WORK/caches"; mkdir -p "$CACHES"
export TRITON_CACHE_DIR=$CACHES/triton TORCHINDUCTOR_CACHE_DIR=$CACHES/inductor CUDA_CACHE_PATH=$CACHES/cuda \
  VOICEHUB_CACHE=$CACHES/voicehub
child() {  # index label: one warm_shared child of tree `index`
  (cd "${trees[$1]}" && PYTHONPATH="${trees[$1]}:/tmp/site" timeout 150 python3 benchmarks/e2e_bench.py --profiles none \
    --windows 25,none --startup-profiles triton_minimal --startup-kinds warm_shared --out "$WORK/$2.json" \
    > "$WORK/$2.log" 2>&1 || echo "$2 failed: $(tail -3 "$WORK/$2.log")")
}
for i in "${!trees[@]}"; do child "$i" "fill_${names[$i]}"; done  # each tree's first child fills the caches
n=${#trees[@]}
for ((r = 1; r <= ROUNDS; r++)); do
  for ((k = 0; k < n; k++)); do i=$(((k + r - 1) % n)); child "$i" "${names[$i]}_$r"; done
done
python3 - "$WORK" "$OUT/startup_ab.json" "$ROUNDS" "${names[@]}" <<'PY'
import json, pathlib, statistics as st, sys
work, out, rounds, names = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
rows, meta = {}, None
for name in names:
    for r in range(1, rounds + 1):
        p = work / f"{name}_{r}.json"
        if not p.exists():
            continue
        d = json.loads(p.read_text()); meta = meta or d["meta"]
        c = d["startups"][0]["warm_shared"]
        if "error" in c:
            rows.setdefault(name, []).append({"round": r, "error": c["error"][-500:]}); continue
        L = c["warm_up"]["load"]; t = L["timeline_s"]; a = L["acoustic_graphs"]["capture_s"]
        rows.setdefault(name, []).append({
            "round": r, "start_s": c["process_start_to_first_audio_s"],
            "import_s": c["breakdown_s"]["interpreter_and_torch_import"], "load_s": c["breakdown_s"]["load_and_capture"],
            "weights_s": sum(v for k, v in t.items() if k.startswith("weights.")),
            "optimization_apply_s": t.get("optimization_apply", 0.0), "t2s_capture_s": t.get("t2s_graph_capture", 0.0),
            "reference_s": t.get("voice.reference", 0.0), "encoder_capture_s": a["encoder"], "cfm_capture_s": a["cfm"],
            "vocoder_capture_s": a["vocoder"],
            "chain_s": t.get("voice.chain_sentence", 0.0) + t.get("voice.chain_stream", 0.0),
            "first_audio_ms": c["first_audio_ms"], "timeline_s": t})
medians = {}
for name, rs in rows.items():
    ok = [x for x in rs if "error" not in x]
    if ok:
        medians[name] = {k: round(st.median(x[k] for x in ok), 3) for k in ok[0] if k not in ("round", "timeline_s")}
meta = dict(meta or {}); meta.update(benchmark="gpt_sovits_v3_startup_ab", rounds=rounds, variants=names,
    kind="warm_shared children (one set of warm caches for every tree), rounds in rotating order",
    command="bash benchmarks/startup_ab.sh " + " ".join(names))
out.write_text(json.dumps({"meta": meta, "runs": rows, "medians": medians}, indent=1))
for name, m in medians.items():
    print(name, " ".join(f"{k}={v:.2f}" for k, v in m.items()))
PY
