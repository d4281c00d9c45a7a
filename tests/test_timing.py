"""The timing core: wall-clock samples, quartiles, cold-L2 planning (sized by the method's
byte model), bootstrap CIs."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import santa_kernels as sk
from santa_bench import timing
from santa_bench.gpu_state import CASE_FIELDS
from santa_bench.methods import REGISTRY
from santa_bench.runners.kernel import (
    KernelGrid,
    KernelRunner,
    call_bytes,
    expand_cases,
    time_prepared,
)
from santa_bench.timing import (
    MAX_COPIES,
    Timing,
    bootstrap_ratio_ci,
    cold_l2_plan,
    copy_bandwidth_gbps,
    measure,
    nbytes_of,
)
from santa_kernels.reads import ReadCounts

MB = 1024 * 1024
L2 = 50 * MB
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _tiny_work() -> torch.Tensor:
    x = torch.randn(64, 64)
    return x @ x


# ------------------------------------------------------------------ cpu-wall
def test_cpu_wall_returns_samples_and_sane_quantiles():
    t = measure(
        _tiny_work, touched_bytes=64 * 64 * 4, l2_bytes=None, make_copy=None,
        device="cpu", warmup_ms=1, budget_ms=20, min_reps=5, max_reps=200,
    )
    assert t.mode == "cpu-wall" and t.l2_state == "n/a"
    assert 5 <= t.n <= 200 and len(t.samples_us) == t.n
    assert all(s > 0 for s in t.samples_us)
    assert min(t.samples_us) <= t.q1_us <= t.median_us <= t.q3_us <= max(t.samples_us)
    assert t.iqr_us == pytest.approx(t.q3_us - t.q1_us)


def test_cpu_wall_respects_min_and_max_reps():
    few = measure(_tiny_work, touched_bytes=1, l2_bytes=None, make_copy=None, device="cpu",
                  warmup_ms=0, budget_ms=0, min_reps=7, max_reps=50)
    assert few.n == 7
    capped = measure(lambda: None, touched_bytes=1, l2_bytes=None, make_copy=None,
                     device="cpu", warmup_ms=0, budget_ms=10_000, min_reps=1, max_reps=13)
    assert capped.n == 13
    with pytest.raises(ValueError):
        measure(lambda: None, touched_bytes=1, l2_bytes=None, make_copy=None, device="cpu",
                min_reps=5, max_reps=2)


def test_timing_quartiles_inclusive():
    t = Timing.from_samples([5.0, 1.0, 3.0, 2.0, 4.0], mode="cpu-wall", l2_state="n/a")
    assert (t.median_us, t.q1_us, t.q3_us, t.iqr_us, t.n) == (3.0, 2.0, 4.0, 2.0, 5)
    single = Timing.from_samples([7.0], mode="events", l2_state="warm")
    assert single.q1_us == single.q3_us == single.median_us == 7.0
    with pytest.raises(ValueError):
        Timing.from_samples([], mode="events", l2_state="warm")


# ------------------------------------------------------------------ cold L2
def test_cold_l2_plan_enough_copies_is_cold():
    assert cold_l2_plan(10 * MB, L2) == (20, "cold")  # ceil(4 * 50 / 10)
    copies, state = cold_l2_plan(30 * MB, L2)
    assert (copies, state) == (7, "cold") and copies * 30 * MB >= 3 * L2


def test_cold_l2_plan_large_inputs_need_one_copy():
    assert cold_l2_plan(3 * L2, L2) == (1, "cold")
    assert cold_l2_plan(10 * L2, L2, cold_l2=False) == (1, "cold")  # physics, not the flag


def test_cold_l2_plan_labels_warm_when_too_few_copies():
    copies, state = cold_l2_plan(MB // 2, L2)  # would need 400 copies; capped
    assert copies == MAX_COPIES and state == "warm"
    assert cold_l2_plan(10 * MB, L2, max_copies=5) == (5, "warm")  # memory-limited
    assert cold_l2_plan(10 * MB, L2, can_copy=False) == (1, "warm")  # no make_copy
    assert cold_l2_plan(10 * MB, L2, cold_l2=False) == (1, "warm")  # --warm
    assert cold_l2_plan(10 * MB, None) == (1, "warm")  # unknown L2 is never cold
    with pytest.raises(ValueError):
        cold_l2_plan(0, L2)


def test_cold_l2_plan_forced_copies_are_labelled_by_what_they_rotate():
    assert cold_l2_plan(10 * MB, L2, copies=2) == (2, "warm")  # 20 MB < 3 x L2
    assert cold_l2_plan(10 * MB, L2, copies=16) == (16, "cold")
    assert cold_l2_plan(200 * MB, L2, copies=1) == (1, "cold")
    assert cold_l2_plan(10 * MB, None, copies=64) == (64, "warm")
    with pytest.raises(ValueError, match="make_copy"):
        cold_l2_plan(10 * MB, L2, copies=2, can_copy=False)
    with pytest.raises(ValueError, match="copies"):
        cold_l2_plan(10 * MB, L2, copies=0)


def test_cold_l2_plan_rotates_the_copies_workspaces_past_the_l2():
    """A workspace kept in L2 by an eviction hint outlives any stream of other bytes: the
    plan rotates 4x L2 of it too, and only 2x L2 of it (its footprint past L2) is cold."""
    # 68 MB a call, 4.2 MB of it the stash: 3 copies by the inputs, 48 by the stash
    assert cold_l2_plan(68 * MB, L2, workspace_bytes=42 * MB // 10) == (48, "cold")
    assert cold_l2_plan(68 * MB, L2, workspace_bytes=42 * MB // 10, copies=3) == (3, "warm")
    assert cold_l2_plan(68 * MB, L2, workspace_bytes=42 * MB // 10, copies=16) == (16, "warm")
    assert cold_l2_plan(68 * MB, L2, workspace_bytes=42 * MB // 10, copies=24) == (24, "cold")
    # one call past 3x L2 still needs copies when its stash alone fits the L2
    assert cold_l2_plan(286 * MB, L2, workspace_bytes=17 * MB) == (12, "cold")
    assert cold_l2_plan(286 * MB, L2, workspace_bytes=17 * MB, cold_l2=False) == (1, "warm")
    assert cold_l2_plan(600 * MB, L2, workspace_bytes=60 * MB) == (4, "cold")
    assert cold_l2_plan(600 * MB, L2, workspace_bytes=100 * MB) == (1, "cold")
    assert cold_l2_plan(68 * MB, L2, workspace_bytes=4 * MB, max_copies=10) == (10, "warm")
    with pytest.raises(ValueError, match="workspace_bytes"):
        cold_l2_plan(10 * MB, L2, workspace_bytes=11 * MB)


def test_timing_records_the_bytes_rotated_through():
    t = Timing.from_samples([2.0, 1.0], mode="graph", l2_state="cold", n_copies=3,
                            calls_per_sample=12, touched_bytes=5 * MB)
    assert (t.touched_bytes, t.rotated_bytes, t.calls_per_sample) == (5 * MB, 15 * MB, 12)


# ------------------------------------------------------------------ byte model -> plan
def _prop_reads(context: list[int], hkv: int = 2, d: int = 8, v_rows: int = 3) -> ReadCounts:
    lengths = torch.tensor(context)
    rows = lengths[:, None].expand(-1, hkv).contiguous()
    return ReadCounts(k_rows=rows, k_features=rows * d, v_rows=torch.full_like(rows, v_rows),
                      context=lengths, head_dim=d)


@pytest.mark.parametrize(("stash", "score_bytes"), [("fp16", 2), ("fp32", 4)])
def test_call_bytes_splits_the_byte_model_into_inputs_and_workspace(stash, score_bytes):
    method = REGISTRY.get("santa-prop")
    q = torch.zeros(2, 4, 8, dtype=torch.bfloat16)
    reads = _prop_reads([100, 60])
    inputs, workspace = call_bytes(method, reads, q, {"stash": stash}, tables=10)
    kv = ((100 + 60) * 2 * 8 + 4 * 3 * 8) * 2  # every K row of both KV heads, 3 V rows each
    q_bytes = 2 * q.numel() * 2  # q read, the output written (bf16)
    assert inputs == kv + 10 + q_bytes
    assert workspace == 2 * score_bytes * 4 * (100 + 60)  # stash written and read back
    assert inputs + workspace == method.bytes_read(reads, 2, 4, {"stash": stash}) + 10 + q_bytes
    dense, none = call_bytes(REGISTRY.get("sdpa-cudnn"), reads, q, {})
    assert none == 0 and dense == kv + q_bytes


class _Prepared:
    """A prepared call with a byte model, with or without ``rebind``."""

    def __init__(self, reads: ReadCounts, rebind: bool) -> None:
        self._reads = reads
        self.inputs_bytes = 1000
        self.rebind = (lambda q, kv: _Prepared(reads, rebind)) if rebind else None

    def __call__(self) -> None:
        return None

    def reads(self) -> ReadCounts:
        return self._reads


@pytest.mark.parametrize("rebind", [True, False])
@pytest.mark.parametrize("workspace", ["shared", "per-copy"])
def test_time_prepared_sizes_the_rotation_by_the_bytes_a_call_touches(monkeypatch, rebind,
                                                                       workspace):
    seen = {}

    def fake_measure(fn, **kw):
        seen.update(kw)
        return "timing"

    monkeypatch.setattr(timing, "measure", fake_measure)
    method = REGISTRY.get("santa-prop")
    q = torch.zeros(1, 4, 8, dtype=torch.bfloat16)
    kv = sk.KVCache.contiguous(torch.zeros(1, 100, 2, 8, dtype=torch.bfloat16),
                               torch.zeros(1, 100, 2, 8, dtype=torch.bfloat16))
    reads = _prop_reads([100])
    params = {"stash": "fp16"}
    assert time_prepared(method, _Prepared(reads, rebind), q, kv, 0, params, graph=True,
                         cold_l2=True, budget_ms=1.0, workspace=workspace) == "timing"
    inputs, stash = call_bytes(method, reads, q, params)
    shared = rebind and workspace == "shared"
    assert seen["touched_bytes"] == (inputs if shared else inputs + stash)  # not q+K+V
    assert seen["workspace_bytes"] == (0 if shared else stash)
    assert seen["touched_bytes"] < nbytes_of(q, kv) == seen["copy_bytes"] - 1000 - (
        0 if shared else stash)
    assert seen["make_copy"] is None  # CPU tensors: no copies


def test_time_prepared_gives_each_copy_its_own_workspace_by_default(monkeypatch):
    seen = {}
    monkeypatch.setattr(timing, "measure", lambda fn, **kw: seen.update(kw))
    method = REGISTRY.get("santa-prop")
    q = torch.zeros(1, 4, 8, dtype=torch.bfloat16)
    kv = sk.KVCache.contiguous(torch.zeros(1, 100, 2, 8, dtype=torch.bfloat16),
                               torch.zeros(1, 100, 2, 8, dtype=torch.bfloat16))
    reads = _prop_reads([100])
    time_prepared(method, _Prepared(reads, rebind=True), q, kv, 0, {}, graph=True,
                  cold_l2=True, budget_ms=1.0)
    _, stash = call_bytes(method, reads, q, {})
    assert stash > 0 and seen["workspace_bytes"] == stash


def test_kernel_rows_record_the_rotation(monkeypatch):
    """A device timing's latency row says how many copies rotated how many bytes (the
    timing core is stubbed with a graph-mode result: this runs on the CPU)."""

    def fake_measure(fn, *, touched_bytes, **kw):
        fn()
        return Timing.from_samples([10.0, 11.0, 12.0], mode="graph", l2_state="cold",
                                   n_copies=3, calls_per_sample=12, touched_bytes=touched_bytes)

    monkeypatch.setattr(timing, "measure", fake_measure)
    grid = KernelGrid(methods=[(REGISTRY.get("sdpa-math"), {})], ctx=[64], batch=[2], S=[8],
                      heads=4, kv_heads=2, head_dim=16, dtype="fp32")
    (case,) = expand_cases(grid)
    rows = KernelRunner().run(case)
    latency = next(r for r in rows if r["metric"] == "latency")
    kv_bytes = 2 * 64 * 2 * 16 * 4 * 2  # K and V of both sequences, fp32
    assert latency["touched_bytes"] == kv_bytes + 2 * (2 * 4 * 16 * 4)
    assert latency["rotated_bytes"] == 3 * latency["touched_bytes"]
    assert (latency["copies"], latency["calls_per_replay"]) == (3, 12)
    assert latency["workspace"] == "per-copy"
    assert latency["workspace_bytes"] == 0  # SDPA has no workspace
    assert set(CASE_FIELDS) <= set(latency)
    launch = json.loads(latency["launch"])  # what the prepared call launched
    assert launch["baseline"] == "sdpa-math" and launch["resolved_backend"] == "sdpa-math"


def test_launch_record_keeps_a_kernel_plan_field_by_field():
    from santa_bench.runners.kernel import launch_record
    from santa_kernels.triton_santapp import make_plan

    plan = make_plan(1, 14, 2, 64, 2048, 512, 16, 64)
    record = json.loads(launch_record({"plan": plan, "teams_read_from": "cache",
                                       "dtype": torch.bfloat16, "sizes": (1, 2)}))
    assert record["plan"]["local"] is False and record["plan"]["num_splits"] == plan.num_splits
    assert record["dtype"] == "torch.bfloat16" and record["sizes"] == [1, 2]


def test_nbytes_of_counts_kv_cache_and_nesting():
    kv = sk.KVCache.contiguous(torch.randn(2, 8, 2, 4), torch.randn(2, 8, 2, 4))
    expected = 2 * 2 * 8 * 2 * 4 * 4 + 2 * 8  # K, V (fp32) and int64 lengths
    assert nbytes_of(kv) == expected
    assert nbytes_of([torch.zeros(3)], {"a": torch.zeros(2, dtype=torch.float64)}, None) == 28


# ------------------------------------------------------------------ bootstrap
def _lognormal(median: float, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return median * np.exp(rng.normal(0.0, 0.1, n))


def test_bootstrap_ci_contains_true_ratio_and_narrows():
    small = bootstrap_ratio_ci(_lognormal(100, 40, 1), _lognormal(50, 40, 2), seed=3)
    large = bootstrap_ratio_ci(_lognormal(100, 1000, 4), _lognormal(50, 1000, 5), seed=6)
    for ratio, lo, hi in (small, large):
        assert lo <= 2.0 <= hi and lo <= ratio <= hi
    assert large[2] - large[1] < 0.5 * (small[2] - small[1])


def test_bootstrap_ci_rejects_empty_samples():
    with pytest.raises(ValueError):
        bootstrap_ratio_ci([], [1.0])


def test_copy_bandwidth_cpu_is_positive():
    assert copy_bandwidth_gbps("cpu", nbytes=4 * MB, reps=3) > 0


# ------------------------------------------------------------------ GPU only
@pytest.mark.gpu
@needs_cuda
def test_graph_and_event_modes_on_gpu():
    x = torch.randn(1024, 1024, device="cuda")
    copies = [x.clone() for _ in range(MAX_COPIES)]
    y = torch.empty_like(x)

    def make_copy(i: int):
        return lambda: torch.mul(copies[i], 2.0, out=y)

    for graph in (True, False):
        t = measure(lambda: torch.mul(x, 2.0, out=y), touched_bytes=2 * x.numel() * 4,
                    l2_bytes=None, make_copy=make_copy, graph=graph, device="cuda",
                    budget_ms=20)
        assert t.mode == ("graph" if graph else "events")
        assert t.n >= 10 and t.median_us > 0 and t.l2_state in ("cold", "warm")
        assert t.calls_per_sample >= (10 if graph else 1)
    torch.testing.assert_close(y, 2 * x)


@pytest.mark.gpu
@needs_cuda
def test_copy_bandwidth_gpu_is_positive():
    assert copy_bandwidth_gbps("cuda", nbytes=256 * MB) > 0
