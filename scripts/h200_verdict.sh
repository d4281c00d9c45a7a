#!/usr/bin/env bash
# The verdict runs on an H200: the GPU tests of the selection methods, the k-means build and
# the engine; kernel rows of every accuracy configuration at the models' attention shapes,
# the peers (oracle top-k, Quest, vAttention, top-k + S2ANTA) and SANTA++'s operating
# points; FlashInfer's decode kernels (FA3 among them); RULER at 32k for the peers and the
# SANTA++ candidates on Qwen2.5-Coder-0.5B; kernel rows on its captured attention; the
# harness-against-a-plain-loop timing test and SANTA's stages against the byte limit.
# Usage (after `source scripts/h200_setup.sh`):
#   bash scripts/h200_verdict.sh STAGE RESULTS_DIR
# STAGE: tests, peers, shapes, ruler, ruler-peers, ruler-lsh, fa3, captured, timing ($GPU
# names the GPU in the run ids: h200 by default; $CANDIDATES overrides the SANTA++ candidates,
# $TASKS the RULER tasks, $DENSE_LAYERS keeps those layers exact in the RULER stages, e.g. 21,22,23,
# in a run of its own). Runs resume where they stopped.
# ruler and captured need the model and the RULER samples in $SANTA_BENCH_CACHE
# (models/qwen2.5-coder-0.5b/qwen2.5-coder-0.5b.gguf, data/ruler-samples/); captured reads
# RULER's essays, or the text file $HAYSTACK on a machine without RULER's data.
set -uo pipefail
stage=${1:?stage: tests, peers, shapes, ruler, ruler-peers, ruler-lsh, fa3, captured or timing}
results=${2:?results folder}
day=${DAY:-$(date +%F)}
gpu=${GPU:-h200}  # run ids name the GPU
budget=${BUDGET_MS:-80}
qwen05="--heads 14 --kv-heads 2 --head-dim 64"
qwen7="--heads 28 --kv-heads 4 --head-dim 128"
llama8="--heads 32 --kv-heads 8 --head-dim 128"
dense="sdpa-cudnn,sdpa-flash,triton-splitkv"

# the configurations of the committed accuracy runs (2026-12-04-h200-accuracy-ruler*, -santapp:
# SANTA++ with the leader as representative, the default then)
leader="representative=leader"
accuracy="santa-prop:S=128,santa-prop:S=256,santa-flash:S=2048,santa-flash:S=256,santa-sys:S=128"
accuracy+=",santa-strat:S=128,santa-iid:S=128,santapp:M=32,$leader,santapp:M=32,sink=0,window=0,$leader"
accuracy+=",santapp:M=64,$leader,santapp:M=128,$leader,santapp:M=64,team_size=8,$leader"
accuracy+=",santapp:M=128,team_size=8,$leader,santapp:M=32,team_size=64,$leader"
accuracy+=",bernoulli:value_stage=prop,S=128"
# the methods users compare against, and the SANTA++ candidates (the mean as representative:
# the default M=512, within 1 point of dense in 2026-12-06-h100-accuracy-niah-teams; M=256
# and k-means teams, the closest below it in 2026-12-06-h100-accuracy-niah-mean)
peers="oracle-topk:k=1024,quest:pages=64,quest:pages=256,vattention,topk-santa"
candidates="santapp:M=512,santapp:M=256,santapp:M=256,policy=kmeans,santapp:M=64,policy=kmeans"
candidates=${CANDIDATES:-$candidates}
# the SANTA++ paper's operating point: 31 or 32 teams, the team size reading 16-22% of the KV
operating="santapp:M=31,santapp:M=31,team_size=32,santapp:M=32,team_size=32"
operating+=",santapp:M=31,team_size=64"

kernel() {  # kernel RUN_ID SHAPE METHODS BASELINES [extra options]
  local run=$1 shape=$2 methods=$3 baselines=$4; shift 4
  COLUMNS=160 santa-bench kernel --ctx 32k --batch 1,8 $shape --methods "$methods" \
    --baselines "$baselines" --gpu-budget-ms "$budget" --results "$results" \
    --run-id "$run" "$@" 2>&1 | tail -60
}

