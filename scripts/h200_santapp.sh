#!/usr/bin/env bash
# H200: the SANTA++ Triton kernel (issue #5). Steps (STEPS, default all three):
#   tests    GPU tests of the kernel (graph replays, Llama shapes vs the reference)
#   cli      santa-bench kernel: santapp vs cuDNN SDPA / triton-splitkv, CUDA graphs, cold L2,
#            32k B=1,8 and 128k B=1, M 32,64, P 16,64 (index_build_ms, read_equivalent and
#            the KV read fraction are rows of the store)
#   profile  scripts/profile_santapp.py: stage breakdown, bandwidth vs a device copy, index
#            build vs a dense prefill, the issue's bars (writes $OUT/santapp/*.csv|json)
# Usage (.whl/ in the tree), one step per call keeps each under ~10 min:
#   STEPS=tests bash scripts/h200_santapp.sh; STEPS=cli ...; STEPS=profile ...
#   QUICK=1: 32k B=1 only.  POLICIES=contiguous,kmeans: add the (slow, CPU-built) k-means index.
set -u
source scripts/h200_setup.sh
mkdir -p "$OUT"
steps=${STEPS:-tests cli profile}
if [[ " $steps " == *" tests "* ]]; then
  python3 -m pytest -q -x tests/test_triton_santapp.py tests/test_santapp.py 2>&1 | tail -8
fi
run() {  # ctx batch
  local policies=${POLICIES:-contiguous}
  COLUMNS=160 santa-bench kernel --ctx "$1" --batch "$2" \
    --methods "santapp:M=32|64,team_size=16|64,policy=${policies//,/|}" \
    --baselines sdpa-cudnn,triton-splitkv --graph --results results/h200 \
    --run-id santapp-graph 2>&1 | tail -24
}
if [[ " $steps " == *" cli "* ]]; then
  run 32k 1
  if [ "${QUICK:-0}" != 1 ]; then
    run 32k 8
    run 128k 1
  fi
  tar -cf "$OUT/santapp_results.tar" results/h200
fi
if [[ " $steps " == *" profile "* ]]; then
  python3 scripts/profile_santapp.py "$OUT/santapp" $([ "${QUICK:-0}" = 1 ] && echo --quick) \
    2>&1 | tee "$OUT/santapp_profile.txt"
fi
