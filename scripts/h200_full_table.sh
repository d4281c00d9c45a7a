#!/usr/bin/env bash
# The full kernel table on an H200, resumable across machines.
# Usage (.whl/ and .git_sha in the tree): source scripts/h200_setup.sh;
#   bash scripts/h200_full_table.sh RUN_ID SECONDS CTX [BATCH]
# Runs every SANTA method at S = 64..2048 with every dense baseline for the given
# contexts and batches into /tmp/kroot, seeded with results/$GPU/RUN_ID ($GPU: h200 by
# default) when the repo holds part of the run already (finished cases are skipped),
# stops after SECONDS (finished cases stay stored) and tars the run into $OUT/kroot.tar.
set -u
run_id=$1 seconds=$2 ctx=$3 batch=${4:-1,8}
mkdir -p /tmp/kroot
seed="results/${GPU:-h200}/$run_id"
[ -d "$seed" ] && [ ! -d "/tmp/kroot/$run_id" ] && cp -r "$seed" /tmp/kroot/
timeout "$seconds" santa-bench kernel --ctx "$ctx" --batch "$batch" \
  --S 64,128,256,512,1024,2048 \
  --methods santa-iid,santa-strat,santa-sys,santa-prop,santa-flash \
  --baselines auto --graph --results /tmp/kroot --run-id "$run_id"
echo "rc=$?"
tar cf "$OUT/kroot.tar" -C /tmp/kroot "$run_id"
