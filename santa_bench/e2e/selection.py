"""The selection methods' decode backend (``oracle-topk``, ``quest``, ``vattention``,
``topk-santa``): one fast-path step of ``santa_kernels.triton_selection`` serves every
layer (its buffers and workspace shared, its device step counter advanced per call);
Quest's page bounds are per layer, computed from the prompt after the prefill and
extended by each decode step with the new token's key."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from santa_bench.baselines import Unsupported
from santa_bench.e2e.attention import DecodeAttention
from santa_bench.e2e.cache import StaticKVCache


class SelectionDecode(DecodeAttention):
    """A selection method's fast path in every layer (CUDA-graph capturable)."""

    def __init__(self, method: str, build: Callable[..., Any], params: dict[str, Any],
                 scale: float, seed: int) -> None:
        self.method, self.build, self.params = method, build, dict(params)
        self.scale, self.seed = scale, seed
        self.name = "triton"

    def setup(self, cache: StaticKVCache, q: torch.Tensor) -> None:
        super().setup(cache, q)
        from santa_bench.methods.selection import selection_kernel_available

        ok, why = selection_kernel_available()
        if not ok:
            raise Unsupported(why)
        try:
            self.step = self.build(q, cache.layers[0], self.params, self.scale, self.seed,
                                   num_layers=cache.num_layers)
        except ValueError as exc:
            raise Unsupported(f"{self.method}: {exc}") from exc

    def after_prefill(self, cache: StaticKVCache) -> None:
        if hasattr(self.step, "build"):
            for layer, kv in enumerate(cache.layers):
                self.step.build(kv, layer)

    def reset(self) -> None:
        self.step.reset_rng(0)

    def __call__(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        return self.step(q, self.cache.layers[layer], layer=layer)

    def read_fraction(self, layer: int, q: torch.Tensor) -> float:
        """The KV read fraction of one more call on ``q`` (off the hot path)."""
        kv = self.cache.layers[layer]
        reads = (self.step.read_counts(q, kv, layer) if hasattr(self.step, "build")
                 else self.step.read_counts(q, kv))
        return float(reads.kv_read_fraction)
