"""The timing core: one entry point, ``measure``, returning raw samples.

How each mode times a no-argument callable ``fn`` (setup never inside it):

=========  ===========================================================================
mode       what one sample is
=========  ===========================================================================
graph      CUDA events around one replay of a CUDA graph that holds ``calls_per_sample``
           calls (the input copies in rotation, repeated to at least
           ``MIN_CALLS_PER_GRAPH``), divided by that count. This is how FlashInfer's
           ``bench_gpu_time_with_cudagraph`` works: launch gaps shrink as in a serving
           engine that replays graphs, and samples are per-call averages over one replay.
events     CUDA events around one eager call (copy ``i % n_copies`` on repeat ``i``),
           each preceded by a ~50 us device-side sleep so the host enqueues the call
           while the device is busy: the events time device work, not the host's
           launch rate (what ``triton.testing.do_bench`` achieves with its L2 flush).
cpu-wall   ``time.perf_counter`` around one call on the CPU (``l2_state = "n/a"``).
=========  ===========================================================================

Cold L2 (GPU): the caller passes ``make_copy(i)``, a no-argument callable bound to its
own copy ``i`` of the inputs (``i >= 1``; copy 0 is ``fn`` itself), and
``touched_bytes``, the bytes one call touches by the method's byte model (K/V rows read,
tables, q, the output, the copy's workspace traffic). ``cold_l2_plan`` picks
``k = ceil(4 * L2 / touched_bytes)`` copies (1..256) and labels the run ``cold`` only
when the bytes rotated through (``k * touched_bytes``) reach 3x the L2 size; a call that
alone touches 3x L2 (and 2x L2 of workspace, if it has one) needs one copy and is cold.
Too few copies (no ``make_copy``, memory, the cap) give ``warm``: a warm run is never
labelled cold. ``l2_state`` records what was measured, not what was asked:
``cold_l2=False`` on such a call still reads ``cold``. The copies' memory is
``copy_bytes`` each (what one copy allocates: q and the whole cache, which a sampled call
reads in part, and its workspace).

A copy's workspace (``workspace_bytes``: its traffic by the byte model, e.g. SANTA's
logit stash written and read back, twice the stash's size) counts apart: a kernel may ask
L2 to keep it (SANTA's stash stores carry ``evict_last`` up to 12 MiB), and then it
outlives any stream of other bytes, so the next call on that copy finds it in L2. The
plan also takes ``ceil(4 * L2 / workspace_bytes)`` copies, and the run is ``cold`` only
if the workspaces' bytes rotated reach 2x L2 too (their footprint past the L2 size).
Why: ``results/h100/timing-2026-12-06-h100`` (santa-prop S=128 at 32k B=1 is 5% faster
over 1-3 copies with their own stashes than over 16 or more, or than a loop of calls
each prepared anew).

Sampled kernels under graph replay: a graph replays the same launch arguments, so a
kernel that draws random numbers must read its seed/offset from device memory and
advance it on the device (e.g. an ``int64`` counter it increments), or every replay
reuses one draw. The kernel runner checks that two replays' outputs differ.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from santa_bench.devices import resolve_device

MAX_COPIES = 256
COLD_FACTOR = 3  # bytes rotated through >= 3x L2 counts as cold
# workspaces' traffic rotated >= 2x L2 counts as cold: their footprint (half the traffic of
# a stash written and read back) past the L2 size, which a cyclic set cannot stay in
WORKSPACE_COLD_FACTOR = 2
TARGET_FACTOR = 4  # aim for 4x L2 when choosing the number of copies
MIN_CALLS_PER_GRAPH = 10
BACKLOG_CYCLES = 100_000  # ~50 us of device sleep queued before each eager timed call
COPY_MEMORY_FRACTION = 0.5  # share of free device memory the copies may take


@dataclass(frozen=True)
class Timing:
    """Samples of one timed callable (microseconds) and how they were taken."""

    samples_us: list[float]
    median_us: float
    q1_us: float
    q3_us: float
    iqr_us: float
    n: int
    mode: str  # "graph" | "events" | "cpu-wall"
    l2_state: str  # "cold" | "warm" | "n/a"
    n_copies: int = 1
    calls_per_sample: int = 1  # graph mode: calls per replay
    touched_bytes: int = 0  # bytes one call touches that the copies rotate
    rotated_bytes: int = 0  # n_copies * touched_bytes: what passes L2 between two uses
    workspace_bytes: int = 0  # of touched_bytes, the traffic of the copy's own workspace

    @classmethod
    def from_samples(
        cls,
        samples_us: Iterable[float],
        *,
        mode: str,
        l2_state: str,
        n_copies: int = 1,
        calls_per_sample: int = 1,
        touched_bytes: int = 0,
        workspace_bytes: int = 0,
    ) -> Timing:
        """Returns a Timing with median and quartiles (inclusive method) of ``samples_us``."""
        samples = [float(s) for s in samples_us]
        if not samples:
            raise ValueError("samples_us: need at least one sample")
        median = statistics.median(samples)
        if len(samples) >= 2:
            q1, _, q3 = statistics.quantiles(samples, n=4, method="inclusive")
        else:
            q1 = q3 = samples[0]
        return cls(
            samples_us=samples,
            median_us=median,
            q1_us=q1,
            q3_us=q3,
            iqr_us=q3 - q1,
            n=len(samples),
            mode=mode,
            l2_state=l2_state,
            n_copies=n_copies,
            calls_per_sample=calls_per_sample,
            touched_bytes=touched_bytes,
            rotated_bytes=n_copies * touched_bytes,
            workspace_bytes=workspace_bytes,
        )


# ----------------------------------------------------------------- cold L2
def cold_l2_plan(
    touched_bytes: int,
    l2_bytes: int | None,
    *,
    cold_l2: bool = True,
    can_copy: bool = True,
    max_copies: int = MAX_COPIES,
    copies: int | None = None,
    workspace_bytes: int = 0,
) -> tuple[int, str]:
    """Returns ``(n_copies, l2_state)`` for calls touching ``touched_bytes`` bytes each,
    ``workspace_bytes`` of them the traffic of the copy's own workspace.

    ``cold`` needs the bytes rotated through (``n_copies * touched_bytes``) to reach 3x
    L2, and the workspaces' among them 2x L2 (see the module docstring);
    an unknown L2 size can never be certified cold. ``copies`` forces the count
    (diagnostics), still labelled by what it rotates.
    """
    if touched_bytes <= 0:
        raise ValueError(f"touched_bytes: must be > 0, got {touched_bytes}")
    if not 0 <= workspace_bytes <= touched_bytes:
        raise ValueError(f"workspace_bytes: must be in [0, touched_bytes], got {workspace_bytes}")
    if copies is not None and copies < 1:
        raise ValueError(f"copies: must be >= 1, got {copies}")
    if copies is not None and copies > 1 and not can_copy:
        raise ValueError("copies: more than one needs make_copy")
    if l2_bytes is None or l2_bytes <= 0:
        return copies or 1, "warm"

    def state(n: int) -> str:
        cold = n * touched_bytes >= COLD_FACTOR * l2_bytes and (
            workspace_bytes == 0 or n * workspace_bytes >= WORKSPACE_COLD_FACTOR * l2_bytes)
        return "cold" if cold else "warm"

    if copies is not None:
        return copies, state(copies)
    wanted = math.ceil(TARGET_FACTOR * l2_bytes / touched_bytes)
    if workspace_bytes:
        wanted = max(wanted, math.ceil(TARGET_FACTOR * l2_bytes / workspace_bytes))
    if state(1) == "cold":  # one call alone passes the L2 enough
        return 1, "cold"
    if not cold_l2:
        return 1, "warm"
    n = max(1, min(wanted, MAX_COPIES, max_copies if can_copy else 1))
    return n, state(n)


def l2_cache_bytes(device: torch.device | str) -> int | None:
    """Returns the device's L2 size in bytes (None on CPU or when torch can't tell)."""
    dev = torch.device(device)
    if dev.type != "cuda":
        return None
    props = torch.cuda.get_device_properties(dev)
    size = getattr(props, "L2_cache_size", None)
    return int(size) if size else None


def nbytes_of(*objs: Any) -> int:
    """Returns the bytes of every tensor in ``objs`` (nested lists, dicts, dataclasses)."""
    total = 0
    for obj in objs:
        if isinstance(obj, torch.Tensor):
            total += obj.numel() * obj.element_size()
        elif isinstance(obj, (list, tuple)):
            total += nbytes_of(*obj)
        elif isinstance(obj, dict):
            total += nbytes_of(*obj.values())
        elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            total += nbytes_of(*(getattr(obj, f.name) for f in dataclasses.fields(obj)))
    return total


# ----------------------------------------------------------------- measure
def measure(
    fn: Callable[[], object],
    *,
    touched_bytes: int,
    l2_bytes: int | None,
    make_copy: Callable[[int], Callable[[], object]] | None,
    copy_bytes: int | None = None,
    workspace_bytes: int = 0,
    graph: bool = True,
    cold_l2: bool = True,
    copies: int | None = None,
    calls_per_replay: int | None = None,
    warmup_ms: float = 25.0,
    budget_ms: float = 200.0,
    min_reps: int = 10,
    max_reps: int = 1000,
    device: torch.device | str | None = None,
) -> Timing:
    """Returns timing samples of ``fn`` (see the module docstring for the modes).

    ``device`` picks the clock: CUDA events on a CUDA device, the wall clock on the CPU;
    None means CUDA when available. ``l2_bytes`` None reads the device's L2 size.
    ``copy_bytes`` (default ``touched_bytes``) is the memory one input copy takes;
    ``workspace_bytes`` the part of ``touched_bytes`` that is the copy's own workspace.
    ``copies`` and ``calls_per_replay`` override the plan (diagnostics): the number of
    input copies, and the calls one graph replay holds (default: the copies in turn,
    repeated to at least ``MIN_CALLS_PER_GRAPH``). Repeats run until ``budget_ms``
    (estimated from warm-up), within ``[min_reps, max_reps]``.
    """
    if min_reps < 1 or max_reps < min_reps:
        raise ValueError(f"need 1 <= min_reps <= max_reps, got {min_reps}, {max_reps}")
    if calls_per_replay is not None and calls_per_replay < 1:
        raise ValueError(f"calls_per_replay: must be >= 1, got {calls_per_replay}")
    dev = (
        torch.device(device)
        if device is not None
        else torch.device(resolve_device("auto"))
    )
    with torch.no_grad():
        if dev.type != "cuda":
            samples = _wall_samples(fn, warmup_ms, budget_ms, min_reps, max_reps)
            return Timing.from_samples(samples, mode="cpu-wall", l2_state="n/a")
        if l2_bytes is None:
            l2_bytes = l2_cache_bytes(dev)
        free_bytes, _ = torch.cuda.mem_get_info(dev)
        per_copy = max(copy_bytes if copy_bytes is not None else touched_bytes, 1)
        affordable = 1 + int(COPY_MEMORY_FRACTION * free_bytes) // per_copy
        n_copies, l2_state = cold_l2_plan(
            touched_bytes,
            l2_bytes,
            cold_l2=cold_l2,
            can_copy=make_copy is not None,
            max_copies=affordable,
            copies=copies,
            workspace_bytes=workspace_bytes,
        )
        calls: list[Callable[[], object]] = [fn]
        if make_copy is not None:
            calls += [make_copy(i) for i in range(1, n_copies)]
        with torch.cuda.device(dev):
            if graph:
                samples, per_sample = _graph_samples(
                    calls, warmup_ms, budget_ms, min_reps, max_reps, calls_per_replay
                )
            else:
                samples, per_sample = _eager_samples(
                    calls, warmup_ms, budget_ms, min_reps, max_reps
                )
        return Timing.from_samples(
            samples,
            mode="graph" if graph else "events",
            l2_state=l2_state,
            n_copies=len(calls),
            calls_per_sample=per_sample,
            touched_bytes=touched_bytes,
            workspace_bytes=workspace_bytes,
        )


def _wall_samples(
    fn: Callable[[], object], warmup_ms: float, budget_ms: float, min_reps: int, max_reps: int
) -> list[float]:
    warm_end = time.perf_counter() + warmup_ms / 1e3
    fn()
    while time.perf_counter() < warm_end:
        fn()
    samples: list[float] = []
    started = time.perf_counter()
    while len(samples) < max_reps and (
        len(samples) < min_reps or time.perf_counter() - started < budget_ms / 1e3
    ):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e6)
    return samples


def _warm_on_side_stream(calls: list[Callable[[], object]], passes: int = 3) -> None:
    # Lazy initialisation (handles, JIT, autotuning) must happen before capture, and
    # PyTorch wants warm-up work on a side stream.
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(passes):
            for call in calls:
                call()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()


def _graph_samples(
    calls: list[Callable[[], object]],
    warmup_ms: float,
    budget_ms: float,
    min_reps: int,
    max_reps: int,
    per_graph: int | None = None,
) -> tuple[list[float], int]:
    """Per-call samples of graph replays holding ``per_graph`` calls (``calls`` in turn;
    default: every call, repeated to at least ``MIN_CALLS_PER_GRAPH``)."""
    if per_graph is None:
        per_graph = len(calls) * max(1, math.ceil(MIN_CALLS_PER_GRAPH / len(calls)))
    _warm_on_side_stream(calls)
    cuda_graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(cuda_graph):
        for i in range(per_graph):
            calls[i % len(calls)]()
    torch.cuda.synchronize()
    samples = _event_samples(
        lambda _i: cuda_graph.replay(), per_graph, warmup_ms, budget_ms, min_reps, max_reps
    )
    return samples, per_graph


def graph_call_us(
    calls: list[Callable[[], object]], warmup_ms: float = 20.0, budget_ms: float = 100.0
) -> float:
    """Median microseconds of one of ``calls``: CUDA-graph replays of them in turn (the
    harness's graph timing, for profiling scripts that time stages outside ``measure``)."""
    samples, _ = _graph_samples(calls, warmup_ms, budget_ms, min_reps=10, max_reps=1000)
    return statistics.median(samples)


def _eager_samples(
    calls: list[Callable[[], object]],
    warmup_ms: float,
    budget_ms: float,
    min_reps: int,
    max_reps: int,
) -> tuple[list[float], int]:
    _warm_on_side_stream(calls, passes=1)
    samples = _event_samples(
        lambda i: calls[i % len(calls)](),
        1,
        warmup_ms,
        budget_ms,
        min_reps,
        max_reps,
        backlog=True,
    )
    return samples, 1


def _event_samples(
    step: Callable[[int], object],
    calls_per_step: int,
    warmup_ms: float,
    budget_ms: float,
    min_reps: int,
    max_reps: int,
    backlog: bool = False,
) -> list[float]:
    """Returns per-call microseconds of ``step(i)`` timed with CUDA events.

    ``backlog``: before each timed step, queue a device-side sleep of
    ``BACKLOG_CYCLES`` so the host enqueues the step while the device is still busy;
    the events then time the device's work, not the host's launch rate (as
    ``triton.testing.do_bench`` does with its cache-flush kernel between repeats).
    """
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for i in range(3):
        step(i)
    end.record()
    torch.cuda.synchronize()
    estimate_ms = max(start.elapsed_time(end) / 3, 1e-3)
    for i in range(max(1, math.ceil(warmup_ms / estimate_ms))):
        step(i)
    reps = min(max(math.ceil(budget_ms / estimate_ms), min_reps), max_reps)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    torch.cuda.synchronize()
    for i in range(reps):
        if backlog:
            torch.cuda._sleep(BACKLOG_CYCLES)
        starts[i].record()
        step(i)
        ends[i].record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) * 1e3 / calls_per_step for s, e in zip(starts, ends, strict=True)]


