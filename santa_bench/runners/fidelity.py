"""The fidelity runner: a method's error against dense as a random estimator.

A case is (pattern, method and its parameters, shape, seeds). Its rows: the mean
relative L2 error and cosine over seeds, the bias (relative, and the largest |z| of
the seed mean against the exact output), the spread over seeds, the KL divergence of
the attention distribution where the method estimates one (Bernoulli scores with a
dense value stage), and the read fractions (with the hash-code bytes of a method that
scans an index, as ``index_read_fraction``). A method that promises its error (its
``promise``: at most epsilon with probability 1 - delta) adds the share of draws that
broke it and whether that share is within delta. References run in float64.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any

import torch

import santa_kernels as sk
from santa_bench.accuracy.patterns import make_pattern
from santa_bench.fidelity import seed_statistics
from santa_bench.inputs import DecodeShape
from santa_bench.kernel_keys import SHAPE_KEYS
from santa_bench.methods import REGISTRY, Method, Promise, Registry
from santa_bench.runners.kernel import cosine, method_params, relative_l2
from santa_bench.runners.schema import FIDELITY


@dataclass(frozen=True)
class FidelityGrid:
    """What ``santa-bench accuracy fidelity`` sweeps: patterns x methods x budgets."""

    methods: list[tuple[Method, dict[str, Any]]]
    patterns: list[str]
    S: list[int]
    ctx: list[int]
    batch: int = FIDELITY.default("batch")
    heads: int = FIDELITY.default("heads")
    kv_heads: int = FIDELITY.default("kv_heads")
    head_dim: int = FIDELITY.default("head_dim")
    seeds: int = FIDELITY.default("seeds")
    input_seed: int = FIDELITY.default("seed")
    inputs: str | None = None  # a `santa-bench capture` file: patterns captured:<model>:L<n>


def _pattern_shapes(grid: FidelityGrid) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """Each (pattern, shape keys, extra case keys) of the grid.

    A captured pattern takes its shape from the file (batch = captured positions)
    and runs once, at the captured context; synthetic ones run at every ``ctx``.
    """
    from santa_bench.capture import CAPTURED_PREFIX, captured_shape, file_digest

    out = []
    for ctx in grid.ctx:
        for pattern in grid.patterns:
            if pattern.startswith(CAPTURED_PREFIX):
                continue
            shape = {"batch": grid.batch, "ctx": ctx, "heads": grid.heads}
            shape |= {"kv_heads": grid.kv_heads, "head_dim": grid.head_dim}
            out.append((pattern, shape, {}))
    captured = [p for p in grid.patterns if p.startswith(CAPTURED_PREFIX)]
    if captured:
        if not grid.inputs:
            raise ValueError(f"patterns {captured}: need --inputs (a capture file)")
        extra = {"inputs": file_digest(grid.inputs), "_inputs": str(grid.inputs)}
        shape = captured_shape(grid.inputs)
        out += [(pattern, shape, extra) for pattern in captured]
    return out


def expand_fidelity_cases(grid: FidelityGrid) -> list[dict[str, Any]]:
    """Returns one case per (ctx, pattern, method, budget); budgets above ctx are dropped."""
    cases = []
    for (pattern, shape, extra), (method, overrides) in itertools.product(
        _pattern_shapes(grid), grid.methods
    ):
        ctx = shape["ctx"]
        names = {p.name for p in method.params}
        budgets = grid.S if "S" in names and "S" not in overrides else [None]
        for budget in budgets:
            params = dict(overrides) | ({"S": budget} if budget is not None else {})
            resolved = method.resolve_params(params)
            if "S" in names and resolved["S"] > ctx:
                continue
            cases.append(
                {
                    "kind": "fidelity",
                    "method": method.name,
                    "family": method.family,
                    **resolved,
                    "pattern": pattern,
                    **shape,
                    "dtype": "fp64",
                    "seeds": grid.seeds,
                    "seed": grid.input_seed,
                    "device": "cpu",
                    **extra,
                }
            )
    return cases


class FidelityRunner:
    """Runs fidelity cases; reuses the inputs and exact output across methods."""

    def __init__(self, registry: Registry = REGISTRY) -> None:
        self.registry = registry
        self._key: tuple | None = None
        self._inputs: tuple[torch.Tensor, sk.KVCache, sk.AttentionOutput] | None = None

    def inputs(self, case: dict[str, Any]) -> tuple[torch.Tensor, sk.KVCache, sk.AttentionOutput]:
        key = (case["pattern"], case["seed"], case.get("inputs"), *(case[k] for k in SHAPE_KEYS))
        if key != self._key:
            if "_inputs" in case:  # a captured pattern
                from santa_bench.capture import file_digest, load_captured

                if file_digest(case["_inputs"]) != case["inputs"]:
                    raise ValueError(f"{case['_inputs']}: not the capture this case names")
                q, kv = load_captured(case["_inputs"], case["pattern"])
            else:
                shape = DecodeShape(**{k: case[k] for k in SHAPE_KEYS})
                q, kv = make_pattern(
                    case["pattern"], shape, seed=case["seed"], dtype=torch.float64
                )
            exact = sk.dense_attention(q, kv, compute_dtype=torch.float64)
            self._inputs, self._key = (q, kv, exact), key
        assert self._inputs is not None
        return self._inputs

    def run(self, case: dict[str, Any]) -> list[dict[str, Any]]:
        """Returns the case's rows."""
        method = self.registry.get(case["method"])
        q, kv, exact = self.inputs(case)
        params = method_params(case, method)
        draws: list[sk.AttentionOutput] = []

        def draw(seed: int) -> torch.Tensor:
            result = method.run_reference(q, kv, params, seed=seed, compute_dtype=torch.float64)
            draws.append(result)
            return result.out

        stats = seed_statistics(draw, exact.out, seeds=case["seeds"], first_seed=1)
        norm = float(exact.out.norm())
        rows = [
            _row("rel_l2_vs_dense", _mean([relative_l2(d.out, exact.out) for d in draws])),
            _row("cosine_vs_dense", _mean([cosine(d.out, exact.out) for d in draws])),
            _row("rel_bias", stats.rel_bias),
            _row("max_abs_z", stats.max_abs_z),
            _row("rel_rmse", stats.rel_rmse),
            _row("rel_std", float(stats.std.pow(2).sum().sqrt()) / max(norm, 1e-300)),
        ]
        for metric in ("k_read_fraction", "v_read_fraction", "kv_read_fraction"):
            value = _mean([getattr(d.reads, metric) for d in draws])
            rows.append(_row(metric, value))
        if all(hasattr(d, "index_read_fraction") for d in draws):  # MagicPIG's hash codes
            rows.append(_row("index_read_fraction",
                             _mean([d.index_read_fraction for d in draws])))
        if method.promise is not None:
            rows += _promise_rows(method.promise(params), draws, q, kv, exact.out)
        kl = _attention_kl(exact.weights, [d.weights for d in draws], params)
        rows.append(
            _row("attention_kl", kl)
            if kl is not None
            else _row(
                "attention_kl",
                math.nan,
                status="skipped",
                reason="the method samples values: it estimates no attention distribution",
            )
        )
        return rows


