"""The kernel harness against a plain timing loop written here (CUDA only).

The loop: a CUDA graph of ``CALLS`` back-to-back calls, each over its own copy of q and
the KV cache and prepared anew (its own workspace and seed), CUDA events around each
replay, time per call = replay time / ``CALLS``, the median over replays. The harness as
``santa-bench kernel`` runs it (``runners.kernel.time_prepared``, its own copy plan) must
agree within 3%, at the Llama-3.1-8B shape (32 / 8 / 128, bf16), for a sampled kernel
(santa-prop S=128) and a dense baseline (cuDNN SDPA) at 32k B=1, 32k B=8 and 128k B=1.

Printed beside them, not asserted: the same loop with the calls sharing one workspace, as
a decode step's layers do. SANTA's logit stash is stored with an L2 ``evict_last`` policy,
so calls that share it can skip its write-back; kernel rows do not count on that (see
``santa_bench.timing``). Run with ``-s`` to see the table (with the GPU's clocks, power
and temperature before and after), printed when the module's tests end.
"""

from __future__ import annotations

import functools
import statistics
from datetime import UTC, datetime

import pytest
import torch

from conftest import load_script
from santa_bench.inputs import DecodeShape, make_decode_inputs
from santa_bench.methods import REGISTRY
from santa_bench.runners.kernel import time_prepared

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

TOLERANCE = 0.03
CALLS = 16  # calls per replay, each over its own inputs
REPLAYS = 200
BUDGET_MS = 300.0


@functools.cache
def _plain_loop():
    """The plain loop of ``scripts/timing_check.py`` (CUDA graphs and events, nothing of
    the harness's timing code)."""
    return load_script("timing_check")


def loop_calls(method_name: str, params: dict, q: torch.Tensor, kv, shared: bool) -> list:
    """CALLS prepared calls over their own clones of q and the cache; ``shared``: one
    workspace and random state for all (the first call's ``rebind``)."""
    return _plain_loop().loop_calls(REGISTRY.get(method_name), params, q, kv, shared=shared,
                                    copies=CALLS, n_calls=CALLS)


def loop_us(calls: list) -> float:
    """Median microseconds per call: events around each replay of a graph of ``calls``."""
    return _plain_loop().loop_us(calls, replays=REPLAYS)


def timed_loop(method_name: str, params: dict, q: torch.Tensor, kv, shared: bool) -> float:
    calls = loop_calls(method_name, params, q, kv, shared=shared)
    us = loop_us(calls)
    del calls
    torch.cuda.empty_cache()
    return us


@pytest.fixture(scope="module")
def table():
    """Collects one line per case; prints the table when the module's tests end."""
    start = _plain_loop().state_line("before")
    lines: list[str] = []
    yield lines
    header = [
        f"harness vs a plain loop of {CALLS} calls a replay, {torch.cuda.get_device_name()}, "
        f"{datetime.now(UTC).date()}, torch {torch.__version__}",
        start,
        _plain_loop().state_line("after"),
        "| method | ctx | B | harness us | copies | rotated MB | workspace MB | per-call loop us "
        "(before, after) | ratio | shared-workspace loop us |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    print("\n" + "\n".join(header + lines))


@pytest.mark.parametrize(("ctx", "batch"), [(32768, 1), (32768, 8), (131072, 1)])
@pytest.mark.parametrize(("method_name", "overrides"), [
    ("santa-prop", {"S": 128}),
    ("sdpa-cudnn", {}),
])
def test_harness_agrees_with_a_plain_loop(table, method_name, overrides, ctx, batch):
    method = REGISTRY.get(method_name)
    ok, why = method.kernel_available()
    if not ok:
        pytest.skip(why)
    params = method.resolve_params(overrides)
    q, kv = make_decode_inputs(DecodeShape(batch=batch, ctx=ctx, heads=32, kv_heads=8,
                                           head_dim=128), seed=0, device="cuda")
    # the loop before and after the harness: clock drift shows as their spread
    per_call = [timed_loop(method_name, params, q, kv, shared=False)]
    prepared = method.prepare(q, kv, seed=0, **params)
    timing = time_prepared(method, prepared, q, kv, 0, params, graph=True, cold_l2=True,
                           budget_ms=BUDGET_MS)
    del prepared
    torch.cuda.empty_cache()
    per_call.append(timed_loop(method_name, params, q, kv, shared=False))
    shared = timed_loop(method_name, params, q, kv, shared=True)
    loop = statistics.mean(per_call)
    table.append(
        f"| {method.name}{' S=' + str(params['S']) if 'S' in params else ''} | "
        f"{ctx // 1024}k | {batch} | {timing.median_us:.2f} | {timing.n_copies} | "
        f"{timing.rotated_bytes / 1e6:.0f} | {timing.workspace_bytes / 1e6:.1f} | "
        f"{loop:.2f} ({per_call[0]:.2f}, {per_call[1]:.2f}) | {timing.median_us / loop:.3f} | "
        f"{shared:.2f} |")
    assert timing.l2_state == "cold"
    assert abs(timing.median_us - loop) <= TOLERANCE * loop, (timing.median_us, per_call)
