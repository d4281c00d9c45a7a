"""Adapters that turn the fast kernels and the dense baselines into timed callables.

Every adapter has the signature ``prepare(q, kv, *, seed, **params) -> Prepared`` (the
dense baselines' :class:`~santa_bench.baselines.Prepared`): all setup (workspaces,
plans, compilation, a trial call) happens here, outside the timed callable. Sampled
kernels also attach ``reads()``, one untimed call that returns the method's
:class:`~santa_kernels.reads.ReadCounts` for the byte model.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable
from typing import Any

import torch

from santa_bench.baselines import BASELINES, Prepared, Unsupported, trial_run
from santa_bench.timing import nbytes_of
from santa_kernels.kv import KVCache
from santa_kernels.reads import ReadCounts
from santa_kernels.validate import InputError

PrepareFn = Callable[..., Prepared]
STASH_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def _triton_santa():
    return importlib.import_module("santa_kernels.triton_santa")


def santa_kernel_available() -> tuple[bool, str]:
    """Returns whether the Triton SANTA kernels can run here, with the reason if not."""
    try:
        return _triton_santa().santa_triton_available()
    except Exception as exc:  # triton missing or broken
        return False, f"santa_kernels.triton_santa not importable: {exc}"


def santa_prepare(function: str) -> PrepareFn:
    """Returns the adapter of ``santa_kernels.triton_santa.<function>``."""

    def prepare(
        q: torch.Tensor,
        kv: KVCache,
        *,
        seed: int = 0,
        S: int,
        tile: int = 64,
        alloc: str | None = None,
        min_ctx: int = 0,
        stash: str | None = None,
        scale: float | None = None,
        passes: int | None = None,
        gather: str | None = None,
        pairs: str | None = None,
    ) -> Prepared:
        if min_ctx:
            raise Unsupported("the Triton kernels do not implement min_ctx; use the reference")
        module = _triton_santa()
        flash = function == "santa_flash"
        if passes not in (None, 1, 2) or (passes == 2 and not flash):
            raise InputError(f"passes: 1 or 2, and 2 only for santa-flash; got {passes!r}")
        if gather not in (None, "masked") and not flash:
            raise InputError(f"gather={gather}: an option of santa-flash")
        if gather == "inline" and passes != 2:
            raise InputError("gather=inline: an option of the two-pass kernel (passes=2)")
        # one pass with compact, lagged V gathers (triton_santa_flash_compact)
        one_pass_compact = flash and passes != 2 and gather == "compact"
        if pairs not in (None, "auto", "on", "off"):
            raise InputError(f"pairs: auto, on or off, got {pairs!r}")
        if pairs not in (None, "auto") and not one_pass_compact:
            raise InputError("pairs: an option of the one-pass compact santa-flash "
                             "(santa-flash:gather=compact)")
        draw_tiles = {"on": 2, "off": 1}.get(pairs or "auto")
        if stash is not None and stash not in STASH_DTYPES:
            raise InputError(f"stash: expected one of {sorted(STASH_DTYPES)}, got {stash!r}")
        stash_dtype = STASH_DTYPES[stash or "fp32"]
        kernel = getattr(module, function)
        if passes == 2:  # the same draw in two kernels (a counts pass, a gather pass)
            two_pass = importlib.import_module("santa_kernels.triton_santa_flash2")
            kernel = two_pass.santa_flash_two_pass
            workspace = two_pass.two_pass_workspace(q, kv, S, tile, seed=seed)
        elif one_pass_compact:
            compact = importlib.import_module("santa_kernels.triton_santa_flash_compact")
            kernel = compact.santa_flash_compact
            workspace = compact.compact_workspace(q, kv, S, tile, seed=seed,
                                                  draw_tiles=draw_tiles)
        else:
            workspace = module.SantaWorkspace.for_inputs(q, kv, S, tile, seed=seed,
                                                         store_counts=flash,
                                                         stash_dtype=stash_dtype)
        kwargs: dict[str, Any] = {"tile": tile, "scale": scale, "workspace": workspace}
        if passes == 2 and gather is not None:
            kwargs["gather"] = gather
        if draw_tiles is not None:
            kwargs["draw_tiles"] = draw_tiles
        if not flash:  # santa-flash keeps no stash
            kwargs["stash_dtype"] = stash_dtype
        if alloc is not None:
            kwargs["alloc"] = alloc

        def run() -> torch.Tensor:
            return kernel(q, kv, S, **kwargs)[0]

        def reads():
            extra = {"return_counts": True} if flash else {}
            _, info = kernel(q, kv, S, **kwargs, **extra)
            return info.read_counts(kv.head_dim)

        trial_run(run, q, function)
        prepared = Prepared(run, nbytes_of(q, kv), {"num_splits": workspace.num_splits})
        prepared.reads = reads  # type: ignore[attr-defined]
        prepared.reset_rng = workspace.reset_rng  # type: ignore[attr-defined]
        return prepared

    prepare.__doc__ = f"Prepares the Triton kernel {function} (see triton_santa)."
    return prepare


def _triton_santapp():
    return importlib.import_module("santa_kernels.triton_santapp")


def santapp_kernel_available() -> tuple[bool, str]:
    """Returns whether the Triton SANTA++ kernels can run here, with the reason if not."""
    try:
        return _triton_santapp().santapp_triton_available()
    except Exception as exc:  # triton missing or broken
        return False, f"santa_kernels.triton_santapp not importable: {exc}"


_KMEANS_INDEX: dict[tuple, Any] = {}  # slow CPU k-means index, shared by cold-L2 input copies


def _santapp_packed(module, kv: KVCache, params: dict[str, Any]):
    """Returns ``(packed, index_build_ms)``. A k-means index (CPU, slow) is built once per
    cache content, since the cold-L2 input copies are clones; each copy packs its own K/V."""
    if params["policy"] == "contiguous":
        return module.time_index_build(kv, **params)
    params = dict(params)
    int8 = params.pop("reps", "model") == "int8"
    packed, build_ms = _kmeans_packed(module, kv, params)
    return (module.quantize_packed(packed) if int8 else packed), build_ms


def _kmeans_packed(module, kv: KVCache, params: dict[str, Any]):
    """:func:`_santapp_packed` for the k-means policy (the index cached by content)."""
    from santa_kernels.santapp import build_team_index

    fingerprint = (
        tuple(sorted(params.items())),
        tuple(kv.k.shape),
        kv.layout,
        tuple(kv.lengths.tolist()),
        float(kv.k.sum(dtype=torch.float64)),
        float(kv.v.sum(dtype=torch.float64)),
    )
    if fingerprint not in _KMEANS_INDEX:
        _KMEANS_INDEX.clear()
        started = time.perf_counter()
        index = build_team_index(kv, **params)
        packed = module.pack_teams(kv, index)
        if kv.k.is_cuda:
            torch.cuda.synchronize(kv.k.device)
        _KMEANS_INDEX[fingerprint] = (index, (time.perf_counter() - started) * 1e3)
        return packed, _KMEANS_INDEX[fingerprint][1]
    index, build_ms = _KMEANS_INDEX[fingerprint]
    return module.pack_teams(kv, index), build_ms


def merge_atomic_of(merge: str) -> bool | None:
    """The kernel's ``merge_atomic`` for the method's ``merge`` (None: its own choice)."""
    return {"auto": None, "atomic": True, "kernel": False}[merge]


def santapp_prepare(
    q: torch.Tensor,
    kv: KVCache,
    *,
    seed: int = 0,
    M: int,
    team_size: int = 16,
    leaders: int = 4,
    policy: str = "contiguous",
    scheme: str = "gumbel-topk",
    representative: str = "leader",
    mix: float = 0.0,
    sink: int = 0,
    window: int = 0,
    reps: str = "model",
    merge: str = "auto",
    scale: float | None = None,
) -> Prepared:
    """Prepares the Triton SANTA++ kernel: builds and packs the team index outside the timed
    region (its time goes to the ``index_build_ms`` metric), plans the workspace, runs once.
    Extra metrics: ``index_build_ms`` and, after ``reads()``, ``read_equivalent`` and
    ``bytes_read_tables`` (the representatives' bytes, counted in the bandwidth)."""
    module = _triton_santapp()
    try:
        module.check_scheme(scheme, mix)
    except ValueError as exc:
        raise Unsupported(str(exc)) from exc
    params = {
        "policy": policy,
        "team_size": team_size,
        "leaders": leaders,
        "representative": representative,
        "sink": sink,
        "exact_recent": window,
        "reps": reps,
    }
    try:
        packed, build_ms = _santapp_packed(module, kv, params)
        workspace = module.SantaPPWorkspace.for_inputs(q, kv, packed, M, seed=seed,
                                                       merge_atomic=merge_atomic_of(merge))

        def run() -> torch.Tensor:
            return module.santapp_decode(q, kv, packed, M, scale=scale, workspace=workspace)[0]

        _, info = module.santapp_decode(q, kv, packed, M, scale=scale, workspace=workspace)
        touched = info.bytes_moved(q)  # syncs; the cold-L2 copy count needs what is read
    except Exception as exc:
        raise Unsupported(f"santapp: {type(exc).__name__}: {exc}") from exc
    metrics: dict[str, tuple[float, str]] = {"index_build_ms": (build_ms, "ms")}

    def reads():
        _, info = module.santapp_decode(q, kv, packed, M, scale=scale, workspace=workspace)
        metrics["read_equivalent"] = (info.read_equivalent(), "ratio")
        counts = info.read_counts()
        # representatives (and log n, int8 scales): read every call besides the K/V rows
        metrics["bytes_read_tables"] = (
            info.bytes_moved(q) - counts.kv_bytes(packed.kv_itemsize)
            - 2 * q.numel() * q.element_size(), "B")
        return counts

    notes = {"plan": workspace.plan, "teams_read_from": packed.what_is_read()}
    # inputs_bytes = bytes one call reads (~10% of the cache), not the cache's size: the
    # timing core then rotates enough input copies for the reads themselves to miss L2
    prepared = Prepared(run, touched, notes)
    prepared.reads = reads  # type: ignore[attr-defined]
    prepared.reset_rng = workspace.reset_rng  # type: ignore[attr-defined]
    prepared.metrics = metrics  # type: ignore[attr-defined]
    return prepared


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

    trial_run(run, q, "bernoulli")
    prepared = Prepared(run, nbytes_of(q, kv), {"value_stage": value_stage})
    prepared.reads = reads  # type: ignore[attr-defined]
    prepared.reset_rng = call.reset_rng  # type: ignore[attr-defined]
    prepared.metrics = metrics  # type: ignore[attr-defined]
    return prepared


def baseline_prepare(name: str) -> PrepareFn:
    """Returns the adapter of the dense baseline ``name`` (seed ignored: it is exact)."""

    def prepare(q: torch.Tensor, kv: KVCache, *, seed: int = 0, **params: Any) -> Prepared:
        return BASELINES[name].prepare(q, kv, **params)

    return prepare
