"""The Triton kernels compile for sm_90 (Hopper) on this machine, GPU or not.

The interpreter runs kernels as Python and cannot see compile-time errors (a variable
whose type differs between the branches of an ``if``, a constexpr misuse); this compiles
the SANTA++ finisher and the prop score pass through Triton's real pipeline (frontend,
LLVM, ptxas from the Triton wheel) for an H100/H200 target.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("triton.backends.nvidia", reason="Triton without its NVIDIA backend")


def test_kernels_compile_for_hopper(capsys):
    path = Path(__file__).resolve().parents[1] / "scripts" / "check_compile.py"
    spec = importlib.util.spec_from_file_location("check_compile", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    failures = module.main()
    out = capsys.readouterr().out
    assert failures == 0, out
    assert out.count(": ok") >= 12
