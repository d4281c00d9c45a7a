"""Estimator statistics over seeds: bias, spread and error against the exact output."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SeedStatistics:
    """Statistics of a random estimator over ``seeds`` independent draws.

    ``rel_bias``: ||mean - exact|| / ||exact||; ``rel_rmse``: root mean squared error
    over seeds relative to ||exact||; ``max_abs_z``: the largest |mean - exact| / SE over
    output elements (SE = sample std / sqrt(seeds)); large values mean a detectable bias.
    """

    seeds: int
    rel_bias: float
    rel_rmse: float
    max_abs_z: float
    mean: torch.Tensor
    std: torch.Tensor

    def as_metrics(self) -> dict[str, float]:
        return {"rel_bias": self.rel_bias, "rel_rmse": self.rel_rmse, "max_abs_z": self.max_abs_z}


def seed_statistics(
    draw: Callable[[int], torch.Tensor], exact: torch.Tensor, seeds: int, first_seed: int = 0
) -> SeedStatistics:
    """Draws ``draw(seed)`` for ``seeds`` seeds and compares the draws with ``exact``."""
    if seeds < 2:
        raise ValueError(f"seeds: need at least 2 draws, got {seeds}")
    samples = torch.stack([draw(first_seed + s).double() for s in range(seeds)])
    exact = exact.double()
    mean = samples.mean(dim=0)
    std = samples.std(dim=0)
    norm = exact.norm().clamp_min(1e-300)
    standard_error = std / seeds**0.5
    deviation = (mean - exact).abs()
    # elements with zero spread must match exactly; tolerate rounding only
    z = torch.where(
        standard_error > 1e-12,
        deviation / standard_error.clamp_min(1e-300),
        torch.where(
            deviation > 1e-9, torch.full_like(deviation, float("inf")), torch.zeros_like(deviation)
        ),
    )
    mse = ((samples - exact) ** 2).sum(dim=tuple(range(1, samples.dim()))).mean()
    return SeedStatistics(
        seeds=seeds,
        rel_bias=float((mean - exact).norm() / norm),
        rel_rmse=float(mse.sqrt() / norm),
        max_abs_z=float(z.max()),
        mean=mean,
        std=std,
    )