PROMISE_SLACK_SE = 3.0  # standard errors of the violation rate allowed above delta


def _exact_lse(q: torch.Tensor, kv: sk.KVCache) -> torch.Tensor:
    """``[B, Hq]``: the log of the exact softmax denominator (float64, default scale)."""
    from santa_kernels.scores import exact_scores

    keys, _, valid = kv.padded(torch.float64)
    group = q.shape[1] // kv.num_kv_heads
    scores, _ = exact_scores(q.double(), keys, valid, kv.head_dim**-0.5, group)
    return torch.logsumexp(scores, dim=-1)


def promise_errors(promise: Promise, draws: list[sk.AttentionOutput], q: torch.Tensor,
                   kv: sk.KVCache, exact_out: torch.Tensor) -> torch.Tensor:
    """``[draws, B, Hq]``: each draw's relative error of the promised quantity."""
    if promise.quantity == "denominator":
        if any(d.lse is None for d in draws):
            raise ValueError("a denominator promise needs the reference's lse")
        lse = _exact_lse(q, kv)
        return torch.stack([(d.lse.double().cpu() - lse.cpu()).exp().sub(1).abs()
                            for d in draws])
    norm = exact_out.double().norm(dim=-1).clamp_min(1e-300)
    return torch.stack([(d.out.double() - exact_out.double()).norm(dim=-1) / norm
                        for d in draws]).cpu()


