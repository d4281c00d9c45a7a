"""Each method's decode step on the GPU, kernel by kernel.

Run on the GPU:  python scripts/profile_kernels.py --methods quest:pages=64,oracle-topk \\
    [--shapes 1x32k,8x32k] [--attn 32/8/128,28/4/128] [--calls 20]

For every shape, attention shape and method (a ``santa-bench kernel --methods`` list, each
method's fast path prepared as the kernel harness prepares it, Gaussian bf16 inputs as
``make_decode_inputs`` draws them), the step is called ``--calls`` times under
``torch.profiler``, each call after a write of twice the L2's bytes (so K and V come from
HBM, as the harness's cold-L2 timing has them; the flush's own kernel is not counted). Each
row is one kernel: its launches a step and its mean GPU time a step (CUPTI's kernel
durations: no launch gaps, which a CUDA graph hides anyway), with the step's total last.
A kernel's share of the total says where a step's time goes; it is not the graph latency
``santa-bench kernel`` stores.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from santa_bench.inputs import DecodeShape, make_decode_inputs
from santa_bench.methods._core import parse_method_specs
from santa_bench.timing import l2_cache_bytes
from santa_bench.units import parse_shapes


@triton.jit
def _l2_flush_kernel(ptr, n, BLOCK: tl.constexpr):
    """Writes ``n`` floats at ``ptr`` (evicting the L2; its own name keeps it uncounted)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(ptr + offs, 1.0, mask=offs < n)


def flush_l2(buf: torch.Tensor) -> None:
    _l2_flush_kernel[(triton.cdiv(buf.numel(), 4096),)](buf, buf.numel(), BLOCK=4096)


@dataclass(frozen=True)
class Row:
    """One kernel of one method's step at one shape."""

    shape: str
    method: str
    kernel: str
    launches: float
    us: float


def _short(name: str) -> str:
    """A kernel's name without its template arguments."""
    return name.split("(")[0].split("<")[0][:60]


def _label(name: str, params: dict) -> str:
    return name + ("" if not params else ":" + ",".join(f"{k}={v}" for k, v in params.items()))


def profile_step(step, flush: torch.Tensor, calls: int) -> tuple[dict[str, float], dict[str, int]]:
    """Mean GPU microseconds and launches a call, per kernel name."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):  # compile and warm
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            flush_l2(flush)
            step()
        torch.cuda.synchronize()
    us: dict[str, float] = defaultdict(float)
    launches: dict[str, int] = defaultdict(int)
    for event in prof.events():
        if event.device_type != torch.autograd.DeviceType.CUDA:
            continue
        if "_l2_flush_kernel" in event.name:
            continue
        name = _short(event.name)
        us[name] += event.device_time
        launches[name] += 1
    return {k: v / calls for k, v in us.items()}, {k: v / calls for k, v in launches.items()}


def profile_shape(batch: int, ctx: int, attn: tuple[int, int, int], specs: list,
                  calls: int, flush: torch.Tensor) -> list[Row]:
    heads, kv_heads, head_dim = attn
    shape = DecodeShape(batch=batch, ctx=ctx, heads=heads, kv_heads=kv_heads, head_dim=head_dim)
    q, kv = make_decode_inputs(shape, device="cuda", seed=1)
    label = f"{ctx // 1024}k B={batch} {heads}/{kv_heads}/{head_dim}"
    rows = []
    for method, overrides in specs:
        params = method.resolve_params(overrides)
        name = _label(method.name, overrides)
        if method.prepare is None:
            print(f"{name}: no fast path, skipped", file=sys.stderr)
            continue
        step = method.prepare(q, kv, seed=0, **params)
        us, launches = profile_step(step, flush, calls)
        for kernel in sorted(us, key=us.get, reverse=True):
            rows.append(Row(label, name, kernel, launches[kernel], us[kernel]))
        rows.append(Row(label, name, "(all kernels)", sum(launches.values()), sum(us.values())))
        del step
        torch.cuda.empty_cache()
    return rows


def _attn(text: str) -> tuple[int, int, int]:
    parts = text.split("/")
    if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise ValueError(f"expected HEADS/KV_HEADS/HEAD_DIM (e.g. 32/8/128), got {text!r}")
    return int(parts[0]), int(parts[1]), int(parts[2])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--methods", required=True,
                        help="methods as santa-bench kernel takes them (quest:pages=64,...)")
    parser.add_argument("--shapes", default="1x32k,8x32k", help="BATCHxCTX, comma-separated")
    parser.add_argument("--attn", default="32/8/128",
                        help="HEADS/KV_HEADS/HEAD_DIM, comma-separated (default: 32/8/128)")
    parser.add_argument("--calls", type=int, default=20, help="profiled calls a method")
    args = parser.parse_args(argv)
    try:
        shapes = parse_shapes(args.shapes)
        attns = [_attn(a) for a in args.attn.split(",") if a.strip()]
        specs = parse_method_specs(args.methods)
    except Exception as exc:  # a bad option: one line, no traceback
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.calls < 1:
        print("error: --calls must be at least 1", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("error: needs a CUDA GPU", file=sys.stderr)
        return 2
    l2 = l2_cache_bytes("cuda") or 50 * 2**20
    flush = torch.empty(2 * l2 // 4, dtype=torch.float32, device="cuda")
    print("| shape | method | kernel | launches | us a step | share |")
    print("|---|---|---|---|---|---|")
    for attn in attns:
        for batch, ctx in shapes:
            rows = profile_shape(batch, ctx, attn, specs, args.calls, flush)
            totals = {r.method: r.us for r in rows if r.kernel == "(all kernels)"}
            for r in rows:
                share = r.us / totals[r.method] if totals.get(r.method) else 0.0
                print(f"| {r.shape} | {r.method} | {r.kernel} | {r.launches:g} | "
                      f"{r.us:.1f} | {share:.0%} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
