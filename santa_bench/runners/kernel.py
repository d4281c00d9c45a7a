"""The kernel runner: one decode step of attention per case, timed and checked.

A case is a flat dict (method, its parameters, shape, dtype, layout, seed, device).
Its inputs are Gaussian noise, or a model's real q, K and V from a capture file
(``inputs``: ``gaussian`` or ``captured:<model>:L<layers>``, see santa_bench.captured).
Each case yields tidy rows: latency, error against dense (relative L2, cosine), read
fractions and the byte model. On a CPU the exact PyTorch references are timed with
the wall clock (``timing=cpu-wall``); GPU timing plugs in through ``time_case``.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import shlex
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

import santa_kernels as sk
from santa_bench.captured import GAUSSIAN, SHAPE_OPTIONS, capture_shape, describe_capture
from santa_bench.gpu_state import gpu_state_columns
from santa_bench.inputs import DecodeShape, make_decode_inputs, parse_dtype
from santa_bench.kernel_keys import GROUP_KEYS, SHAPE_KEYS
from santa_bench.methods import REGISTRY, Method, Registry
from santa_bench.roofline import floor_rows
from santa_bench.roofline import metric_row as _row
from santa_bench.runners import MAX_CASES
from santa_bench.runners.schema import KERNEL
from santa_bench.units import format_size
from santa_kernels.reads import ReadCounts

DEFAULT_SHAPE = {"heads": 32, "kv_heads": 8, "head_dim": 128}  # Llama-3.1-8B


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
    dtype: str = KERNEL.default("dtype")
    layout: str = KERNEL.default("layout")
    page_size: int = KERNEL.default("page_size")
    seed: int = KERNEL.default("seed")
    device: str = "cpu"  # resolved (schema: auto)
    graph: bool = KERNEL.default("graph")
    cold_l2: bool = KERNEL.default("cold")
    inputs: str | None = None  # a `santa-bench capture` file; None: Gaussian inputs


def attention_shape(
    inputs: str | None, given: dict[str, int | None], option: Callable[[str], str] = str
) -> dict[str, int]:
    """Returns ``heads``, ``kv_heads``, ``head_dim``: the capture file's (a value in
    ``given`` that contradicts it raises ValueError), else ``given`` over the defaults."""
    if inputs:
        return capture_shape(describe_capture(inputs, digest=False), given, option)
    return {k: given.get(k) if given.get(k) is not None else DEFAULT_SHAPE[k]
            for k in SHAPE_OPTIONS}


def inputs_of(case: dict[str, Any]) -> str:
    """Returns a case's (or row's) ``inputs``: ``gaussian`` where the key is absent."""
    value = case.get("inputs")
    return value if isinstance(value, str) and value else GAUSSIAN


def check_grid(grid: KernelGrid, option: Callable[[str], str] = str) -> None:
    """Raises ValueError for a grid the runner cannot build; ``option`` spells each key
    as the caller's user wrote it (``--kv-heads`` on the command line, ``kv_heads`` in
    a suite)."""
    for name in ("heads", "kv_heads", "head_dim", "page_size", "batch", "ctx", "S"):
        value = getattr(grid, name)
        values = value if isinstance(value, list) else [value]
        if not values or min(values) <= 0:
            every = "every value " if isinstance(value, list) else ""
            raise ValueError(f"{option(name)}: {every}must be > 0")
    if grid.head_dim < 16 or grid.head_dim % 8:
        raise ValueError(
            f"{option('head_dim')}: must be a multiple of 8 and at least 16 (as a model's "
            f"head dim: 64, 80, 128, ...), got {grid.head_dim}"
        )
    if grid.heads % grid.kv_heads:
        raise ValueError(
            f"{option('heads')} {grid.heads} is not a multiple of "
            f"{option('kv_heads')} {grid.kv_heads}"
        )
    if grid.layout not in ("contiguous", "paged"):
        raise ValueError(f"{option('layout')}: expected contiguous or paged, got {grid.layout!r}")
    if grid.dtype not in ("bf16", "fp16", "fp32"):
        raise ValueError(f"{option('dtype')}: expected bf16, fp16 or fp32, got {grid.dtype!r}")
    if grid.inputs:
        attention_shape(grid.inputs, {k: getattr(grid, k) for k in SHAPE_OPTIONS}, option)


def timing_mode(grid: KernelGrid) -> tuple[str, str]:
    """Returns the case's ``(timing, l2)`` labels: what the device timing will do."""
    if grid.device == "cpu":
        return "cpu-wall", "n/a"
    return ("graph" if grid.graph else "events"), ("cold" if grid.cold_l2 else "warm")


