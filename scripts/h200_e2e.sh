#!/usr/bin/env bash
# H200: GPU tests of the e2e decode loop, then the end-to-end table of issue #9:
# Llama-3.1-8B shape (random bf16 weights, random K/V prefill), 32k, batch 4 and 8,
# every dense backend vs santa-prop S=128 (and SANTA++ M=32 when its kernel exists).
# Usage: bash scripts/h200_e2e.sh RESULTS_DIR [steps=64] [batches=4,8]
#   env: SKIP_TESTS=1 skips the GPU tests; FORCE=1 re-runs cases already in the store;
#   RUN= the run id; DENSE= our dense backends (default triton-splitkv,sdpa); VENDOR= the vendor dense backends run in their
#   own process (default flashinfer-tc,flash-attn; flashinfer-cuda is ~1.5x slower at 32k
#   in results/h200/kernels-graph and costs another JIT build).
set -u
out=${1:?usage: bash scripts/h200_e2e.sh RESULTS_DIR [steps] [batches]}
steps=${2:-64}
batches=${3:-4,8}
run=${RUN:-e2e-llama8b-32k}
source scripts/h200_setup.sh
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  python3 -m pytest -q -x -m gpu tests/test_e2e.py 2>&1 | tail -8
fi
common=(--config llama-3.1-8b --ctx 32k --batch "$batches" --steps "$steps" --prefill random
        --results "$out" --run-id "$run" ${FORCE:+--force})
methods=santa-prop:S=128
[ -f kernels/santa_kernels/triton_santapp.py ] && methods="$methods,santapp:M=32"
# 1. our split-KV and torch SDPA; 2. the vendor backends in their own process (a failed
# graph capture there cannot poison the rest); 3. the sampled methods, whose speedups are
# against the fastest dense backend stored by 1 and 2 (same store, same environment).
COLUMNS=160 santa-bench e2e "${common[@]}" --methods dense \
  --dense-backends "${DENSE:-triton-splitkv,sdpa}" 2>&1 | tail -12
COLUMNS=160 santa-bench e2e "${common[@]}" --methods dense \
  --dense-backends "${VENDOR:-flashinfer-tc,flash-attn}" 2>&1 | tail -12
COLUMNS=160 santa-bench e2e "${common[@]}" --methods "$methods" 2>&1 | tail -12
python3 -m santa_bench.e2e.report "$out" "$run"
[ -n "${OUT:-}" ] && tar -cf "$OUT/e2e-results.tar" "$out"
true
