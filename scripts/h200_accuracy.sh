#!/usr/bin/env bash
# The GPU accuracy runs on an H200 (Qwen2.5-Coder-0.5B at 32k, bf16, every decode step of
# every layer through the method's Triton kernel). Usage:
#   bash scripts/h200_accuracy.sh STAGE RESULTS_DIR
# STAGE: smoke (the GPU engine tests), ruler (13 tasks at 32k, 9 configurations), tasks
# (GSM8K and MMLU-Redux), extra (SANTA++ without sink/window, M=64, k-means teams and
# Bernoulli on the 13 RULER tasks; k-means index builds make it slow).
# results/h200/2026-12-04-h200-accuracy-ruler/README.md has what these stages measured.
# Runs resume: a stage killed at its time limit continues where it stopped when re-run.
# Needs the model and data in $SANTA_BENCH_CACHE (models/<name>/<file>.gguf, data/ruler,
# data/gsm8k, data/mmlu-redux; data/ruler-samples holds generated 32k samples, optional).
set -uo pipefail
stage=${1:?stage: smoke, ruler, tasks or extra}
results=${2:?results folder}
model=${MODEL:-qwen2.5-coder-0.5b}
limit=${LIMIT_S:-560}
run_id=${RUN_ID:-accuracy-$(date +%F)-h200}

ruler_methods="dense,santa-prop:S=128,santa-prop:S=256,santa-flash:S=2048"
ruler_methods+=",santa-flash:S=256,santa-sys:S=128,santa-strat:S=128"
ruler_methods+=",santa-iid:S=128,santapp:M=32,sink=4,window=64"
# configurations whose runs did not finish on 2026-12-04 (see that README)
extra_methods="dense,santapp:M=32,santapp:M=64,sink=4,window=64,bernoulli:value_stage=prop,S=128"
extra_methods+=",santapp:M=32,policy=kmeans,sink=4,window=64"

case "$stage" in
  smoke)
    python3 -m pytest -q -p no:cacheprovider tests/test_engine_gpu.py ;;
  ruler)
    timeout "$limit" santa-bench accuracy ruler --tasks all --ctx 32k --n "${N:-50}" \
      --model "$model" --methods "$ruler_methods" --batch "${BATCH:-50}" --device cuda \
      --results "$results" --run-id "$run_id-ruler" ;;
  tasks)
    timeout "$limit" santa-bench accuracy gsm8k --n "${N_GSM8K:-320}" --model "$model" \
      --methods "dense,santa-sys:S=16,santa-strat:S=16,santa-iid:S=16" \
      --batch 64 --device cuda --results "$results" --run-id "$run_id-gsm8k"
    timeout "$limit" santa-bench accuracy mmlu --n "${N_MMLU:-6000}" --model "$model" \
      --methods "dense,santa-sys:S=16,santa-sys:S=256" \
      --batch 64 --device cuda --results "$results" --run-id "$run_id-mmlu" ;;
  extra)
    timeout "$limit" santa-bench accuracy ruler --tasks all --ctx 32k --n "${N:-50}" \
      --model "$model" --methods "$extra_methods" --batch "${BATCH:-50}" --device cuda \
      --results "$results" --run-id "$run_id-ruler-extra" ;;
  *) echo "unknown stage $stage" >&2; exit 2 ;;
esac
