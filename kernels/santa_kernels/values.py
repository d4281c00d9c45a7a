"""Value stages (docs/algorithms.md sections 1-4): each turns scores into weights on V rows.

Every stage returns ``weights [B, Hq, N]`` with ``out = sum_i weights_i v_i``; a row is
read from V iff its weight is non-zero. Sampling stages produce count weights
(``c_i / S``, tile-scaled for flash) and never multiply V by a probability.
Random numbers are drawn on the CPU from the caller's generator in a fixed order
that depends on shapes only, so paged and contiguous inputs see the same stream.
"""

from __future__ import annotations

import math

import torch

from santa_kernels.validate import InputError

ALLOCATIONS = ("systematic", "largest-remainder")


def _uniform(
    shape: tuple[int, ...], generator: torch.Generator, like: torch.Tensor
) -> torch.Tensor:
    return torch.rand(shape, generator=generator, dtype=torch.float64).to(like.device)


def softmax_probs(scores: torch.Tensor) -> torch.Tensor:
    """Returns ``softmax(scores)`` in float64 (masked rows hold -inf and get 0)."""
    return torch.softmax(scores.double(), dim=-1)


def _cdf(probs: torch.Tensor) -> torch.Tensor:
    """Sequence-order CDF whose last entry is exactly 1 (so every sample lands on a valid row)."""
    cdf = torch.cumsum(probs, dim=-1)
    return (cdf / cdf[..., -1:]).clamp_(max=1.0)


def _counts_from_cdf(
    cdf: torch.Tensor, offset: torch.Tensor, budget: torch.Tensor | int
) -> torch.Tensor:
    """Systematic count form: ``c_i = floor(a + S F_i) - floor(a + S F_{i-1})``."""
    scaled = torch.floor(offset + budget * cdf)
    previous = torch.cat([torch.floor(offset + 0 * cdf[..., :1]), scaled[..., :-1]], dim=-1)
    return scaled - previous


def _counts_from_thresholds(cdf: torch.Tensor, thresholds: torch.Tensor) -> torch.Tensor:
    """Counts of thresholds ``u`` with ``i = min{j : F_j > u}`` (inverse-CDF sampling)."""
    index = torch.searchsorted(cdf, thresholds, right=True)
    index = index.clamp_(max=cdf.shape[-1] - 1)
    counts = torch.zeros_like(cdf)
    counts.scatter_add_(-1, index, torch.ones_like(thresholds))
    return counts


