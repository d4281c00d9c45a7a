"""Family ``bernoulli``: Bernoulli qK^T, ternary query draws that read a subset of the
K features, composed with any value stage (dense or a SANTA sampler).

Reference: ``santa_kernels.attention(score="bernoulli", value=...)``. Kernel:
``santa_kernels.triton_bernoulli.BernoulliDecode`` (its query stage, then the value
stage's kernel). End-to-end decode: :class:`TritonBernoulliDecode` (this module).
"""

from __future__ import annotations

import importlib
from typing import Any

import torch

import santa_kernels as sk
from santa_bench.baselines import Prepared, Unsupported, trial_run
from santa_bench.decode.base import DecodeAttention
from santa_bench.e2e.cache import StaticKVCache
from santa_bench.methods._common import (
    ALLOC,
    KERNEL_ONLY_PARAMS,
    MIN_CTX,
    STASH,
    STASH_DTYPES,
    TILE,
    S,
)
from santa_bench.methods._core import Method, Param, PlotStyle, register
from santa_bench.methods.santa import require_santa_kernels, santa_kernel_available
from santa_bench.timing import nbytes_of
from santa_kernels.kv import KVCache
from santa_kernels.reads import ReadCounts
from santa_kernels.validate import InputError

DRAWS = Param("draws", 4, int, "ternary query draws B averaged per head", minimum=1)
GROUPING = Param(
    "grouping",
    "per-head",
    str,
    "feature mask per query head or once per GQA group (mean group query)",
    choices=("per-head", "mean-group-query"),
)
VALUE = Param(
    "value_stage",
    "dense",
    str,
    "value stage composed with the Bernoulli scores",
    choices=("dense", "iid", "strat", "sys", "flash", "prop"),
)
# Bernoulli's kernel composes with the SANTA kernels (their stash); added after Bernoulli
# results were stored, so left out of a case at its default (the stored hashes hold)
BERNOULLI_STASH = Param("stash", "fp16", str, STASH.help, choices=STASH.choices,
                        omit_default=True)


def bernoulli_stash(params: dict[str, Any]) -> str | None:
    """The stash dtype of a value stage that keeps one (prop, sys, strat, iid; fp16 unless
    named), None for dense and flash."""
    if params.get("value_stage", VALUE.default) in ("dense", "flash"):
        return None
    return params.get("stash", BERNOULLI_STASH.default)


def bernoulli_reference(q: torch.Tensor, kv: sk.KVCache, **params: Any) -> sk.AttentionOutput:
    """The reference; ``value_stage`` (not ``value``, a result column) picks the value stage."""
    value = params.pop("value_stage", "dense")
    if value == "dense":
        params = {k: v for k, v in params.items() if k not in ("S", "tile", "alloc")}
    params = {k: v for k, v in params.items() if k not in KERNEL_ONLY_PARAMS}
    return sk.attention(q, kv, score="bernoulli", value=value, **params)