# ----------------------------------------------------------------- bandwidth
def copy_bandwidth_gbps(
    device: torch.device | str, nbytes: int = 2 * 1024**3, reps: int = 10
) -> float:
    """Returns device-to-device copy bandwidth in GB/s (bytes read + written, median)."""
    dev = torch.device(device)
    src = torch.empty(nbytes, dtype=torch.uint8, device=dev).random_(0, 256)
    dst = torch.empty_like(src)
    for _ in range(2):
        dst.copy_(src)
    times_s: list[float] = []
    if dev.type == "cuda":
        with torch.cuda.device(dev):
            pairs = [
                (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                for _ in range(reps)
            ]
            for start, end in pairs:
                start.record()
                dst.copy_(src)
                end.record()
            torch.cuda.synchronize()
            times_s = [start.elapsed_time(end) / 1e3 for start, end in pairs]
    else:
        for _ in range(reps):
            t0 = time.perf_counter()
            dst.copy_(src)
            times_s.append(time.perf_counter() - t0)
    return 2 * nbytes / statistics.median(times_s) / 1e9


# ----------------------------------------------------------------- statistics
def bootstrap_ratio_ci(
    baseline_samples: Iterable[float],
    method_samples: Iterable[float],
    n_boot: int = 2000,
    alpha: float = 0.05,
    seed: int = 0,
) -> tuple[float, float, float]:
    """Returns ``(speedup, lo, hi)``: median(baseline) / median(method) and its bootstrap CI.

    Both sample sets are resampled independently (percentile interval).
    """
    base = np.asarray(list(baseline_samples), dtype=np.float64)
    meth = np.asarray(list(method_samples), dtype=np.float64)
    if base.size == 0 or meth.size == 0:
        raise ValueError("bootstrap_ratio_ci: both sample sets need at least one sample")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha: must be in (0, 1), got {alpha}")
    rng = np.random.default_rng(seed)
    base_medians = np.median(base[rng.integers(0, base.size, (n_boot, base.size))], axis=1)
    meth_medians = np.median(meth[rng.integers(0, meth.size, (n_boot, meth.size))], axis=1)
    ratios = base_medians / meth_medians
    lo, hi = np.quantile(ratios, [alpha / 2, 1 - alpha / 2])
    return float(np.median(base) / np.median(meth)), float(lo), float(hi)
