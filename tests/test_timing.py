"""The timing core: wall-clock samples, quartiles, cold-L2 planning, bootstrap CIs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import santa_kernels as sk
from santa_bench.timing import (
    MAX_COPIES,
    Timing,
    bootstrap_ratio_ci,
    cold_l2_plan,
    copy_bandwidth_gbps,
    measure,
    nbytes_of,
)

MB = 1024 * 1024
L2 = 50 * MB
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _tiny_work() -> torch.Tensor:
    x = torch.randn(64, 64)
    return x @ x


# ------------------------------------------------------------------ cpu-wall
def test_cpu_wall_returns_samples_and_sane_quantiles():
    t = measure(
        _tiny_work, inputs_bytes=64 * 64 * 4, l2_bytes=None, make_copy=None,
        device="cpu", warmup_ms=1, budget_ms=20, min_reps=5, max_reps=200,
    )
    assert t.mode == "cpu-wall" and t.l2_state == "n/a"
    assert 5 <= t.n <= 200 and len(t.samples_us) == t.n
    assert all(s > 0 for s in t.samples_us)
    assert min(t.samples_us) <= t.q1_us <= t.median_us <= t.q3_us <= max(t.samples_us)
    assert t.iqr_us == pytest.approx(t.q3_us - t.q1_us)


def test_cpu_wall_respects_min_and_max_reps():
    few = measure(_tiny_work, inputs_bytes=1, l2_bytes=None, make_copy=None, device="cpu",
                  warmup_ms=0, budget_ms=0, min_reps=7, max_reps=50)
    assert few.n == 7
    capped = measure(lambda: None, inputs_bytes=1, l2_bytes=None, make_copy=None,
                     device="cpu", warmup_ms=0, budget_ms=10_000, min_reps=1, max_reps=13)
    assert capped.n == 13
    with pytest.raises(ValueError):
        measure(lambda: None, inputs_bytes=1, l2_bytes=None, make_copy=None, device="cpu",
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
    copies, state = cold_l2_plan(1 * MB, L2)  # would need 200 copies; capped at 64
    assert copies == MAX_COPIES and state == "warm"
    assert cold_l2_plan(10 * MB, L2, max_copies=5) == (5, "warm")  # memory-limited
    assert cold_l2_plan(10 * MB, L2, can_copy=False) == (1, "warm")  # no make_copy
    assert cold_l2_plan(10 * MB, L2, cold_l2=False) == (1, "warm")  # --warm
    assert cold_l2_plan(10 * MB, None) == (1, "warm")  # unknown L2 is never cold
    with pytest.raises(ValueError):
        cold_l2_plan(0, L2)


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
        t = measure(lambda: torch.mul(x, 2.0, out=y), inputs_bytes=2 * x.numel() * 4,
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