def case_count(grid: KernelGrid) -> int:
    """The number of (ctx, batch, method, budget) combinations :func:`expand_cases` visits."""
    per_shape = sum(
        len(grid.S) if "S" in {p.name for p in method.params} and "S" not in overrides else 1
        for method, overrides in grid.methods
    )
    return len(grid.ctx) * len(grid.batch) * per_shape


def expand_cases(
    grid: KernelGrid, dropped: list[dict[str, Any]] | None = None, max_cases: int = MAX_CASES
) -> list[dict[str, Any]]:
    """Returns one case per (ctx, batch, method, budget); methods without S ignore ``S``.

    A grid of more than ``max_cases`` combinations raises ValueError before any is built.

    Cases whose budget exceeds the context are dropped (they would be dense in disguise);
    ``dropped``, when given, receives ``{"method", "S", "ctx", "batch"}`` of each. Cases on
    a capture file carry its keys (``inputs``, ``inputs_digest``, ``inputs_tiled``); cases
    on Gaussian inputs carry none, so their hashes are those of runs before captured inputs.
    """
    if (count := case_count(grid)) > max_cases:
        shapes = len(grid.ctx) * len(grid.batch)
        raise ValueError(
            f"{count:,} cases ({len(grid.ctx)} contexts x {len(grid.batch)} batch sizes x "
            f"{count // shapes} methods and budgets) exceed the limit of {max_cases:,}; "
            "give fewer --ctx, --batch, --S or --methods values"
        )
    cases = []
    timing, l2 = timing_mode(grid)
    capture = describe_capture(grid.inputs) if grid.inputs else None
    # vendor baselines first: later cases report their speedup against the best of them
    ordered = sorted(grid.methods, key=lambda m: m[0].kernel_kind != "baseline")
    for ctx, batch in itertools.product(grid.ctx, grid.batch):
        for method, overrides in ordered:
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
                    if dropped is not None:
                        dropped.append(
                            {"method": method.name, "S": resolved["S"], "ctx": ctx, "batch": batch}
                        )
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
                    # the cache's page size; on a contiguous cache, a paging baseline's own
                    "page_size": (
                        grid.page_size if grid.layout == "paged" else resolved.get("page_size", 0)
                    ),
                    "seed": grid.seed,
                    "device": grid.device,
                    "timing": timing,
                    "l2": l2,
                    **(capture.case_keys(ctx) if capture is not None else {}),
                }
                cases.append(case)
    return cases


def describe_dropped(dropped: list[dict[str, Any]]) -> str:
    """One line naming the cases :func:`expand_cases` dropped (S larger than the context)."""
    methods = ", ".join(dict.fromkeys(str(d["method"]) for d in dropped))
    pairs = ", ".join(
        dict.fromkeys(f"S={d['S']} > ctx={format_size(int(d['ctx']))}" for d in dropped)
    )
    return (
        f"{len(dropped)} case(s) dropped: the sample budget exceeds the context ({pairs}; "
        f"{methods}); lower --S or raise --ctx to run them"
    )


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


WORKSPACES = ("shared", "per-copy")


def shares_workspace(prepared: Any, workspace: str = "per-copy") -> bool:
    """Whether the timing copies of ``prepared`` share its workspace (``rebind``)."""
    return workspace == "shared" and getattr(prepared, "rebind", None) is not None


def call_bytes(
    method: Method, reads: ReadCounts, q: torch.Tensor, params: dict[str, Any],
    tables: float = 0.0,
) -> tuple[int, int]:
    """Returns ``(inputs, workspace)``: the bytes one call touches by the method's byte
    model. ``inputs``: the K/V bytes read, ``tables`` (bytes read besides the cache, e.g.
    SANTA++'s representatives), q read and the output written; ``workspace``: the rest
    of :meth:`Method.bytes_read` (the logit stash, written and read back)."""
    element = q.element_size()
    kv_bytes = reads.kv_bytes(element)
    workspace = method.bytes_read(reads, element, q.shape[1], params) - kv_bytes
    return int(kv_bytes + tables + 2 * q.numel() * element), int(workspace)


