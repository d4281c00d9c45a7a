#!/usr/bin/env bash
# H200: GPU tests of the timing core, baselines and split-KV kernel, then the dense table.
set -u
source scripts/h200_setup.sh
python3 -m pytest -q -x tests/test_timing.py tests/test_baselines.py tests/test_triton_splitkv.py 2>&1 | tail -15
mode=${1:-graph}
flag=$([ "$mode" = graph ] && echo --graph || echo --no-graph)
COLUMNS=160 santa-bench kernel --ctx 8k,32k,128k --batch 1,8 --methods triton-splitkv \
  --baselines auto $flag --results results/h200 --run-id "dense-$mode" 2>&1 | tail -60
tar -cf "$OUT/results.tar" results/h200
