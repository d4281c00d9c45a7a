"""The kernel harness under several timing plans beside plain timing loops (GPU).

Run on the GPU:  python scripts/timing_check.py [--methods M] [--shapes S] [--out CSV]

Per method and shape (Llama-3.1-8B heads by default, bf16, the harness's inputs), each
row is one timing of the same prepared call, in us per call:

- ``harness``: ``runners.kernel.time_prepared`` as ``santa-bench kernel`` runs it (each
  input copy with its own workspace and seed), then with one knob changed: the input
  copies (1, 2, 16), the copies sharing the first's workspace (``shared``), the calls
  one graph replay holds (1, 8, 32);
- ``loop``: a CUDA graph of 16 calls written here, each over its own copy of the inputs,
  events around each replay: each call prepared anew (``per-call``), or the calls sharing
  one workspace (``decode``: what a decode step's layers do); and 16 calls over one
  input copy;
- for a method with a logit stash, the same with the stash's L2 ``evict_last`` policy
  switched off (``stash-l2 off``), which keeps a stash of up to 12 MiB in L2 between
  calls that share it.

``vs loop`` divides by the per-call loop (timed first and last; their spread is the
clock drift over the shape). The GPU's clocks, power and temperature are printed before
and after.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import gc
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from santa_bench.baselines import clone_kv
from santa_bench.gpu_state import gpu_state
from santa_bench.inputs import DecodeShape, make_decode_inputs
from santa_bench.methods import Method, parse_method_specs
from santa_bench.runners.kernel import time_prepared
from santa_bench.timing import l2_cache_bytes
from santa_bench.units import parse_shapes

LOOP_CALLS = 16
REPLAYS = 100


@dataclass(frozen=True)
class Row:
    """One timing: what was timed and how, in us per call."""

    method: str
    shape: str
    what: str
    copies: int
    calls: int
    workspace: str
    rotated_mb: float
    us: float


@contextlib.contextmanager
def stash_l2_off() -> Iterator[None]:
    """The SANTA kernels' stash stored and loaded without an L2 policy, meanwhile."""
    import santa_kernels.triton_santa as ts

    saved = {dim: dict(config) for dim, config in ts.HOPPER_CONFIGS.items()}
    for config in ts.HOPPER_CONFIGS.values():
        config["stash_evict"] = ""
    try:
        yield
    finally:
        for dim, config in saved.items():
            ts.HOPPER_CONFIGS[dim].clear()
            ts.HOPPER_CONFIGS[dim].update(config)


def loop_calls(method: Method, params: dict, q: torch.Tensor, kv, *, shared: bool,
               copies: int = LOOP_CALLS, n_calls: int = LOOP_CALLS) -> list:
    """``n_calls`` prepared calls over ``copies`` clones of the inputs (in turn); ``shared``:
    one workspace and random state (the first call's ``rebind``), else one per call."""
    clones = [(q.clone(), clone_kv(kv)) for _ in range(copies)]
    first = method.prepare(*clones[0], seed=100, **params)
    calls = [first]
    for i in range(1, n_calls):
        q_i, kv_i = clones[i % copies]
        if shared and first.rebind is not None:
            calls.append(first.rebind(q_i, kv_i))
        else:
            calls.append(method.prepare(q_i, kv_i, seed=100 + i, **params))
    return calls


