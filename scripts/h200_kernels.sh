#!/usr/bin/env bash
# H200: GPU tests of the Triton SANTA kernels and FlashInfer, then the sampled-kernel table.
# Usage: bash scripts/h200_kernels.sh [graph|events] [ctx list] [S list]
set -u
source scripts/h200_setup.sh
mode=${1:-graph}; ctx=${2:-8k,32k,128k}; budgets=${3:-128,256,2048}
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  python3 -m pytest -q -x tests/test_triton_santa.py tests/test_baselines.py 2>&1 | tail -8
fi
flag=$([ "$mode" = graph ] && echo --graph || echo --no-graph)
COLUMNS=150 santa-bench kernel --ctx "$ctx" --batch 1,8 --S "$budgets" \
  --methods ${METHODS:-santa-prop,santa-flash,santa-strat,santa-iid,triton-splitkv} \
  --baselines sdpa-cudnn,sdpa-flash,flashinfer-tc,flashinfer-cuda,flash-attn,sdpa-math \
  $flag --results results/h200 --run-id "kernels-$mode" 2>&1 | tail -70
tar -cf "$OUT/results.tar" results/h200