def input_copier(
    method: Method,
    prepared: Any,
    q: torch.Tensor,
    kv: sk.KVCache,
    seed: int,
    params: dict[str, Any],
    workspace: str = "per-copy",
) -> Callable[[int], Any]:
    """Returns ``make_copy(i)`` for :func:`santa_bench.timing.measure`: the call over its
    own clone of q and the cache. ``shared``: through ``prepared.rebind`` (one workspace
    and random state serve every copy, as the layers of a decode step share them);
    ``per-copy``, or a method without ``rebind``: prepared anew with seed ``seed + i``."""
    from santa_bench.baselines import clone_kv

    if workspace not in WORKSPACES:
        raise ValueError(f"workspace: expected one of {WORKSPACES}, got {workspace!r}")
    rebind = getattr(prepared, "rebind", None) if workspace == "shared" else None

    def make_copy(index: int):
        q_copy, kv_copy = q.clone(), clone_kv(kv)
        if rebind is not None:
            return rebind(q_copy, kv_copy)
        return method.prepare(q_copy, kv_copy, seed=seed + index, **params)

    return make_copy


def time_prepared(
    method: Method,
    prepared: Any,
    q: torch.Tensor,
    kv: sk.KVCache,
    seed: int,
    params: dict[str, Any],
    *,
    graph: bool,
    cold_l2: bool,
    budget_ms: float,
    reads: ReadCounts | None = None,
    workspace: str = "per-copy",
    copies: int | None = None,
    calls_per_replay: int | None = None,
) -> Any:
    """Times a prepared method as the kernel harness does: :func:`santa_bench.timing.measure`
    over input copies (on a GPU only; see :func:`input_copier`), as many as the bytes one
    call touches by the method's byte model (:func:`call_bytes` of ``reads``; None: one
    more call's) need for a cold L2. Each copy has its own workspace (``per-copy``, the
    default), rotated with the inputs; ``shared`` (diagnostics) lets the copies share
    one, as a decode step's layers do, which a kernel may keep in L2 from call to call,
    and counts only the inputs' bytes. ``copies`` and ``calls_per_replay`` override the
    plan (diagnostics)."""
    from santa_bench.timing import measure, nbytes_of

    if reads is None:
        reads = prepared.reads() if hasattr(prepared, "reads") else _dense_reads(kv)
    tables = getattr(prepared, "metrics", {}).get("bytes_read_tables", (0.0, "B"))[0]
    inputs, workspace_bytes = call_bytes(method, reads, q, params, tables)
    shared = shares_workspace(prepared, workspace)
    on_gpu = q.device.type == "cuda"
    own_workspace = 0 if shared else workspace_bytes
    return measure(
        prepared,
        touched_bytes=inputs + own_workspace,
        workspace_bytes=own_workspace,
        # a copy's memory, at most: the clones, what a prepare converts them to, its stash
        copy_bytes=nbytes_of(q, kv) + int(getattr(prepared, "inputs_bytes", 0)) + own_workspace,
        l2_bytes=None,
        make_copy=input_copier(method, prepared, q, kv, seed, params, workspace)
        if on_gpu else None,
        graph=graph,
        cold_l2=cold_l2,
        copies=copies if on_gpu else None,
        calls_per_replay=calls_per_replay,
        budget_ms=budget_ms,
        device=q.device,
    )


def launch_record(notes: dict[str, Any]) -> str:
    """A prepared call's notes as JSON for its latency row (``launch``): what it launched
    (a kernel plan field by field, a dense dispatch, conversions done outside the timed
    region), so a row says which plan it timed after the planner changes."""

    def fields_or_text(value: Any) -> Any:
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
        return str(value)

    return json.dumps(notes, sort_keys=True, default=fields_or_text)




def group_key(case: dict[str, Any]) -> tuple:
    """Returns the group of a case (or stored row) whose vendor baselines its speedup is
    taken against: the same :data:`GROUP_KEYS` and the same inputs (the same capture)."""
    digest = case.get("inputs_digest")
    return (*(case.get(k) for k in GROUP_KEYS), inputs_of(case),
            digest if isinstance(digest, str) else "")

BASELINE_TOLERANCE = {"bf16": 1e-2, "fp16": 5e-3, "fp32": 1e-4}  # rel. L2 vs fp32 dense


