"""Compiles Triton kernels for sm_90 without a GPU (frontend + LLVM; catches the errors the
interpreter cannot see, e.g. a variable whose type differs between branches).

Run anywhere:  python3 scripts/check_compile.py
"""

from __future__ import annotations

import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

import santa_kernels.triton_santa as ts
import santa_kernels.triton_santapp as tsp

TARGET = GPUTarget("cuda", 90, 32)


def compile_kernel(fn, types: list[str], consts: dict) -> str | None:
    """Returns None when ``fn`` compiles, else the error. ``types``: the non-constexpr
    arguments in order; ``consts``: every constexpr argument by name."""
    it = iter(types)
    sig = {name: "constexpr" if name in consts else next(it) for name in fn.arg_names}
    src = ASTSource(
        fn=fn, signature=sig, constexprs={(fn.arg_names.index(k),): v for k, v in consts.items()}
    )
    try:
        triton.compile(src, target=TARGET)
    except Exception as exc:  # report the frontend's message
        return f"{type(exc).__name__}: {exc}"
    return None


def main() -> int:
    failures = 0
    finish_types = ["*fp32", "*fp32", "*i32", "*i32", "*fp32", "*i32", "*i32", "*i32"] + ["i32"] * 6
    for local in (False, True):
        for h_rows in (1, 2, 4):
            consts = {"NUM_KV_HEADS": 8, "GROUP": 4, "G_ROWS": 4, "H_ROWS": h_rows,
                      "C_PAD": 2048, "S_PAD": 32, "LOCAL": local, "WAYS": 8}
            err = compile_kernel(tsp._finish_heads_kernel, finish_types, consts)
            print(f"_finish_heads_kernel local={local} h_rows={h_rows}: {err or 'ok'}")
            failures += err is not None
    score_types = ["*bf16", "*bf16", "*i32", "*i32", "*fp32", "*fp32", "*fp16", "*i64", "fp32"]
    score_types += ["i32"] * 14
    for group, g_rows, subs, stores in ((4, 4, 1, 2), (4, 4, 2, 2), (4, 0, 1, 2), (1, 2, 1, 2),
                                        (8, 8, 1, 2), (4, 4, 1, 0)):
        consts = {"head_dim": 128, "PAGED": False, "TILE": 64, "SUBS": subs, "G_PAD": 16,
                  "D_PAD": 128, "DOT_PRECISION": "tf32", "G_ROWS": g_rows, "STORES": stores}
        err = compile_kernel(ts._score_pass_kernel, score_types, consts)
        print(f"_score_pass_kernel G={group} G_ROWS={g_rows} SUBS={subs} STORES={stores}: "
              f"{err or 'ok'}")
        failures += err is not None
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
