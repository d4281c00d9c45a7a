#!/usr/bin/env bash
# H200: A/B of two trees on one machine (machine-to-machine spread is 1-2%, the size of the
# changes measured): the rest of the step (bench_rest.py step) and the e2e step at 32k B=4 (dense
# triton-splitkv and SANTA++ M=32), alternating old and new twice.
# Usage (.whl/ and .git_sha in the tree):  bash scripts/h200_ab.sh OLD_TREE
#   OLD_TREE: e.g. `git archive REV pyproject.toml README.md santa_bench kernels scripts`
set -u
old=${1:?usage: bash scripts/h200_ab.sh OLD_TREE}
source scripts/h200_setup.sh > /dev/null 2>&1
python3 -m pip install -q --no-deps --no-build-isolation --target /tmp/oldsite "$old" 2>&1 | grep -v -i warning
out=${OUT:-/tmp/ab}
mkdir -p "$out"
site() { [ "$1" = old ] && echo /tmp/oldsite:/tmp/site || echo /tmp/site; }  # PYTHONPATH
root() { [ "$1" = old ] && echo "$old" || echo .; }  # the tree's scripts
PYTHONPATH=$(site old) python3 -c "import santa_bench; print('old tree:', santa_bench.__file__)"
for tree in old new; do
  PYTHONPATH=$(site $tree) timeout 150 python3 "$(root $tree)/scripts/bench_rest.py" \
    "$out/rest-$tree" step > "$out/rest-$tree.log" 2>&1
  echo "== rest $tree"; grep "^step" "$out/rest-$tree.log" | cut -d'|' -f3-5
done
for rep in 1 2; do
  for tree in old new; do
    PYTHONPATH=$(site $tree) COLUMNS=160 timeout 100 python3 -m santa_bench e2e --config llama-3.1-8b \
      --ctx 32k --batch 4 --steps 32 --prefill random --rest gemm \
      --methods dense,santapp:M=32 --dense-backends triton-splitkv \
      --results /tmp/ab-res --run-id "ab-$tree-$rep" --force 2>&1 | grep -E "^\s+4\s" | sed "s/^/$tree $rep /"
  done
done
tar -cf "$out/ab-results.tar" /tmp/ab-res 2>/dev/null
true
