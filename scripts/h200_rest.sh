#!/usr/bin/env bash
# H200: the step outside attention with the Triton decode GEMMs (rest=gemm).
# GPU tests of the decode GEMM path, the sm_90 compile check under the device's Triton,
# scripts/bench_rest.py (step section; SECTIONS= to change), then the e2e table of issue
# #9 with --rest gemm. Usage (.whl/ and .git_sha in the tree):
#   bash scripts/h200_rest.sh RESULTS_DIR RUN_ID [batches=4,8]
#   RESULTS_DIR: a fresh root on the device (e.g. /tmp/e2eroot): cases already stored under
#   it (the carried results/h200, any run id) are skipped and their old dense steps would
#   set the speedups; copy RESULTS_DIR/RUN_ID into results/h200 afterwards
#   env: E2E=0 skips the e2e runs; VENDOR= the vendor dense backends (default flashinfer-tc);
#   SECTIONS= the bench_rest.py sections (default step; none: skip it); METHODS= the
#   sampled methods (default santa-prop:S=128,santapp:M=32)
set -u
out=${1:?usage: bash scripts/h200_rest.sh RESULTS_DIR RUN_ID [batches]}
run=${2:?run id}
batches=${3:-4,8}
source scripts/h200_setup.sh
python3 -m pytest -q -x tests/test_e2e_gemm.py tests/test_e2e_fused.py 2>&1 | tail -2
python3 scripts/check_compile.py 2>&1 | grep -v ": ok$" | tail -5
if [ "${SECTIONS:-step}" != none ]; then  # SECTIONS=none: no bench_rest.py
  python3 scripts/bench_rest.py "${OUT:-/tmp}/rest" ${SECTIONS:-step} > "${OUT:-/tmp}/rest.log" 2>&1
  grep "^step" "${OUT:-/tmp}/rest.log" | cut -c1-110
fi
[ "${E2E:-1}" = 0 ] && exit 0
common=(--config llama-3.1-8b --ctx 32k --batch "$batches" --steps 32 --prefill random
        --rest gemm --results "$out" --run-id "$run" ${FORCE:+--force})
# the dense backends first (ours, then the vendor's in its own process: a failed graph
# capture there cannot poison the rest), then the sampled methods, whose speedups are
# against the fastest dense backend stored so far
COLUMNS=160 timeout 130 santa-bench e2e "${common[@]}" --methods dense \
  --dense-backends triton-splitkv 2>&1 | tail -4
COLUMNS=160 timeout 110 santa-bench e2e "${common[@]}" --methods dense \
  --dense-backends "${VENDOR:-flashinfer-tc}" 2>&1 | tail -4
COLUMNS=160 timeout 230 santa-bench e2e "${common[@]}" \
  --methods "${METHODS:-santa-prop:S=128,santapp:M=32}" 2>&1 | tail -8
python3 -m santa_bench.e2e.report "$out" "$run" 2>&1 | tail -12
[ -n "${OUT:-}" ] && tar -cf "$OUT/e2e-results.tar" "$out/$run"
true