def loop_us(calls: list, replays: int = REPLAYS) -> float:
    """Median us per call: CUDA events around each replay of a graph of ``calls``."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            for call in calls:
                call()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    for _ in range(5):
        graph.replay()
    pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
             for _ in range(replays)]
    for start, end in pairs:
        start.record()
        graph.replay()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) * 1e3 / len(calls) for s, e in pairs)


def check(method: Method, params: dict, label: str, batch: int, ctx: int, heads: int,
          kv_heads: int, head_dim: int, budget_ms: float,
          emit: Callable[[Row], None] = lambda row: None) -> list[Row]:
    """Every row of one method at one shape; ``emit`` sees each row as it is measured. A
    row that runs out of GPU memory is kept with ``us`` NaN and the rest still run."""
    shape = f"{ctx // 1024}k B={batch}"
    q, kv = make_decode_inputs(DecodeShape(batch, ctx, heads, kv_heads, head_dim), seed=0,
                               device="cuda")
    rows: list[Row] = []

    def measured(what: str, copies: int | None, timing: Callable[[], Row]) -> None:
        """Keeps ``timing()``'s row (an out-of-memory row if it runs out), then frees
        what the timing held before the next one allocates."""
        try:
            row = timing()
        except torch.OutOfMemoryError:
            row = Row(label, shape, f"{what} (out of memory)", copies or 0, 0, "-",
                      float("nan"), float("nan"))
        rows.append(row)
        emit(row)
        free_memory()

    def harness(what: str, **plan) -> None:
        def timing() -> Row:
            prepared = method.prepare(q, kv, seed=0, **params)
            t = time_prepared(method, prepared, q, kv, 0, params, graph=True, cold_l2=True,
                              budget_ms=budget_ms, **plan)
            shared = plan.get("workspace") == "shared" and prepared.rebind is not None
            return Row(label, shape, what, t.n_copies, t.calls_per_sample,
                       "shared" if shared else "per-copy", t.rotated_bytes / 1e6, t.median_us)
        measured(what, plan.get("copies"), timing)

    def loop(what: str, shared: bool, copies: int = LOOP_CALLS) -> None:
        def timing() -> Row:
            calls = loop_calls(method, params, q, kv, shared=shared, copies=copies)
            workspace = "shared" if shared and calls[0].rebind is not None else "per-call"
            return Row(label, shape, what, copies, LOOP_CALLS, workspace, float("nan"),
                       loop_us(calls))
        measured(what, copies, timing)

    loop("loop per-call", shared=False)
    harness("harness")
    harness("harness shared", workspace="shared")
    for copies in (1, 2, 16):
        harness(f"harness copies={copies}", copies=copies)
    harness("harness copies=16 shared", copies=16, workspace="shared")
    for calls in (1, 8, 32):
        harness(f"harness calls={calls}", calls_per_replay=calls)
    loop("loop decode", shared=True)
    loop("loop decode, one input copy", shared=True, copies=1)
    if method.has_stash:
        with stash_l2_off():
            harness("harness, stash-l2 off")
            loop("loop decode, stash-l2 off", shared=True)
            loop("loop per-call, stash-l2 off", shared=False)
    loop("loop per-call (again)", shared=False)
    return rows


def free_memory() -> None:
    """Returns what the last timing held (its input copies, graph pools) to the device."""
    gc.collect()
    torch.cuda.empty_cache()


def print_rows(rows: list[Row]) -> None:
    """One table per (method, shape), each row against the mean of its per-call loops."""
    groups: dict[tuple[str, str], list[Row]] = {}
    for row in rows:
        groups.setdefault((row.method, row.shape), []).append(row)
    for (method, shape), members in groups.items():
        loops = [r.us for r in members if r.what.startswith("loop per-call")
                 and "off" not in r.what and r.us == r.us]
        loop = statistics.mean(loops) if loops else float("nan")
        print(f"\n{method} at {shape}")
        print(f"  {'what':<30} {'copies':>6} {'calls':>5} {'workspace':>9} "
              f"{'rotated MB':>10} {'us/call':>8} {'vs loop':>9}")
        for r in members:
            rotated = "-" if r.rotated_mb != r.rotated_mb else f"{r.rotated_mb:.0f}"
            print(f"  {r.what:<30} {r.copies:>6} {r.calls:>5} {r.workspace:>9} "
                  f"{rotated:>10} {r.us:>8.2f} {r.us / loop:>9.3f}")


def state_line(when: str) -> str:
    s = gpu_state()
    return (f"{when}: SM {s['sm_clock_mhz']}/{s['sm_clock_max_mhz']} MHz, memory "
            f"{s['mem_clock_mhz']}/{s['mem_clock_max_mhz']} MHz, {s['power_w']} of "
            f"{s['power_limit_w']} W, {s['temperature_c']} C, clocks-event reasons "
            f"{s['clocks_event_reasons']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--methods", default="santa-prop:S=128,sdpa-cudnn",
                        help="methods as santa-bench kernel names them (default: %(default)s)")
    parser.add_argument("--shapes", default="1x32k,8x32k,1x128k",
                        help="BATCHxCTX, comma-separated (default: %(default)s)")
    parser.add_argument("--heads", type=int, default=32, help="query heads (default: 32)")
    parser.add_argument("--kv-heads", type=int, default=8, help="KV heads (default: 8)")
    parser.add_argument("--head-dim", type=int, default=128, help="head dim (default: 128)")
    parser.add_argument("--budget-ms", type=float, default=100.0,
                        help="timing budget of each harness row (default: %(default)s)")
    parser.add_argument("--out", type=Path, help="also write the rows to this CSV file")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("timing_check.py: needs a CUDA GPU", file=sys.stderr)
        return 2
    try:
        methods = parse_method_specs(args.methods)
    except ValueError as exc:
        print(f"timing_check.py: --methods: {exc}", file=sys.stderr)
        return 2
    try:
        shapes = parse_shapes(args.shapes)
    except ValueError as exc:
        print(f"timing_check.py: --shapes: {exc}", file=sys.stderr)
        return 2
    started = time.perf_counter()
    print(f"{torch.cuda.get_device_name()}, L2 {l2_cache_bytes('cuda') / 2**20:.0f} MiB, "
          f"torch {torch.__version__}")
    print(state_line("before"))
    rows: list[Row] = []
    handle = args.out.open("w", newline="") if args.out else None
    writer = csv.DictWriter(handle, fieldnames=list(Row.__dataclass_fields__)) if handle else None
    if writer:
        writer.writeheader()

    def emit(row: Row) -> None:  # as it is measured: a run cut short keeps its rows
        print(f"  {row.method} {row.shape}: {row.what}: {row.us:.2f} us", flush=True)
        if writer:
            writer.writerow(vars(row))
            handle.flush()

    for batch, ctx in shapes:
        for method, overrides in methods:
            ok, why = method.kernel_available()
            if not ok:
                print(f"{method.name}: skipped ({why})")
                continue
            params = method.resolve_params(overrides)
            label = method.name + "".join(f" {k}={v}" for k, v in overrides.items())
            rows += check(method, params, label, batch, ctx, args.heads, args.kv_heads,
                          args.head_dim, args.budget_ms, emit)
            free_memory()  # the shape's inputs and copies
    print_rows(rows)
    print("\n" + state_line("after"))
    print(f"{time.perf_counter() - started:.0f} s")
    if handle:
        handle.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