# ------------------------------------------------------------------ kernel adapter
def bernoulli_prepare(
    q: torch.Tensor,
    kv: KVCache,
    *,
    seed: int = 0,
    draws: int = 4,
    grouping: str = "per-head",
    value_stage: str = "dense",
    S: int = 128,
    tile: int = 64,
    alloc: str = "systematic",
    min_ctx: int = 0,
    stash: str | None = None,
    scale: float | None = None,
) -> Prepared:
    """Prepares the Triton Bernoulli stage composed with its value stage's kernel
    (``triton_bernoulli.BernoulliDecode``). The read counts are what the kernels move
    (every K feature: token-major rows); the estimator's K-feature fraction is the extra
    metric ``bernoulli_k_feature_fraction``."""
    if min_ctx:
        raise Unsupported("the Triton kernels do not implement min_ctx; use the reference")
    if stash is not None and stash not in STASH_DTYPES:
        raise InputError(f"stash: expected one of {sorted(STASH_DTYPES)}, got {stash!r}")
    module = importlib.import_module("santa_kernels.triton_bernoulli")
    call = module.BernoulliDecode(q, kv, draws=draws, grouping=grouping,
                                  value_stage=value_stage, S=S, tile=tile, alloc=alloc,
                                  scale=scale, seed=seed,
                                  stash_dtype=STASH_DTYPES[stash or "fp16"])
    metrics: dict[str, tuple[float, str]] = {}

    def run() -> torch.Tensor:
        return call(q, kv)

    def reads():
        _, info, features = call(q, kv, info=True)
        context = kv.lengths.long().cpu()
        hkv = kv.num_kv_heads
        if info is None:  # dense values: every V row
            rows = context[:, None].expand(-1, hkv).contiguous()
            counts = ReadCounts(k_rows=rows, k_features=rows * kv.head_dim, v_rows=rows,
                                context=context, head_dim=kv.head_dim)
        else:
            counts = info.read_counts(kv.head_dim)
        needed = (features.long().cpu() * context[:, None]).sum()
        metrics["bernoulli_k_feature_fraction"] = (
            float(needed) / float(context.sum() * hkv * kv.head_dim), "ratio")
        return counts

    def rebind(q: torch.Tensor, kv: KVCache) -> Prepared:  # the same workspaces
        return Prepared(lambda: call(q, kv), nbytes_of(q, kv), prepared.notes, rebind=rebind)

    trial_run(run, q, "bernoulli")
    prepared = Prepared(run, nbytes_of(q, kv), {"value_stage": value_stage}, rebind=rebind)
    prepared.reads = reads  # type: ignore[attr-defined]
    prepared.reset_rng = call.reset_rng  # type: ignore[attr-defined]
    prepared.metrics = metrics  # type: ignore[attr-defined]
    return prepared


# ------------------------------------------------------------------ end-to-end decode
class TritonBernoulliDecode(DecodeAttention):
    """Bernoulli qK^T with its value stage (``santa_kernels.triton_bernoulli``); one
    prepared call (its workspaces, its device step counters) serves every layer."""

    def __init__(self, params: dict[str, Any], scale: float, seed: int) -> None:
        self.params, self.scale, self.seed = dict(params), scale, seed
        self.name = "triton"

    def setup(self, cache: StaticKVCache, q: torch.Tensor) -> None:
        super().setup(cache, q)
        require_santa_kernels(self.params)
        module = importlib.import_module("santa_kernels.triton_bernoulli")
        p = self.params
        try:
            self.call = module.BernoulliDecode(
                q, cache.layers[0], draws=p["draws"], grouping=p["grouping"],
                value_stage=p["value_stage"], S=p["S"], tile=p["tile"], alloc=p["alloc"],
                scale=self.scale, seed=self.seed,
                stash_dtype=STASH_DTYPES[p.get("stash") or "fp16"])
        except ValueError as exc:
            raise Unsupported(f"bernoulli: {exc}") from exc

    def reset(self) -> None:
        self.call.reset_rng(0)

    def __call__(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        return self.call(q, self.cache.layers[layer])



def _e2e_backend(method: Method, params: dict[str, Any], scale: float, seed: int):
    return TritonBernoulliDecode(params, scale, seed)


# ------------------------------------------------------------------ the method
@register
def bernoulli() -> Method:
    return Method(
        "bernoulli",
        "bernoulli",
        "Bernoulli qK^T: ternary queries read a subset of K features; any value stage",
        (DRAWS, GROUPING, VALUE, S, TILE, ALLOC, MIN_CTX, BERNOULLI_STASH),
        reference=bernoulli_reference,
        prepare=bernoulli_prepare,
        kernel_kind="triton",
        # its query kernel runs wherever the SANTA kernels it composes with do
        kernel_availability=santa_kernel_available,
        stash_of=bernoulli_stash,
        e2e_backend=_e2e_backend,
        plot=PlotStyle(colour="#9467bd"),
    )
