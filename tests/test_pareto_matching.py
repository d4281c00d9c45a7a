"""The verdict's matching rule: a paired non-inferiority test, "not separable" where the data
cannot rank, and the fastest configuration at each retention band."""

from __future__ import annotations

import numpy as np
import pytest

from santa_bench import pareto


def _scores(n: int, ones: int, flips: tuple[int, int] = (0, 0)) -> np.ndarray:
    """``n`` 0/1 scores with ``ones`` ones; ``flips`` turns that many ones to 0 and zeros to
    1 (a configuration that disagrees with dense on some samples, paired by index)."""
    scores = np.zeros(n)
    scores[:ones] = 1
    down, up = flips
    scores[:down] = 0
    scores[ones:ones + up] = 1
    return scores


def _accuracy(scores: np.ndarray) -> pareto.Accuracy:
    return pareto.Accuracy({"ruler-niah_single_1": scores}, 0.5)


def test_identical_scores_are_matched_and_not_separable():
    dense = _accuracy(_scores(100, 60))
    ret = pareto.retention(dense, dense, ["ruler-niah_single_1"])
    assert ret.matched
    assert ret.versus_dense == "not separable"
    assert ret.diff_low == ret.diff_high == 0


def test_an_equal_mean_that_disagrees_on_many_samples_is_not_matched():
    """Same mean as dense, but 12 of 50 samples flipped: the paired interval of the
    difference spans about +-13 points, wider than the 2-point margin."""
    dense = _accuracy(_scores(50, 30))
    noisy = _accuracy(_scores(50, 30, flips=(6, 6)))
    ret = pareto.retention(noisy, dense, ["ruler-niah_single_1"])
    assert ret.drop_points == 0
    assert ret.diff_low < -pareto.MARGIN_POINTS < ret.diff_high
    assert not ret.matched
    assert ret.versus_dense == "not separable"


def test_a_clear_loss_is_below_dense_and_a_small_one_on_many_samples_is_matched():
    dense = _accuracy(_scores(1000, 600))
    worse = pareto.retention(_accuracy(_scores(1000, 600, flips=(100, 0))), dense,
                             ["ruler-niah_single_1"])
    assert worse.versus_dense == "below" and not worse.matched
    close = pareto.retention(_accuracy(_scores(1000, 600, flips=(5, 0))), dense,
                             ["ruler-niah_single_1"])
    assert close.versus_dense == "below"  # 5 losses, no gains: separable, yet
    assert close.matched  # within the margin


def _point(config: str, retention: float, speedup: float) -> pareto.Point:
    ret = pareto.Retention(["t"], retention, 1.0, retention, retention - 0.02,
                           retention + 0.02, 100 * (retention - 1) - 1, 100 * (retention - 1) + 1)
    timing = pareto.Timing(10.0, speedup, speedup * 0.9, speedup * 1.1, "sdpa-cudnn", 0.5,
                           float("nan"), "run")
    return pareto.Point(config, ret, {}, 0.5, {1: timing})


def test_fastest_at_each_retention_band():
    points = [_point("a", 0.995, 1.2), _point("b", 0.96, 2.0), _point("c", 0.91, 3.0),
              _point("d", 0.80, 9.0)]
    verdict = pareto.Verdict("m", pareto.Shape(2, 1, 8), 1024, (1,), "gpu",
                             pareto.Accuracy({}, 1.0), ["t"], {}, points, [], [], [], [], {})
    assert [verdict.fastest("all", 1, band).config for band in pareto.RETENTION_BANDS] == [
        "a", "b", "c"]


def test_speed_intervals_widen_by_the_dense_kernels_spread_across_runs():
    timing = pareto.Timing(10.0, 2.0, 1.9, 2.1, "sdpa-cudnn", 0.5, float("nan"), "r2")
    # the same dense kernel timed 19, 20 and 22 us in three runs; the speedup used r2's 20
    wide = pareto.widened(timing, {"r1": 19.0, "r2": 20.0, "r3": 22.0})
    assert wide.speedup == 2.0 and wide.dense_runs == 3
    assert wide.low == pytest.approx(1.9 * 19 / 20) and wide.high == pytest.approx(2.1 * 22 / 20)
    assert pareto.widened(timing, {"r2": 20.0}) == timing  # one run: nothing to widen by
    # a run that recalled its dense timing from an earlier run: the speedup's own dense
    resumed = pareto.Timing(10.0, 2.0, 1.9, 2.1, "sdpa-cudnn", 0.5, float("nan"), "r4")
    assert pareto.widened(resumed, {"r1": 19.0, "r2": 20.0}).low == pytest.approx(1.9 * 19 / 20)