def _promise_rows(promise: Promise, draws: list[sk.AttentionOutput], q: torch.Tensor,
                  kv: sk.KVCache, exact_out: torch.Tensor) -> list[dict[str, Any]]:
    """``promise_violation_rate``: the share of (draw, sequence, head) whose error of the
    promised quantity exceeds epsilon; ``promise_held``: 1 when that share is at most
    delta plus :data:`PROMISE_SLACK_SE` binomial standard errors."""
    errors = promise_errors(promise, draws, q, kv, exact_out)
    trials = errors.numel()
    rate = float((errors > promise.epsilon).double().mean())
    allowed = promise.delta + PROMISE_SLACK_SE * math.sqrt(
        promise.delta * (1 - promise.delta) / trials)
    what = (f"{promise.quantity} relative error > {promise.epsilon:g} in {rate:.3f} of "
            f"{trials} draws x heads (promised at most {promise.delta:g}, allowed "
            f"{allowed:.3f})")
    # a broken promise is a measurement, not a failed case (a resumed run keeps it)
    return [_row("promise_violation_rate", rate, reason=what),
            _row("promise_held", float(rate <= allowed), reason=what)]


def _attention_kl(
    exact: torch.Tensor, estimates: list[torch.Tensor], params: dict[str, Any]
) -> float | None:
    """Mean KL(p || p_hat) over seeds and heads, for dense-value Bernoulli scores only."""
    if params.get("value_stage") != "dense" or "draws" not in params:
        return None
    p = exact.double().clamp_min(1e-300)
    kls = [
        float((p * (p.log() - w.double().clamp_min(1e-300).log())).sum(-1).mean())
        for w in estimates
    ]
    return _mean(kls)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _row(metric: str, value: float, status: str = "ok", reason: str = "") -> dict[str, Any]:
    return {
        "metric": metric,
        "value": float(value),
        "unit": "ratio" if "kl" not in metric else "nats",
        "status": status,
        "reason": reason,
    }


def case_command(case: dict[str, Any], registry: Registry = REGISTRY) -> str:
    """Returns the ``santa-bench accuracy fidelity`` command line that runs exactly ``case``."""
    import shlex

    method = registry.get(case["method"])
    names = [p.name for p in method.params]
    params = [f"{k}={case[k]}" for k in names if k != "S" and case.get(k) is not None]
    spec = method.name + (":" + ",".join(params) if params else "")
    args = [
        "santa-bench",
        "accuracy",
        "fidelity",
        "--patterns",
        case["pattern"],
        "--methods",
        spec,
        "--ctx",
        str(case["ctx"]),
        "--batch",
        str(case["batch"]),
    ]
    if "S" in names and case.get("S") is not None:
        args += ["--S", str(case["S"])]
    args += [
        "--heads",
        str(case["heads"]),
        "--kv-heads",
        str(case["kv_heads"]),
        "--head-dim",
        str(case["head_dim"]),
        "--seeds",
        str(case["seeds"]),
        "--seed",
        str(case["seed"]),
    ]
    if case.get("_inputs"):
        args += ["--inputs", case["_inputs"]]
    return shlex.join(args)