class KernelRunner:
    """Runs kernel cases; keeps the last inputs and dense output to share across methods.

    On a GPU, methods with a fast path (Triton kernel or dense baseline) are timed with
    :func:`santa_bench.timing.measure`; cases report ``speedup_vs_best_dense`` against
    the fastest vendor baseline of the same shape and timing mode seen in this run.
    """

    def __init__(
        self,
        registry: Registry = REGISTRY,
        cpu_budget_s: float = 1.0,
        gpu_budget_ms: float = 300.0,
        copy_bandwidth_gbps: float | None = None,
    ) -> None:
        self.registry = registry
        self.cpu_budget_s = cpu_budget_s
        self.gpu_budget_ms = gpu_budget_ms
        self.copy_bandwidth_gbps = copy_bandwidth_gbps
        self.best_dense: dict[tuple, tuple[str, list[float]]] = {}
        self.dense_bandwidth: dict[tuple, float | None] = {}
        self._inputs_key: tuple | None = None
        self._inputs: tuple[torch.Tensor, sk.KVCache, torch.Tensor] | None = None

    def inputs(self, case: dict[str, Any]) -> tuple[torch.Tensor, sk.KVCache, torch.Tensor]:
        """Returns ``(q, kv, dense_out)`` for the case's shape and inputs (Gaussian, or the
        capture file the case names), reusing the last ones."""
        key = (
            *(case[k] for k in (*SHAPE_KEYS, "dtype", "layout", "page_size", "seed", "device")),
            inputs_of(case),
            case.get("inputs_digest"),
        )
        if key != self._inputs_key:
            self._inputs = None  # free the previous cache first
            shape = DecodeShape(**{k: case[k] for k in SHAPE_KEYS})
            made = dict(
                dtype=parse_dtype(case["dtype"]),
                layout=case["layout"],
                page_size=case["page_size"] or 16,
                seed=case["seed"],
                device=case["device"],
            )
            if inputs_of(case) == GAUSSIAN:
                q, kv = make_decode_inputs(shape, **made)
            else:
                q, kv = _captured_inputs(case, shape, made)
            dense = sk.dense_attention(q, kv).out
            self._inputs, self._inputs_key = (q, kv, dense), key
        assert self._inputs is not None
        return self._inputs

    def remember_baseline(
        self, case: dict[str, Any], samples_us: list[float], bandwidth_gbps: float | None = None
    ) -> None:
        """Records a vendor baseline's samples (and achieved bandwidth: the byte floor of
        the group's other calls) if it is the fastest of its group so far."""
        key = group_key(case)
        best = self.best_dense.get(key)
        if best is None or _median(samples_us) < _median(best[1]):
            self.best_dense[key] = (case["method"], list(samples_us))
            self.dense_bandwidth[key] = bandwidth_gbps

    def recall_baselines(self, frame, fingerprint: str) -> None:
        """Loads finished vendor-baseline samples from the store (for resumed runs)."""
        needed = {"metric", "status", "samples_us", "method", "env_fingerprint", *GROUP_KEYS}
        if frame.empty or not needed <= set(frame.columns):
            return
        rows = frame[
            (frame.metric == "latency")
            & (frame.status == "ok")
            & (frame.env_fingerprint == fingerprint)
            & frame.samples_us.notna()
        ]
        bandwidth = {
            h: v for h, v in frame.loc[(frame.metric == "bandwidth") & (frame.status == "ok"),
                                       ["case_hash", "value"]].itertuples(index=False)
        } if "case_hash" in frame.columns else {}
        for record in rows.to_dict("records"):
            method = (
                self.registry.get(record["method"])
                if record["method"] in self.registry.names()
                else None
            )
            if method is not None and method.kernel_kind == "baseline":
                self.remember_baseline(record, json.loads(record["samples_us"]),
                                       bandwidth.get(record.get("case_hash")))

    def run(self, case: dict[str, Any]) -> list[dict[str, Any]]:
        """Returns the case's rows (``skipped`` with a reason when the method can't run);
        every row names the case's ``inputs``."""
        return [{**row, "inputs": inputs_of(case)} for row in self._run(case)]

    def _run(self, case: dict[str, Any]) -> list[dict[str, Any]]:
        method = self.registry.get(case["method"])
        ok, reason = method.available()
        if not ok:
            return [_row("latency", math.nan, "us", status="skipped", reason=reason)]
        q, kv, dense = self.inputs(case)
        params = method_params(case, method)
        if case["device"] == "cpu" and method.kernel_kind != "baseline":
            return self._run_reference_on_cpu(case, method, q, kv, dense, params)
        kernel_ok, kernel_reason = method.kernel_available()
        if not kernel_ok:
            result = method.run_reference(q, kv, params, seed=case["seed"])
            rows = _quality_rows(result.out, dense, result.reads, method, q, params)
            return [_row("latency", math.nan, "us", status="skipped", reason=kernel_reason), *rows]
        return self._run_fast_path(case, method, q, kv, dense, params)

    def _run_reference_on_cpu(self, case, method, q, kv, dense, params) -> list[dict[str, Any]]:
        result = method.run_reference(q, kv, params, seed=case["seed"])
        samples = cpu_wall_time(
            lambda: method.run_reference(q, kv, params, seed=case["seed"]),
            budget_s=self.cpu_budget_s,
        )
        rows = [_row("latency", _median(samples), "us", samples=len(samples))]
        return rows + _quality_rows(result.out, dense, result.reads, method, q, params)

    def _run_fast_path(self, case, method, q, kv, dense, params) -> list[dict[str, Any]]:
        from santa_bench.baselines import Unsupported

        seed = case["seed"]
        try:
            prepared = method.prepare(q, kv, seed=seed, **params)
        except Unsupported as exc:
            return [_row("latency", math.nan, "us", status="skipped", reason=str(exc))]
        out = prepared().clone()
        second = prepared().clone()
        reads = prepared.reads() if hasattr(prepared, "reads") else _dense_reads(kv)
        quality = [
            *_quality_rows(out, dense, reads, method, q, params),
            # method-specific metrics the adapter measured (e.g. santapp: index_build_ms)
            *(_row(k, v, unit) for k, (v, unit) in getattr(prepared, "metrics", {}).items()),
        ]
        timing = time_prepared(
            method, prepared, q, kv, seed, params,
            graph=case["timing"] == "graph",
            cold_l2=case["l2"] == "cold",
            budget_ms=self.gpu_budget_ms if case["device"] == "cuda" else self.cpu_budget_s * 1e3,
            reads=reads,
        )
        samples = [round(s, 3) for s in timing.samples_us]
        plan = (  # how the device timing rotated inputs, and the GPU's state after it
            {
                "copies": timing.n_copies,
                "calls_per_replay": timing.calls_per_sample,
                "touched_bytes": timing.touched_bytes,
                "rotated_bytes": timing.rotated_bytes,
                "workspace_bytes": timing.workspace_bytes,
                "workspace": "per-copy",
                **gpu_state_columns(q.device),
            }
            if timing.mode != "cpu-wall" else {}
        )
        rows = [
            _row(
                "latency",
                timing.median_us,
                "us",
                samples=timing.n,
                q1_us=timing.q1_us,
                q3_us=timing.q3_us,
                l2_state=timing.l2_state,
                samples_us=json.dumps(samples),
                timing_mode=timing.mode,
                launch=launch_record(getattr(prepared, "notes", {})),
                **plan,
            ),
            *quality,
        ]
        moved = moved_bytes(rows, q)
        bandwidth = moved / (timing.median_us * 1e-6) / 1e9
        rows.append(_row("bandwidth", bandwidth, "GB/s"))
        if self.copy_bandwidth_gbps:
            rows.append(
                _row("bandwidth_fraction_of_copy", bandwidth / self.copy_bandwidth_gbps, "ratio")
            )
        if method.family == "baseline":
            tolerance = BASELINE_TOLERANCE[case["dtype"]]
            error = relative_l2(out, dense)
            if error > tolerance:
                rows.append(
                    _row(
                        "accuracy_check",
                        0.0,
                        "bool",
                        status="failed",
                        reason=f"rel. L2 {error:.2e} > {tolerance:.0e} vs fp32 dense",
                    )
                )
            else:
                rows.append(_row("accuracy_check", 1.0, "bool"))
        elif not method.deterministic:  # a sampler draws fresh numbers every call and replay
            rows.append(_row("fresh_samples", float(not torch.equal(out, second)), "bool"))
        if method.kernel_kind == "baseline":
            self.remember_baseline(case, timing.samples_us, bandwidth)
        else:
            rows += self._speedup_rows(case, timing.samples_us)
        if case["device"] != "cpu" and method.kernel_kind != "baseline":
            rows += self._floor_rows(case, moved, timing.median_us)
        function = getattr(prepared, "kernel_function", None)
        if function:  # the Triton function that ran (a SANTA method's adapter names it)
            rows = [{**row, "kernel_function": function} for row in rows]
        return rows

    def _floor_rows(self, case: dict[str, Any], moved: float, median_us: float) -> list[dict]:
        """``floor_us`` / ``floor_ratio``: the call's bytes at the achieved bandwidth of the
        fastest vendor baseline of its group so far (santa_bench.roofline)."""
        key = group_key(case)
        best = self.best_dense.get(key)
        return floor_rows(moved, median_us, self.dense_bandwidth.get(key),
                          best[0] if best else "")

    def _speedup_rows(self, case: dict[str, Any], samples_us: list[float]) -> list[dict]:
        from santa_bench.timing import bootstrap_ratio_ci

        best = self.best_dense.get(group_key(case))
        if best is None:
            return [
                _row(
                    "speedup_vs_best_dense",
                    math.nan,
                    "x",
                    status="skipped",
                    reason="no vendor dense baseline timed in this group",
                )
            ]
        name, baseline = best
        ratio, low, high = bootstrap_ratio_ci(baseline, samples_us)
        return [
            _row("speedup_vs_best_dense", ratio, "x", ci_low=low, ci_high=high, best_dense=name)
        ]


