"""Dense exact decode-attention baselines: SDPA, FlashInfer, FlashAttention, Triton split-KV.

Every backend is an object with ``available(device) -> (ok, reason)`` and
``prepare(q, kv, *, scale=None, **params) -> Prepared``. ``prepare`` does all setup
(layout conversion, allocation, FlashInfer's ``plan()``, one trial call that surfaces
unsupported inputs and compiles JIT kernels) outside the returned callable, which only
computes the ``[B, Hq, d]`` output. ``BASELINES`` names them; entries resolve their
implementation lazily (``"module:object"``), so importing this package imports neither
FlashInfer nor flash-attn.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from santa_bench.timing import nbytes_of
from santa_kernels.kv import KVCache


class Unsupported(RuntimeError):
    """A backend cannot run these inputs here; the message is the reason to record."""


@dataclass
class Prepared:
    """A no-argument callable computing ``[B, Hq, d]``, with what its setup did.

    ``inputs_bytes`` counts the tensors the call is given (q and the cache, or the copy
    it was converted to): the memory of one input copy for ``timing.measure``.
    ``notes`` records conversions done outside the timed region (layout, masks, pages).
    ``rebind(q, kv)``, where set, returns the same call over other inputs of the same
    shape, sharing this one's workspace and random state (the timing copies share them
    as the layers of a decode step do); None: prepare each copy anew.
    """

    run: Callable[[], torch.Tensor]
    inputs_bytes: int
    notes: dict[str, Any] = field(default_factory=dict)
    rebind: Callable[[torch.Tensor, KVCache], Prepared] | None = None

    def __call__(self) -> torch.Tensor:
        return self.run()


class Backend(Protocol):
    def available(self, device: torch.device) -> tuple[bool, str]: ...

    def prepare(
        self, q: torch.Tensor, kv: KVCache, *, scale: float | None = None, **params: Any
    ) -> Prepared: ...


def _resolve(target: str) -> Any:
    """The object of ``"module:object"`` (imports the module on first use)."""
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


@dataclass(frozen=True)
class Baseline:
    """One registry entry: name, description, parameter defaults, lazy implementations.

    ``target``: the kernel the harness times (``"module:object"`` with available() and
    prepare(); None: the baseline only decodes). ``decode``: its end-to-end decode backend
    (``"module:callable"``, called as ``callable(scale, **decode_args)`` to make a
    ``santa_bench.e2e.attention.DecodeAttention``; None: timed only).
    """

    name: str
    description: str
    params: Mapping[str, Any]
    target: str | None = None
    decode: str | None = None
    decode_args: Mapping[str, Any] = field(default_factory=dict)

    @property
    def timed(self) -> bool:
        """Whether `santa-bench kernel` times it (a method of the registry's baseline family)."""
        return self.target is not None

    def backend(self) -> Backend:
        """Returns the implementation object (imports its module on first use)."""
        if self.target is None:
            raise Unsupported(f"{self.name}: an end-to-end decode backend only, no timed kernel")
        return _resolve(self.target)

    def decode_backend(self, scale: float) -> Any:
        """Returns a new end-to-end decode backend of the baseline at softmax ``scale``."""
        if self.decode is None:
            raise ValueError(f"{self.name}: no end-to-end decode backend; known: "
                             f"{', '.join(decode_names())}")
        return _resolve(self.decode)(scale, **self.decode_args)

    def available(self, device: torch.device | str = "cuda") -> tuple[bool, str]:
        """Returns ``(True, "")`` or ``(False, reason)`` for ``device``."""
        try:
            return self.backend().available(torch.device(device))
        except Exception as exc:  # an optional dependency failing to probe
            return False, f"{self.name}: availability check failed: {type(exc).__name__}: {exc}"

    def resolve_params(self, overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Returns the defaults updated with ``overrides``; unknown names raise ValueError."""
        overrides = dict(overrides or {})
        unknown = sorted(set(overrides) - set(self.params))
        if unknown:
            raise ValueError(
                f"{self.name}: unknown parameter(s) {unknown}; accepted: {sorted(self.params)}"
            )
        return {**self.params, **overrides}

    def prepare(
        self, q: torch.Tensor, kv: KVCache, *, scale: float | None = None, **params: Any
    ) -> Prepared:
        """Returns the prepared call; raises Unsupported (with the reason) when it can't run."""
        resolved = self.resolve_params(params)
        ok, reason = self.available(q.device)
        if not ok:
            raise Unsupported(reason)
        prepared = self.backend().prepare(q, kv, scale=scale, **resolved)
        prepared.notes.setdefault("baseline", self.name)
        prepared.notes.setdefault("params", resolved)
        return prepared

    def copier(
        self, q: torch.Tensor, kv: KVCache, *, scale: float | None = None, **params: Any
    ) -> Callable[[int], Prepared]:
        """Returns ``make_copy(i)`` for ``timing.measure``: fresh q/K/V copies, prepared."""

        def make_copy(_index: int) -> Prepared:
            return self.prepare(q.clone(), clone_kv(kv), scale=scale, **params)

        return make_copy


def trial_run(run: Callable[[], Any], q: torch.Tensor, label: str) -> None:
    """One untimed call (compiles the kernels); a failure makes the case Unsupported."""
    try:
        run()
        if q.is_cuda:
            torch.cuda.synchronize(q.device)
    except Exception as exc:
        raise Unsupported(f"{label}: {type(exc).__name__}: {exc}") from exc


def clone_kv(kv: KVCache) -> KVCache:
    """Returns ``kv`` with its K and V storage copied (page table and lengths shared)."""
    return dataclasses.replace(kv, k=kv.k.clone(), v=kv.v.clone())


def check_decode_inputs(q: torch.Tensor, kv: KVCache) -> int:
    """Checks ``q [B, Hq, d]`` against ``kv``; returns the GQA group size."""
    from santa_kernels.validate import check_query

    if not isinstance(kv, KVCache):
        raise TypeError(f"kv: expected a santa_kernels.KVCache, got {type(kv).__name__}")
    return check_query(q, kv.batch, kv.num_kv_heads, kv.head_dim)


HALF_DTYPES = (torch.float16, torch.bfloat16)


def check_half_precision_backend(backend: Backend, name: str, q: torch.Tensor, kv: KVCache) -> None:
    """Raises Unsupported unless ``backend`` runs here on fp16/bf16 ``q`` and K/V of one dtype."""
    ok, why = backend.available(q.device)
    if not ok:
        raise Unsupported(why)
    check_decode_inputs(q, kv)
    if q.dtype not in HALF_DTYPES or kv.dtype != q.dtype:
        raise Unsupported(
            f"{name}: needs fp16/bf16 q and K/V of one dtype, got {q.dtype}/{kv.dtype}"
        )


class _TritonSplitKV:
    """The suite's own FlashDecoding (``santa_kernels.triton_splitkv``), imported lazily."""

    def _module(self) -> Any:
        return importlib.import_module("santa_kernels.triton_splitkv")

    def available(self, device: torch.device) -> tuple[bool, str]:
        try:
            module = self._module()
        except Exception as exc:
            return False, f"triton-splitkv: santa_kernels.triton_splitkv not importable: {exc}"
        result = module.splitkv_available()  # (True, "cuda" | "interpreter") or (False, why)
        ok, how = (result[0], result[1]) if isinstance(result, tuple) else (result, "")
        if not ok:
            return False, f"triton-splitkv: {how or 'unavailable'}"
        if how == "cuda" and device.type != "cuda":
            return False, "triton-splitkv: runs on CUDA tensors (or set TRITON_INTERPRET=1)"
        return True, ""

    def prepare(
        self,
        q: torch.Tensor,
        kv: KVCache,
        *,
        scale: float | None = None,
        num_splits: int | None = None,
    ) -> Prepared:
        check_decode_inputs(q, kv)
        module = self._module()
        splitkv_decode = module.splitkv_decode
        workspace = module.SplitKVWorkspace.for_inputs(q, kv, num_splits)
        out = torch.empty_like(q)

        def bind(q: torch.Tensor, kv: KVCache) -> Prepared:
            def run() -> torch.Tensor:
                return splitkv_decode(
                    q, kv, scale=scale, num_splits=num_splits, out=out, workspace=workspace
                )

            return Prepared(run, nbytes_of(q, kv), notes, rebind=bind)

        notes = {
            "num_splits": num_splits,
            "workspace_splits": workspace.num_splits,
            "mode": module.splitkv_available()[1],
        }
        prepared = bind(q, kv)
        trial_run(prepared.run, q, "triton-splitkv")
        return prepared


TRITON_SPLITKV = _TritonSplitKV()

E2E = "santa_bench.decode.dense"  # the module of the dense decode backends

# One registry for timing and decoding: the kernels `santa-bench kernel` times (methods of
# the baseline family) and the dense backends `santa-bench e2e` decodes with
# (``--dense-backends``), one entry where a baseline does both.
BASELINES: dict[str, Baseline] = {
    b.name: b
    for b in (
        Baseline(
            "sdpa",
            "torch SDPA over the whole static cache with a length mask, the GQA group as "
            "query rows (what a plain PyTorch decoder does; end-to-end decode only)",
            {},
            decode=f"{E2E}:SdpaDecode",
        ),
        Baseline(
            "sdpa-math",
            "PyTorch SDPA, math backend (any device; materialises scores; GQA by expansion)",
            {},
            "santa_bench.baselines.sdpa:MATH",
        ),
        Baseline(
            "sdpa-flash",
            "PyTorch SDPA, FlashAttention-2 backend with its split-KV heuristic (CUDA)",
            {},
            "santa_bench.baselines.sdpa:FLASH",
        ),
        Baseline(
            "sdpa-cudnn",
            "PyTorch SDPA, cuDNN fused attention backend (CUDA)",
            {},
            "santa_bench.baselines.sdpa:CUDNN",
        ),
        Baseline(
            "flashinfer-tc",
            "FlashInfer BatchDecodeWithPagedKVCacheWrapper, tensor-core path (NHD pages)",
            {"page_size": 16},
            "santa_bench.baselines.flashinfer:TENSOR_CORE",
            f"{E2E}:FlashInferDecode",
            {"use_tensor_cores": True},
        ),
        Baseline(
            "flashinfer-cuda",
            "FlashInfer BatchDecodeWithPagedKVCacheWrapper, CUDA-core path (NHD pages)",
            {"page_size": 16},
            "santa_bench.baselines.flashinfer:CUDA_CORE",
            f"{E2E}:FlashInferDecode",
            {"use_tensor_cores": False},
        ),
        Baseline(
            "flashinfer-fa3",
            "FlashInfer's FlashAttention-3 kernel (Hopper only): the decode wrapper with "
            "backend=fa3 (NHD pages; no split over the context)",
            {"page_size": 16},
            "santa_bench.baselines.flashinfer:FA3",
            f"{E2E}:FlashInferDecode",
            {"use_tensor_cores": True, "backend": "fa3"},
        ),
        Baseline(
            "flash-attn",
            "flash_attn_with_kvcache: num_splits=1 FlashAttention, 0 FlashDecoding heuristic",
            {"num_splits": 0, "page_size": 0},
            "santa_bench.baselines.flash_attn:FLASH_ATTN",
            f"{E2E}:FlashAttnDecode",
        ),
        Baseline(
            "triton-splitkv",
            "the suite's FlashDecoding in Triton (same skeleton as the SANTA kernels)",
            {"num_splits": None},
            "santa_bench.baselines:TRITON_SPLITKV",
            f"{E2E}:TritonSplitKVDecode",
        ),
    )
}


def register_baseline(entry: Baseline) -> Baseline:
    """Adds ``entry`` to :data:`BASELINES` (a name registered twice raises ValueError).
    A timed baseline becomes a method too through
    :func:`santa_bench.methods.register_baseline`, the call a plugin makes."""
    if entry.name in BASELINES:
        raise ValueError(f"baseline {entry.name!r} registered twice")
    BASELINES[entry.name] = entry
    return entry


def decode_names() -> list[str]:
    """The baselines with an end-to-end decode backend (``--dense-backends``), in order."""
    return [b.name for b in BASELINES.values() if b.decode is not None]


def get(name: str) -> Baseline:
    """Returns the baseline called ``name``; unknown names raise KeyError listing them all."""
    try:
        return BASELINES[name]
    except KeyError:
        raise KeyError(f"unknown baseline {name!r}; known: {sorted(BASELINES)}") from None


__all__ = [
    "BASELINES",
    "Backend",
    "Baseline",
    "Prepared",
    "Unsupported",
    "check_decode_inputs",
    "clone_kv",
    "decode_names",
    "get",
    "register_baseline",
]
