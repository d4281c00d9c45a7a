"""The kernel harness against a plain timing loop written here (CUDA only).

The loop is what a user would write: a CUDA graph of back-to-back calls, each call over
its own copy of the inputs and its own prepared kernel (workspace, random state), CUDA
events around each replay, time per call = replay time / calls. The harness
(`runners.kernel.time_prepared`, what `santa-bench kernel` reports) must agree within 3%.
"""

from __future__ import annotations

import statistics

import pytest
import torch

from santa_bench.baselines import clone_kv
from santa_bench.inputs import DecodeShape, make_decode_inputs
from santa_bench.methods import REGISTRY
from santa_bench.runners.kernel import time_prepared

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

TOLERANCE = 0.03
CALLS = 16  # calls per replay, each with its own inputs


def plain_loop_us(method_name: str, params: dict, q: torch.Tensor, kv, replays: int = 200
                  ) -> float:
    """Median microseconds per call of a graph of CALLS calls over distinct inputs."""
    method = REGISTRY.get(method_name)
    calls = [method.prepare(q.clone(), clone_kv(kv), seed=100 + i, **params)
             for i in range(CALLS)]
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
    for _ in range(10):
        graph.replay()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(replays)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(replays)]
    for start, end in zip(starts, ends, strict=True):
        start.record()
        graph.replay()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) * 1e3 / CALLS
                             for s, e in zip(starts, ends, strict=True))


def harness_us(method_name: str, params: dict, q: torch.Tensor, kv) -> float:
    method = REGISTRY.get(method_name)
    prepared = method.prepare(q, kv, seed=0, **params)
    timing = time_prepared(method, prepared, q, kv, 0, params, graph=True, cold_l2=True,
                           budget_ms=300.0)
    return timing.median_us


@pytest.mark.parametrize(("ctx", "batch"), [(32768, 1), (131072, 1), (32768, 8)])
@pytest.mark.parametrize(("method_name", "params"), [
    ("santa-prop", {"S": 128}),
    ("sdpa-cudnn", {}),
])
def test_harness_agrees_with_a_plain_loop(method_name, params, ctx, batch):
    method = REGISTRY.get(method_name)
    ok, why = method.kernel_available()
    if not ok:
        pytest.skip(why)
    q, kv = make_decode_inputs(DecodeShape(batch=batch, ctx=ctx), seed=0, device="cuda")
    loop = plain_loop_us(method_name, params, q, kv)
    harness = harness_us(method_name, params, q, kv)
    print(f"{method_name} ctx={ctx} B={batch}: harness {harness:.2f} us, loop {loop:.2f} us")
    assert abs(harness - loop) / loop <= TOLERANCE, (harness, loop)