def _captured_inputs(
    case: dict[str, Any], shape: DecodeShape, made: dict[str, Any]
) -> tuple[torch.Tensor, sk.KVCache]:
    """The decode inputs of a case on a capture file (checked to be the file it names)."""
    from santa_bench.captured import make_captured_inputs

    path = case.get("_inputs")
    if not path:
        raise ValueError(f"inputs {case['inputs']}: the case names no capture file")
    if describe_capture(path).digest != case.get("inputs_digest"):
        raise ValueError(f"{path}: not the capture this case names ({case['inputs']})")
    return make_captured_inputs(path, batch=shape.batch, ctx=shape.ctx, **made)


def rows_bytes(rows: list[dict[str, Any]]) -> float:
    """Returns the ``bytes_read`` value among ``rows``."""
    return next(r["value"] for r in rows if r["metric"] == "bytes_read")


def moved_bytes(rows: list[dict[str, Any]], q: torch.Tensor) -> float:
    """HBM bytes of one call for its bandwidth: the K/V bytes read (``bytes_read``), the
    tables a method reads besides the cache (``bytes_read_tables``, e.g. SANTA++'s
    representatives; 0 when absent), q read and the output written."""
    tables = sum(r["value"] for r in rows if r["metric"] == "bytes_read_tables")
    return rows_bytes(rows) + tables + 2 * q.numel() * q.element_size()


