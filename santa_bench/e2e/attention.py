"""Decode-attention backends for the end-to-end loop, looked up through the registry.

The backend interface (:class:`DecodeAttention`) and the dense backends live in
:mod:`santa_bench.decode`; a sampled method's GPU backend is its own (the method's
``e2e_backend``, defined in its family module under ``santa_bench/methods/``): SANTA's
Triton kernels (one workspace shared by all layers; its device step counter gives fresh
numbers per step and layer, graph replays included), SANTA++'s (teams indexed after the
prefill), Bernoulli qK^T's Triton stage and value kernel, the selection methods' fast
path. On a CPU a method decodes through its PyTorch reference (:class:`ReferenceDecode`,
a fresh seed per call).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from santa_bench.baselines import Unsupported
from santa_bench.decode.base import DecodeAttention, LayerRouting
from santa_bench.decode.dense import (
    CPU_AUTO_DENSE,
    DENSE_BACKENDS,
    GPU_AUTO_DENSE,
    FlashAttnDecode,
    FlashInferDecode,
    SdpaDecode,
    TritonSplitKVDecode,
    dense_backend,
)
from santa_bench.e2e.cache import StaticKVCache
from santa_bench.methods import REGISTRY, Method

__all__ = [
    "CPU_AUTO_DENSE",
    "DENSE_BACKENDS",
    "GPU_AUTO_DENSE",
    "KERNEL_METHODS",
    "DecodeAttention",
    "FlashAttnDecode",
    "FlashInferDecode",
    "LayerRouting",
    "ReferenceDecode",
    "SdpaDecode",
    "TritonSplitKVDecode",
    "backend_label",
    "dense_backend",
    "method_backend",
]

# every registered method with a Triton decode backend (its ``e2e_backend``; see
# :func:`method_backend`)
KERNEL_METHODS = frozenset(m.name for m in REGISTRY if m.has_e2e_kernel)


class ReferenceDecode(DecodeAttention):
    """The method's exact PyTorch reference (CPU runs).

    Without ``row_seeds`` the batch is one call with a fresh seed per call. With
    ``row_seeds`` each sequence is its own call: call ``c`` (one per layer and step) of
    sequence ``b`` uses ``seed + row_seeds[b] + 1_000_003 * c``, so a sequence decodes
    alike in any batch. A method with a ``prefill_index`` (SANTA++: its teams) indexes
    each layer's prompt once after the prefill and runs its ``indexed_reference``;
    decode tokens stay exact. Where the method also has ``stack_indexes`` (its randomness
    is all in the per-sequence indexes), one call per layer and step serves the whole
    batch. ``reads`` collects every call's KV read fraction, one per sequence.
    """

    graph_safe = False

    def __init__(self, method: Method, params: dict[str, Any], scale: float, seed: int,
                 row_seeds: Sequence[int] | None = None) -> None:
        self.method, self.params, self.scale, self.seed = method, dict(params), scale, seed
        self.row_seeds = None if row_seeds is None else list(row_seeds)
        self.name = "reference"
        self.calls = 0
        self.indexes: list[Any] = []  # per layer: one index, or one per sequence
        self.stacked = False  # one index per layer over the batch's sequences
        self.reads: list[float] = []

    def _rows(self, layer: int) -> list[tuple[Any, int]]:
        """``(kv, seed offset)`` per call unit: the batch, or each sequence."""
        if self.row_seeds is None:
            return [(self.cache.layers[layer], 0)]
        from santa_kernels import KVCache

        k, v = self.cache.k[layer], self.cache.v[layer]
        return [(KVCache.contiguous(k[b : b + 1, :n], v[b : b + 1, :n]), self.row_seeds[b])
                for b, n in enumerate(self.cache.lengths.tolist())]

    def after_prefill(self, cache: StaticKVCache) -> None:
        build = self.method.prefill_index
        if build is None:
            return
        stack = self.method.stack_indexes if self.row_seeds is not None else None
        self.stacked = stack is not None
        self.indexes = []
        for layer in range(cache.num_layers):
            indexes = [build(kv, self.params, self.seed + offset)
                       for kv, offset in self._rows(layer)]
            self.indexes.append([stack(indexes)] if stack is not None else indexes)

    def reset(self) -> None:
        self.calls = 0
        self.reads = []

    def __call__(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        call = self.calls
        self.calls += 1
        if self.stacked:
            assert self.method.indexed_reference is not None
            result = self.method.indexed_reference(q, self.cache.layers[layer],
                                                   self.indexes[layer][0], self.params,
                                                   scale=self.scale, seed=self.seed + call)
            self.reads.extend(_per_sequence_fractions(result.reads))
            return result.out.to(q.dtype)
        units = self._rows(layer)
        queries = [q] if self.row_seeds is None else list(q.split(1))
        outs = []
        for unit, ((kv, offset), qu) in enumerate(zip(units, queries, strict=True)):
            seed = (self.seed + call if self.row_seeds is None
                    else self.seed + offset + 1_000_003 * call)
            if self.method.prefill_index is not None:
                assert self.method.indexed_reference is not None
                result = self.method.indexed_reference(qu, kv, self.indexes[layer][unit],
                                                       self.params, scale=self.scale,
                                                       seed=seed)
            else:
                result = self.method.run_reference(qu, kv, self.params, seed=seed,
                                                   scale=self.scale)
            if getattr(result, "reads", None) is not None:
                self.reads.append(float(result.reads.kv_read_fraction))
            outs.append(result.out.to(q.dtype))
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=0)


def _per_sequence_fractions(reads: Any) -> list[float]:
    """Each sequence's KV read fraction of a batched call's read counts."""
    d, hkv = reads.head_dim, reads.k_rows.shape[1]
    read = reads.k_features.sum(dim=1) + reads.v_rows.sum(dim=1) * d
    return (read / (2 * reads.context * hkv * d)).tolist()



def method_backend(
    method: Method, params: dict[str, Any], *, device: str, scale: float, seed: int
) -> DecodeAttention:
    """Returns the backend of a sampled method: its kernel on a GPU (the method's
    ``e2e_backend``), its reference on a CPU."""
    if device != "cuda":
        return ReferenceDecode(method, params, scale, seed)
    backend = method.e2e_backend(method, params, scale, seed) if method.e2e_backend else None
    if backend is None:
        raise Unsupported(f"{method.name}: no GPU kernel for end-to-end decode (reference only)")
    return backend


def backend_label(method: Method, device: str) -> str:
    """Returns the ``backend`` recorded for a sampled method on ``device``: its Triton
    kernel on a GPU, else its PyTorch reference (a GPU run of that is skipped)."""
    return "triton" if device == "cuda" and method.has_e2e_kernel else "reference"
