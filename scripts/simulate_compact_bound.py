"""How many keys the SANTA++ compact finisher gathers: per row, the keys at or above the
(M+1)-th largest of the splits' top ``j`` perturbed logits (``j = ceil((M+1) / splits)``),
on Gaussian scores plus Gumbel noise (the harness's kind of row). Prints mean, 99th
percentile and max over the rows for a few (teams, splits, M, score spread).

Run anywhere:  python3 scripts/simulate_compact_bound.py [rows]
"""

from __future__ import annotations

import sys

import torch


def gathered(teams: int, splits: int, M: int, sigma: float, rows: int,
             gen: torch.Generator) -> torch.Tensor:
    """Keys at or above the bound, one count per row (fp64)."""
    j = -(-(M + 1) // splits)
    phi = torch.randn(rows, teams, generator=gen, dtype=torch.float64) * sigma
    u = torch.rand(rows, teams, generator=gen, dtype=torch.float64).clamp(1e-12, 1 - 1e-12)
    z = phi - torch.log(-torch.log(u))
    tops = z.view(rows, splits, teams // splits).topk(j, dim=-1).values.flatten(1)
    bound = tops.topk(M + 1, dim=-1).values[:, -1:]
    return (z >= bound).sum(-1).double()


def main() -> None:
    rows = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    gen = torch.Generator().manual_seed(0)
    print("teams splits M sigma j | mean p99 max")
    for teams, splits, M in ((2048, 32, 32), (2048, 32, 64), (2048, 16, 32), (8192, 32, 32)):
        for sigma in (0.0, 1.0, 3.0, 10.0):
            n = gathered(teams, splits, M, sigma, rows, gen)
            j = -(-(M + 1) // splits)
            print(f"{teams} {splits} {M} {sigma} {j} | {n.mean():.1f} "
                  f"{n.quantile(0.99):.0f} {n.max():.0f}")


if __name__ == "__main__":
    main()