def dense_weights(scores: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Exact attention: the weights are the softmax probabilities."""
    return softmax_probs(scores)


def iid_weights(scores: torch.Tensor, budget: int, generator: torch.Generator) -> torch.Tensor:
    """SANTA (section 2): ``S`` i.i.d. draws from ``p``; weight ``c_i / S``."""
    cdf = _cdf(softmax_probs(scores))
    u = _uniform((*scores.shape[:-1], budget), generator, scores)
    return _counts_from_thresholds(cdf, u) / budget


def strat_weights(scores: torch.Tensor, budget: int, generator: torch.Generator) -> torch.Tensor:
    """S2ANTA-strat (section 3): one uniform in each stratum ``[m/S, (m+1)/S)``."""
    cdf = _cdf(softmax_probs(scores))
    u = _uniform((*scores.shape[:-1], budget), generator, scores)
    strata = torch.arange(budget, dtype=torch.float64, device=scores.device)
    return _counts_from_thresholds(cdf, (strata + u) / budget) / budget


def sys_weights(scores: torch.Tensor, budget: int, generator: torch.Generator) -> torch.Tensor:
    """S2ANTA-sys (section 3): one offset ``a`` per (sequence, head), count form."""
    cdf = _cdf(softmax_probs(scores))
    offset = _uniform((*scores.shape[:-1], 1), generator, scores)
    return _counts_from_cdf(cdf, offset, budget) / budget


# ------------------------------------------------------------------- tiling
def _tiled(scores: torch.Tensor, tile: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Returns ``(tile_scores [.., T, BN], tile_mass [.., T], local_cdf)`` of split scores.

    ``tile_mass`` is ``W_t = e^{m_t - m*} l_t / Z`` built from each tile's local max and
    local mass exactly as a split-KV kernel would; ``local_cdf`` is each tile's CDF of
    its local distribution (1 at the tile's end; empty tiles hold 0 mass).
    """
    n = scores.shape[-1]
    n_tiles = math.ceil(n / tile)
    pad = n_tiles * tile - n
    s = torch.nn.functional.pad(scores.double(), (0, pad), value=float("-inf"))
    s = s.reshape(*scores.shape[:-1], n_tiles, tile)
    tile_max = s.amax(dim=-1)  # m_t (-inf for an empty tile)
    safe_max = torch.where(torch.isfinite(tile_max), tile_max, torch.zeros_like(tile_max))
    local = torch.exp(s - safe_max[..., None])  # e^{s_i - m_t}
    local_mass = local.sum(dim=-1)  # l_t
    global_max = tile_max.amax(dim=-1, keepdim=True)  # m*
    rescaled = torch.exp(tile_max - global_max) * local_mass
    tile_mass = rescaled / rescaled.sum(dim=-1, keepdim=True)
    local_cdf = torch.cumsum(local, dim=-1) / local_mass.clamp_min(1e-300)[..., None]
    local_cdf = local_cdf.clamp_(max=1.0)
    nonempty = local_mass > 0
    local_cdf = torch.where(nonempty[..., None], local_cdf, torch.zeros_like(local_cdf))
    local_cdf[..., -1] = torch.where(nonempty, 1.0, 0.0)
    return s, tile_mass, local_cdf


def _untile(weights: torch.Tensor, n: int) -> torch.Tensor:
    return weights.reshape(*weights.shape[:-2], -1)[..., :n]


def flash_weights(
    scores: torch.Tensor,
    budget: int,
    generator: torch.Generator,
    tile: int,
    lengths: torch.Tensor,
) -> torch.Tensor:
    """S2ANTA-flash (section 4): equal per-tile budgets, mass-weighted merge.

    Each valid tile draws ``S_tile = max(1, S // T_b)`` systematic samples from its
    local distribution (``T_b`` = tiles of sequence ``b``); ``o = sum_t W_t o_t``.
    """
    n = scores.shape[-1]
    _, tile_mass, local_cdf = _tiled(scores, tile)
    n_tiles = local_cdf.shape[-2]
    tiles_per_seq = (lengths + tile - 1) // tile  # [B]
    per_tile = torch.clamp(budget // tiles_per_seq, min=1).to(torch.float64)
    per_tile = per_tile.to(scores.device)[:, None, None, None]  # [B, 1, 1, 1]
    offset = _uniform((*scores.shape[:-1], n_tiles, 1), generator, scores)
    counts = _counts_from_cdf(local_cdf, offset, per_tile)
    weights = counts * (tile_mass[..., None] / per_tile)
    return _untile(weights, n)


def prop_weights(
    scores: torch.Tensor,
    budget: int,
    generator: torch.Generator,
    tile: int,
    alloc: str = "systematic",
) -> torch.Tensor:
    """S2ANTA-prop (section 4): tile budgets proportional to tile mass.

    ``systematic`` (default): global systematic thresholds ``a, a+1, ..., a+S-1`` on the
    scale ``S*F`` shared by all tiles: tile budgets ``S_t`` follow from the cumulative
    tile mass and the thresholds continue inside each tile. Exactly unbiased.
    ``largest-remainder``: budgets ``S*W_t`` rounded by largest remainder and each tile
    sampled systematically with its own offset, output scaled by ``1/S`` (the released
    code); biased where tiles are rounded to zero.
    """
    if alloc not in ALLOCATIONS:
        raise InputError(f"alloc: expected one of {ALLOCATIONS}, got {alloc!r}")
    n = scores.shape[-1]
    _, tile_mass, local_cdf = _tiled(scores, tile)
    if alloc == "systematic":
        tile_start = torch.cumsum(tile_mass, dim=-1) - tile_mass  # C_{t-1}
        cdf = tile_start[..., None] + tile_mass[..., None] * local_cdf
        cdf = torch.where(local_cdf > 0, cdf, tile_start[..., None])
        cdf = _untile(cdf, n)
        cdf = (cdf / cdf[..., -1:]).clamp_(max=1.0)  # F_N exactly 1
        offset = _uniform((*scores.shape[:-1], 1), generator, scores)
        return _counts_from_cdf(cdf, offset, budget) / budget
    tile_budget = largest_remainder_budgets(tile_mass, budget)
    offset = _uniform((*scores.shape[:-1], local_cdf.shape[-2], 1), generator, scores)
    counts = _counts_from_cdf(local_cdf, offset, tile_budget[..., None])
    return _untile(counts, n) / budget


def largest_remainder_budgets(tile_mass: torch.Tensor, budget: int) -> torch.Tensor:
    """Rounds ``S * W_t`` to integers summing to ``S`` by largest remainder."""
    raw = budget * tile_mass
    floor = torch.floor(raw)
    remainder = raw - floor
    missing = budget - floor.sum(dim=-1, keepdim=True)  # [.., 1]
    order = torch.argsort(remainder, dim=-1, descending=True, stable=True)
    rank = torch.empty_like(order)
    rank.scatter_(-1, order, torch.arange(order.shape[-1], device=order.device).expand_as(order))
    return floor + (rank < missing).to(floor.dtype)