case "$stage" in
  tests)
    TRITON_INTERPRET=0 python3 -m pytest -q -p no:cacheprovider -m gpu \
      "tests/test_triton_santapp.py::test_kmeans_index_built_on_the_gpu_matches_the_cpu_build_and_decodes" \
      tests/test_selection_gpu.py tests/test_lsh.py tests/test_kernel_captured.py \
      tests/test_gpu_graphs.py tests/test_engine_gpu.py -s -rA 2>&1 \
      | tee "$results/gpu-tests.txt" | tail -40 ;;
  peers)
    for shape in "$qwen05" "$qwen7" "$llama8"; do
      kernel "kernels-$day-$gpu-peers" "$shape" "dense,$peers,$candidates" "$dense"
    done ;;
  shapes)
    # the accuracy runs' configurations at their model's shape, where a GPU lacks them
    [ "$gpu" = h200 ] || kernel "kernels-$day-$gpu-model-shapes" "$qwen05" "$accuracy" "$dense"
    kernel "kernels-$day-$gpu-model-shapes" "$qwen7" "$accuracy,$operating" "$dense"
    kernel "kernels-$day-$gpu-model-shapes" "$llama8" "$accuracy" "$dense"
    kernel "kernels-$day-$gpu-model-shapes" "$qwen05" "$operating" "$dense" ;;
  fa3)
    for shape in "$qwen05" "$qwen7" "$llama8"; do
      kernel "kernels-$day-$gpu-flashinfer" "$shape" dense \
        "sdpa-cudnn,sdpa-flash,flashinfer-tc,flashinfer-cuda,flashinfer-fa3"
    done ;;
  ruler|ruler-peers|ruler-lsh)
    # ruler: the SANTA++ candidates on RULER's eight NIAH tasks; ruler-peers: the peers;
    # ruler-lsh: MagicPIG, whose hash codes take about 24 GB at batch 50 (half on an 80 GB GPU).
    # $TASKS overrides the task list.
    tasks=niah_single_1,niah_single_2,niah_single_3,niah_multikey_1,niah_multikey_2
    tasks+=,niah_multikey_3,niah_multiquery,niah_multivalue
    methods="dense,$candidates" batch=50
    [ "$stage" = ruler-peers ] && methods="dense,$peers"
    [ "$stage" = ruler-lsh ] && methods="dense,magicpig" batch=${LSH_BATCH:-50}
    layers=${DENSE_LAYERS:-}
    santa-bench accuracy ruler --ctx 32k --n 50 --model qwen2.5-coder-0.5b --device cuda \
      --batch "$batch" --results "$results" --run-id "accuracy-$day-$gpu-niah${layers:+-dense${layers//,/}}" \
      ${layers:+--dense-layers "$layers"} --tasks "${TASKS:-$tasks}" --methods "$methods" \
      2>&1 | tail -40 ;;
  captured)
    capture="$SANTA_BENCH_CACHE/captures/qwen2.5-coder-0.5b-32k.safetensors"
    [ -f "$capture" ] || santa-bench capture --model qwen2.5-coder-0.5b --ctx 32k \
      --layers 12,2,5,8,15,18,21,23 --device cuda --dtype bf16 --out "$capture" \
      --text "${HAYSTACK:-ruler-haystack}"
    kernel "kernels-$day-$gpu-captured-qwen" "" "$accuracy,$peers,$candidates" "$dense" \
      --inputs "$capture" ;;
  timing)
    python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_timing_gpu.py -s -rA 2>&1 \
      | tee "$results/timing-test.txt" | tail -30
    python3 scripts/timing_check.py --out "$results/timing_check.csv" 2>&1 \
      | tee "$results/timing-check.txt" | tail -40
    python3 scripts/profile_santa.py --out "$results/santa-stages.csv" 2>&1 \
      | tee "$results/santa-stages.txt" | tail -30 ;;
  *) echo "unknown stage $stage" >&2; exit 2 ;;
esac
