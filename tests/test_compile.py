"""The Triton kernels compile for sm_90 (Hopper) on this machine, GPU or not.

The interpreter runs kernels as Python and cannot see compile-time errors (a variable
whose type differs between the branches of an ``if``, a constexpr misuse); this compiles
the SANTA++ finisher and the prop score pass through Triton's real pipeline (frontend,
LLVM, ptxas from the Triton wheel) for an H100/H200 target, in a subprocess without
``TRITON_INTERPRET`` (the interpreter replaces the kernels' objects at import), and the
selection fast paths' kernels (top-k, rest samples, Quest, vAttention, indexed attention),
which otherwise run only under the interpreter here.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

# the selection fast paths' kernels, each compiled at least once by scripts/check_compile.py
SELECTION_KERNELS = (
    "_score_stats_kernel", "_mass_hist_kernel", "topk _select_kernel",
    "topk _second_byte_kernel", "topk _spread_write_kernel", "_rest_sum_kernel",
    "_systematic_kernel", "_quest_bound_kernel", "_row_topk_kernel", "_indexed_stage1",
    "_indexed_merge", "_scores_kernel", "_vattention_plan_kernel", "_uniform_kernel",
)


def test_kernels_compile_for_hopper():
    # imported here, not at collection: importing triton before the interpreter tests set
    # TRITON_INTERPRET=1 at their import would leave their kernels compiled-mode objects
    pytest.importorskip("triton.backends.nvidia", reason="Triton without its NVIDIA backend")
    script = Path(__file__).resolve().parents[1] / "scripts" / "check_compile.py"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                          text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count(": ok") >= 12, done.stdout
    lines = done.stdout.splitlines()
    missing = [name for name in SELECTION_KERNELS
               if not any(line.startswith(name) and line.endswith(": ok") for line in lines)]
    assert not missing, f"not compiled: {missing}\n{done.stdout}"
    # SANTA++'s attend kernel with draw=pooled under each merge a plan can give it: the
    # last attend program merging (merge_ticket), the merge kernel, the atomic sums
    pooled = [line for line in lines if line.startswith("_attend_kernel pooled")]
    for merge in ("atomic=False ticket=True", "atomic=False ticket=False", "atomic=True"):
        assert any(merge in line and line.endswith(": ok") for line in pooled), (merge, pooled)


def test_sass_summaries_of_one_group_and_a_bad_group():
    """``--only quest --sass``: Quest's kernels alone, each line after its SASS summary
    (an instruction count and the barriers every select runs); an unknown group is one
    line of error and exit 2."""
    pytest.importorskip("triton.backends.nvidia", reason="Triton without its NVIDIA backend")
    script = Path(__file__).resolve().parents[1] / "scripts" / "check_compile.py"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, str(script), "--only", "quest", "--sass"], env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    kernels = [i for i, line in enumerate(lines) if line.endswith(": ok")]
    assert kernels and all(lines[i].startswith(("_quest_bound_kernel", "_row_topk_kernel"))
                           for i in kernels)
    for i in kernels:
        assert re.fullmatch(r"  sass: \d+ instructions \(BAR \d+, .*\)", lines[i - 1]), lines[i - 1]
    bad = subprocess.run([sys.executable, str(script), "--only", "quest,nope"], env=env,
                         capture_output=True, text=True, timeout=120, check=False)
    assert bad.returncode == 2 and "--only: unknown group 'nope'" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_the_select_checks_list_the_kernels_arguments():
    """check_select's launches (not compiled here): one type per non-constexpr argument,
    the select kernel's from ``_select_types`` of its representatives, G_ROWS the group
    padded to a power of two."""
    import triton

    from conftest import load_script

    script = load_script("check_compile")
    launches = []

    def record(fn, types, consts, *args, **kw):
        launches.append((fn, types, consts))

    script.compile_kernel = record
    assert script.check_select() == 0
    assert len(launches) == 13
    for fn, types, consts in launches:
        assert len(types) == len([a for a in fn.arg_names if a not in consts])
        assert consts["G_ROWS"] == triton.next_power_of_2(consts["GROUP"])
        if fn is script.tsp_select._select_kernel:
            assert types == script._select_types(types[1][1:])
    assert {types[1] for fn, types, _ in launches[:10]} == {"*bf16", "*i8"}
