"""Score stages (docs/algorithms.md sections 1 and 5): exact qK^T and Bernoulli qK^T."""

from __future__ import annotations

import torch

from santa_kernels.validate import InputError, check_positive_int

BERNOULLI_GROUPING = ("per-head", "mean-group-query")
_MIN_INCLUSION = 1e-12


def _expand_group(kv_tensor: torch.Tensor, group: int) -> torch.Tensor:
    """[B, N, Hkv, d] -> [B, Hq, N, d] (each KV head repeated for its G query heads)."""
    return kv_tensor.permute(0, 2, 1, 3).repeat_interleave(group, dim=1)


def exact_scores(
    q: torch.Tensor, keys: torch.Tensor, valid: torch.Tensor, scale: float, group: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns ``(scores [B, Hq, N], k_features [B, Hkv])``; invalid rows score -inf."""
    scores = scale * torch.einsum("bhd,bhnd->bhn", q, _expand_group(keys, group))
    scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
    lengths = valid.sum(dim=1)
    hkv = keys.shape[2]
    k_features = (lengths[:, None] * keys.shape[3]).expand(-1, hkv).contiguous()
    return scores, k_features


def bernoulli_scores(
    q: torch.Tensor,
    keys: torch.Tensor,
    valid: torch.Tensor,
    scale: float,
    group: int,
    draws: int,
    grouping: str,
    generator: torch.Generator,
    uniforms: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Unbiased sparse estimate of the scores (docs/algorithms.md section 5).

    ``per-head``: each query head draws ``draws`` ternary queries
    ``t_j = sign(q_j) * Bernoulli(|q_j| / max|q|)`` and the score estimate is
    ``scale * max|q| * mean_draws(t . k)``.
    ``mean-group-query``: the feature mask is drawn once per KV head from the group's
    mean query (inclusion ``pi_j = |qbar_j| / max|qbar|``) and every head reweights the
    read features by ``1/pi_j``: ``scale * mean_draws(sum_j beta_j q_j k_j / pi_j)``.
    docs/algorithms.md leaves the per-head weights open; this Horvitz-Thompson form is
    unbiased for each head and equals the ternary estimator when ``G = 1``.

    Returns ``(scores [B, Hq, N], k_features [B, Hkv])`` where ``k_features`` counts K
    elements read: valid rows times the features selected by any head or draw.
    ``uniforms`` (``[B, Hq, draws, d]`` per head, ``[B, Hkv, draws, d]`` per group)
    replaces the generator's draws (the Triton stage is tested against it).
    """
    check_positive_int(draws, "draws")
    if grouping not in BERNOULLI_GROUPING:
        raise InputError(f"grouping: expected one of {BERNOULLI_GROUPING}, got {grouping!r}")
    batch, hq, d = q.shape
    hkv = hq // group
    keys_per_head = _expand_group(keys, group)  # [B, Hq, N, d]
    if grouping == "per-head":
        alpha = q.abs().amax(dim=-1, keepdim=True).clamp_min(torch.finfo(q.dtype).tiny)
        prob = q.abs() / alpha  # [B, Hq, d]
        u = (torch.rand((batch, hq, draws, d), generator=generator, dtype=torch.float64)
             if uniforms is None else uniforms.double())
        beta = (u.to(q.device) < prob[:, :, None, :].double()).to(q.dtype)
        ternary = torch.sign(q)[:, :, None, :] * beta  # [B, Hq, draws, d]
        weights = alpha * ternary.mean(dim=2)  # [B, Hq, d]
        features_read = beta.amax(dim=2).reshape(batch, hkv, group, d).amax(dim=2)
    else:
        q_mean = q.reshape(batch, hkv, group, d).mean(dim=2)
        alpha = q_mean.abs().amax(dim=-1, keepdim=True).clamp_min(torch.finfo(q.dtype).tiny)
        inclusion = (q_mean.abs() / alpha).clamp_min(_MIN_INCLUSION)  # [B, Hkv, d]
        u = (torch.rand((batch, hkv, draws, d), generator=generator, dtype=torch.float64)
             if uniforms is None else uniforms.double())
        beta = (u.to(q.device) < inclusion[:, :, None, :].double()).to(q.dtype)
        reweight = (beta / inclusion[:, :, None, :]).mean(dim=2)  # [B, Hkv, d]
        weights = q * reweight.repeat_interleave(group, dim=1)
        features_read = beta.amax(dim=2)  # [B, Hkv, d]
    scores = scale * torch.einsum("bhd,bhnd->bhn", weights, keys_per_head)
    scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
    lengths = valid.sum(dim=1)
    k_features = lengths[:, None] * features_read.sum(dim=-1).long()
    return scores, k_features
