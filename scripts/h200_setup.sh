#!/usr/bin/env bash
# Source on the H200: installs the FlashInfer wheels of .whl/ and this package.
# Usage (the tree with .whl/*.whl beside it):  source scripts/h200_setup.sh
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | grep -v -i warning || true
export PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
# a copy of the tree without .git: write `git rev-parse HEAD > .git_sha` before copying it
[ -f .git_sha ] && export SANTA_BENCH_GIT_SHA="$(cat .git_sha)"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
