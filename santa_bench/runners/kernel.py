"""The kernel runner: one decode step of attention per case, timed and checked.

A case is a flat dict (method, its parameters, shape, dtype, layout, seed, device).
Each case yields tidy rows: latency, error against dense (relative L2, cosine), read
fractions and the byte model. On a CPU the exact PyTorch references are timed with
the wall clock (``timing=cpu-wall``); GPU timing plugs in through ``time_case``.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

import santa_kernels as sk
from santa_bench.inputs import DecodeShape, make_decode_inputs, parse_dtype
from santa_bench.methods import REGISTRY, Method, Registry

SHAPE_KEYS = ("batch", "ctx", "heads", "kv_heads", "head_dim")


@dataclass(frozen=True)
class KernelGrid:
    """What ``santa-bench kernel`` sweeps: methods x budgets x contexts x batches."""

    methods: list[tuple[Method, dict[str, Any]]]
    ctx: list[int]
    batch: list[int]
    S: list[int]
    heads: int = 32
    kv_heads: int = 8
    head_dim: int = 128
    dtype: str = "bf16"
    layout: str = "contiguous"
    page_size: int = 16
    seed: int = 0
    device: str = "cpu"


def expand_cases(grid: KernelGrid) -> list[dict[str, Any]]:
    """Returns one case per (ctx, batch, method, budget); methods without S ignore ``S``.

    Cases whose budget exceeds the context are dropped (they would be dense in disguise).
    """
    cases = []
    for ctx, batch in itertools.product(grid.ctx, grid.batch):
        for method, overrides in grid.methods:
            names = {p.name for p in method.params}
            budgets: Iterable[int | None] = (
                grid.S if "S" in names and "S" not in overrides else [None]
            )
            for budget in budgets:
                params = dict(overrides)
                if budget is not None:
                    params["S"] = budget
                resolved = method.resolve_params(params)
                if resolved.get("S") is not None and "S" in names and resolved["S"] > ctx:
                    continue
                case = {
                    "kind": "kernel",
                    "method": method.name,
                    "family": method.family,
                    **resolved,
                    "batch": batch,
                    "ctx": ctx,
                    "heads": grid.heads,
                    "kv_heads": grid.kv_heads,
                    "head_dim": grid.head_dim,
                    "dtype": grid.dtype,
                    "layout": grid.layout,
                    "page_size": grid.page_size if grid.layout == "paged" else 0,
                    "seed": grid.seed,
                    "device": grid.device,
                }
                cases.append(case)
    return cases


def method_params(case: dict[str, Any], method: Method) -> dict[str, Any]:
    """Returns the method's parameters stored in ``case``."""
    return {p.name: case[p.name] for p in method.params if p.name in case}


def relative_l2(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Returns ``||out - ref|| / ||ref||`` in float64."""
    out, ref = out.double(), ref.double()
    return float((out - ref).norm() / ref.norm().clamp_min(1e-300))


def cosine(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Returns the mean cosine similarity over (sequence, head) output vectors."""
    return float(torch.nn.functional.cosine_similarity(out.double(), ref.double(), dim=-1).mean())


def cpu_wall_time(
    fn: Callable[[], Any], *, budget_s: float = 1.0, max_reps: int = 20
) -> list[float]:
    """Returns wall-clock samples in microseconds (at least one; stops at the budget)."""
    samples: list[float] = []
    started = time.perf_counter()
    while len(samples) < max_reps:
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e6)
        if time.perf_counter() - started > budget_s:
            break
    return samples


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else 0.5 * (ordered[mid - 1] + ordered[mid])


class KernelRunner:
    """Runs kernel cases; keeps the last inputs and dense output to share across methods."""

    def __init__(self, registry: Registry = REGISTRY, cpu_budget_s: float = 1.0) -> None:
        self.registry = registry
        self.cpu_budget_s = cpu_budget_s
        self._inputs_key: tuple | None = None
        self._inputs: tuple[torch.Tensor, sk.KVCache, torch.Tensor] | None = None

    def inputs(self, case: dict[str, Any]) -> tuple[torch.Tensor, sk.KVCache, torch.Tensor]:
        """Returns ``(q, kv, dense_out)`` for the case's shape, reusing the last ones."""
        key = tuple(
            case[k] for k in (*SHAPE_KEYS, "dtype", "layout", "page_size", "seed", "device")
        )
        if key != self._inputs_key:
            self._inputs = None  # free the previous cache first
            shape = DecodeShape(**{k: case[k] for k in SHAPE_KEYS})
            q, kv = make_decode_inputs(
                shape,
                dtype=parse_dtype(case["dtype"]),
                layout=case["layout"],
                page_size=case["page_size"] or 16,
                seed=case["seed"],
                device=case["device"],
            )
            dense = sk.dense_attention(q, kv).out
            self._inputs, self._inputs_key = (q, kv, dense), key
        assert self._inputs is not None
        return self._inputs

    def run(self, case: dict[str, Any]) -> list[dict[str, Any]]:
        """Returns the case's rows (``skipped`` with a reason when the method can't run)."""
        method = self.registry.get(case["method"])
        ok, reason = method.available()
        if not ok:
            return [_row("latency", math.nan, "us", status="skipped", reason=reason)]
        q, kv, dense = self.inputs(case)
        params = method_params(case, method)
        result = method.run_reference(q, kv, params, seed=case["seed"])
        samples = cpu_wall_time(
            lambda: method.run_reference(q, kv, params, seed=case["seed"]),
            budget_s=self.cpu_budget_s,
        )
        element_size = q.element_size()
        rows = [
            _row("latency", _median(samples), "us", timing="cpu-wall", samples=len(samples)),
            _row("rel_l2_vs_dense", relative_l2(result.out, dense), "ratio"),
            _row("cosine_vs_dense", cosine(result.out, dense), "ratio"),
            _row("bytes_read", method.bytes_read(result.reads, element_size, q.shape[1]), "B"),
        ]
        rows += [_row(k, v, "ratio") for k, v in result.reads.as_metrics().items()]
        return rows


def _row(
    metric: str, value: float, unit: str, status: str = "ok", reason: str = "", **extra
) -> dict:
    return {
        "metric": metric,
        "value": float(value),
        "unit": unit,
        "status": status,
        "reason": reason,
        **extra,
    }
