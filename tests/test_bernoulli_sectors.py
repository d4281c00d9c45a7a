"""scripts/bernoulli_sectors.py: its expected read fractions are the reference's."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from santa_kernels import scores as score_stages

_PATH = Path(__file__).resolve().parents[1] / "scripts" / "bernoulli_sectors.py"
_SPEC = importlib.util.spec_from_file_location("bernoulli_sectors", _PATH)
sectors = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(sectors)


@pytest.mark.parametrize("grouping", ["per-head", "mean-group-query"])
@pytest.mark.parametrize("draws", [1, 4])
def test_feature_fraction_matches_the_reference_draws(grouping, draws):
    """Monte Carlo mean of the reference's K-feature count vs the analytic expectation."""
    gen = torch.Generator().manual_seed(0)
    hq, hkv, d, n = 8, 2, 32, 5
    q = torch.randn(1, hq, d, generator=gen, dtype=torch.float64)
    keys = torch.randn(1, n, hkv, d, generator=gen, dtype=torch.float64)
    valid = torch.ones(1, n, dtype=torch.bool)
    expected, _ = sectors.fractions(q[0], hq // hkv, draws, grouping)
    seeds = 2000
    total = 0.0
    for _ in range(seeds):
        _, k_features = score_stages.bernoulli_scores(q, keys, valid, 0.1, hq // hkv, draws,
                                                      grouping, gen)
        total += float(k_features.sum()) / (hkv * n * d)
    mean = total / seeds
    # each seed's fraction is a mean of 64 Bernoulli features (sd <= 0.5 / 8): 5 sigma
    assert abs(mean - expected) < 5 * 0.0625 / seeds**0.5


def test_sectors_of_one_hot_queries():
    """One feature per head: G features of a group are read, in the sectors they fall in."""
    q = torch.zeros(4, 64)
    for h, j in enumerate((0, 1, 17, 63)):  # group of 4: sectors 0, 0, 1, 3 of 4
        q[h, j] = 1.0
    feature, sector = sectors.fractions(q, 4, 1, "per-head")
    assert feature == pytest.approx(4 / 64)
    assert sector == pytest.approx(3 / 4)
