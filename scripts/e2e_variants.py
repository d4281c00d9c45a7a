"""Launch variants of the attention backends inside the e2e decode loop, on one loan.

Run on the H200:  python3 scripts/e2e_variants.py OUT_DIR
Llama-3.1-8B config with random bf16 weights, K/V filled at random (speed only), the
gemm rest, every step one CUDA-graph replay (the e2e loop of ``santa-bench e2e``). One
model and one prefilled session per shape (``E2E_SHAPES``, default ``4x32768,8x32768``);
each variant (``E2E_VARIANTS``: names of :data:`VARIANTS`, default all) decodes the same
prefill ``E2E_ROUNDS`` times (default 2), variants interleaved, so loan drift falls on
all of them alike. Rows (step median / p90 and the attention-only pass, ms; whether the
greedy tokens equal the first variant of the same backend: the variants change launches,
not arithmetic, so they must) go to OUT_DIR/variants.csv as they are measured.
"""

from __future__ import annotations

import contextlib
import csv
import os
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

import santa_kernels.triton_santapp as tsp
import santa_kernels.triton_splitkv as tsk
from santa_bench.e2e.attention import DecodeAttention, TritonSantaPPDecode, TritonSplitKVDecode
from santa_bench.e2e.configs import named_config
from santa_bench.e2e.loop import DecodeSession
from santa_bench.e2e.model import Decoder
from santa_bench.methods import REGISTRY

FIELDS = ["shape", "variant", "round", "step_ms", "step_p90_ms", "attention_ms",
          "same_tokens", "seconds", "note"]


@contextlib.contextmanager
def patched(obj, **values) -> Iterator[None]:
    """Sets attributes (or dict keys, for a dict) for the duration of the block."""
    is_dict = isinstance(obj, dict)
    old = {k: (obj[k] if is_dict else getattr(obj, k)) for k in values}
    for k, v in values.items():
        obj.__setitem__(k, v) if is_dict else setattr(obj, k, v)
    try:
        yield
    finally:
        for k, v in old.items():
            obj.__setitem__(k, v) if is_dict else setattr(obj, k, v)


@contextlib.contextmanager
def plan_overrides(**kw) -> Iterator[None]:
    """SANTA++ plans made inside the block take these :func:`make_plan` keywords."""
    make_plan = tsp.make_plan

    def planned(*args, **given):
        return make_plan(*args, **{**kw, **given})

    with patched(tsp, make_plan=planned):
        yield


def forced_chain(backend: DecodeAttention, on: bool | None) -> DecodeAttention:
    """``backend`` with its PDL chain forced on/off (None: as the loop sets it)."""
    if on is not None:
        set_chain = type(backend).set_pdl_chain
        backend.set_pdl_chain = lambda _on: set_chain(backend, on)  # type: ignore[method-assign]
    return backend


def santapp_params() -> dict:
    method = REGISTRY.get("santapp")
    return {**{p.name: p.default for p in method.params}, "M": 32}


def splitkv(chain: bool | None, merge_pdl: bool):
    def make(scale: float):
        return forced_chain(TritonSplitKVDecode(scale), chain), patched(tsk, MERGE_PDL=merge_pdl)
    return make


def santapp(chain: bool | None, inner_pdl_groups: int | None = None, **plan_kw):
    def make(scale: float):
        ctx = contextlib.ExitStack()
        if inner_pdl_groups is not None:
            ctx.enter_context(patched(tsp.HOPPER, pdl_max_groups=inner_pdl_groups))
        if plan_kw:
            ctx.enter_context(plan_overrides(**plan_kw))
        return forced_chain(TritonSantaPPDecode(santapp_params(), scale, seed=0), chain), ctx
    return make


# name: (family, factory(scale) -> (backend, context active during prepare + decode))
VARIANTS: dict[str, tuple[str, Callable]] = {
    "splitkv": ("dense", splitkv(False, False)),
    "splitkv chain": ("dense", splitkv(True, False)),
    "splitkv merge-pdl": ("dense", splitkv(False, True)),
    "splitkv chain merge-pdl": ("dense", splitkv(True, True)),
    "santapp": ("santapp", santapp(False)),
    "santapp chain": ("santapp", santapp(True)),
    "santapp inner-pdl": ("santapp", santapp(False, 64)),
    "santapp chain inner-pdl": ("santapp", santapp(True, 64)),
    "santapp chain local": ("santapp", santapp(True, local=True)),
}


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "e2e-variants")
    out.mkdir(parents=True, exist_ok=True)
    shapes = [tuple(int(x) for x in s.split("x"))
              for s in os.environ.get("E2E_SHAPES", "4x32768,8x32768").split(",")]
    names = [n.strip() for n in os.environ.get("E2E_VARIANTS", ",".join(VARIANTS)).split(",")]
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        raise SystemExit(f"E2E_VARIANTS: unknown {unknown}; known: {list(VARIANTS)}")
    rounds = int(os.environ.get("E2E_ROUNDS", "2"))
    steps = int(os.environ.get("E2E_STEPS", "32"))
    path = out / "variants.csv"
    new = not path.exists()
    f = path.open("a", newline="")
    w = csv.DictWriter(f, fieldnames=FIELDS)
    if new:
        w.writeheader()
    model = Decoder.random(named_config("llama-3.1-8b"), device="cuda", dtype=torch.bfloat16,
                           seed=0)
    for batch, ctx in shapes:
        session = DecodeSession(model, batch=batch, ctx=ctx, steps=steps, seed=0)
        session.prefill("random")
        shape = f"B={batch} {ctx // 1024}k"
        first_tokens: dict[str, torch.Tensor] = {}
        for rnd in range(rounds):
            for name in names:
                family, make = VARIANTS[name]
                row = {"shape": shape, "variant": name, "round": rnd}
                t0 = time.time()
                try:
                    attend, ctx_manager = make(session.scale)
                    with ctx_manager:
                        session.prepare(attend)
                        result = session.decode(attend, graph=True, rest="gemm")
                    ref = first_tokens.setdefault(family, result.tokens)
                    row.update(step_ms=round(result.step_ms_median, 4),
                               step_p90_ms=round(result.step_ms_p90, 4),
                               attention_ms=round(result.attention_ms_median, 4),
                               same_tokens=bool(torch.equal(ref, result.tokens)))
                except Exception as exc:  # keep the other variants
                    traceback.print_exc()
                    row["note"] = f"{type(exc).__name__}: {exc}"[:300]
                row["seconds"] = round(time.time() - t0, 1)
                w.writerow(row)
                f.flush()
                print(" | ".join(str(row.get(k, "")) for k in FIELDS), flush=True)
                del attend
                torch.cuda.empty_cache()
        del session
        torch.cuda.empty_cache()
    f.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