def _dense_reads(kv: sk.KVCache) -> ReadCounts:
    lengths = kv.lengths.long().cpu()
    rows = lengths[:, None].expand(-1, kv.num_kv_heads).contiguous()
    return ReadCounts(
        k_rows=rows,
        k_features=rows * kv.head_dim,
        v_rows=rows.clone(),
        context=lengths,
        head_dim=kv.head_dim,
    )


def _quality_rows(
    out, dense, reads: ReadCounts, method: Method, q, params: dict[str, Any]
) -> list[dict[str, Any]]:
    rows = [
        _row("rel_l2_vs_dense", relative_l2(out, dense), "ratio"),
        _row("cosine_vs_dense", cosine(out, dense), "ratio"),
        _row("bytes_read", method.bytes_read(reads, q.element_size(), q.shape[1], params), "B"),
    ]
    return rows + [_row(k, v, "ratio") for k, v in reads.as_metrics().items()]




def case_command(case: dict[str, Any], registry: Registry = REGISTRY) -> str:
    """Returns the ``santa-bench kernel`` command line that runs exactly ``case``.

    Every parameter is spelt out (method parameters included, defaults too), with
    ``--baselines none`` so that only this one case is run; running it yields a case
    with the same config hash.
    """
    method = registry.get(case["method"])
    names = [p.name for p in method.params]
    params = [f"{k}={case[k]}" for k in names if k != "S" and case.get(k) is not None]
    spec = method.name + (":" + ",".join(params) if params else "")
    args = ["santa-bench", "kernel", "--ctx", format_size(int(case["ctx"]))]
    args += ["--batch", str(case["batch"])]
    if "S" in names and case.get("S") is not None:
        args += ["--S", str(case["S"])]
    args += ["--methods", spec, "--baselines", "none"]
    args += ["--heads", str(case["heads"]), "--kv-heads", str(case["kv_heads"])]
    args += ["--head-dim", str(case["head_dim"]), "--dtype", str(case["dtype"])]
    args += ["--layout", str(case["layout"])]
    if case["layout"] == "paged":
        args += ["--page-size", str(case["page_size"])]
    args += ["--seed", str(case["seed"]), "--device", str(case["device"])]
    if case.get("_inputs"):
        args += ["--inputs", str(case["_inputs"])]
    if case["device"] != "cpu":
        args.append("--graph" if case["timing"] == "graph" else "--no-graph")
        args.append("--cold" if case["l2"] == "cold" else "--warm")
    return shlex.join(args)
