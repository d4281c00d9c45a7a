"""The decode-attention backend interface, and the per-layer router.

A backend is set up once per decode run (:meth:`DecodeAttention.setup`: workspaces,
plans, compilation by one trial call), may build per-cache state after the prefill
(:meth:`after_prefill`, e.g. a SANTA++ team index), may do host-side work before a
step (:meth:`before_step`: FlashInfer's ``plan()``, never a device sync) and is then
called as ``backend(layer, q)`` inside the step (CUDA-graph capturable when
``graph_safe``): ``q [B, Hq, d]`` -> ``[B, Hq, d]`` over the layer's cache, whose
lengths already count the new token. Outputs may be views of a buffer shared by all
layers: the caller consumes each one before the next call.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from santa_bench.e2e.cache import StaticKVCache


class DecodeAttention:
    """Base class: a decode-attention backend over a :class:`StaticKVCache`."""

    name = "attention"
    graph_safe = True  # no host sync or host-side state in __call__
    # the kernels around each call launch as programmatic dependents (the gemm rest on a
    # GPU with PDL): a Triton backend may then launch its first kernel as one too and let
    # the next launch early (set by the loop through :meth:`set_pdl_chain`)
    pdl_chain = False

    def set_pdl_chain(self, on: bool) -> None:
        """Tells the backend whether the step's kernels around it form a PDL chain."""
        self.pdl_chain = on

    def setup(self, cache: StaticKVCache, q: torch.Tensor) -> None:
        """Allocates and compiles for ``cache`` and queries shaped like ``q``."""
        self.cache = cache

    def after_prefill(self, cache: StaticKVCache) -> None:
        """Builds per-cache state once the prompt is in the cache (default: nothing)."""

    def reset(self) -> None:
        """Returns random state to its start (a decode run replays exactly)."""

    def before_step(self, lengths: Sequence[int]) -> None:
        """Host-side work before a step whose sequences attend to ``lengths`` tokens."""

    def __call__(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError



class LayerRouting(DecodeAttention):
    """Routes each layer to the method's backend, or to an exact one for ``exempt`` layers."""

    def __init__(
        self, main: DecodeAttention, exempt: DecodeAttention | None = None,
        exempt_layers: Sequence[int] = (),
    ) -> None:
        self.main, self.exempt = main, exempt
        self.exempt_layers = frozenset(exempt_layers)
        if self.exempt_layers and exempt is None:
            raise ValueError("exempt layers need an exact backend")
        self.backends = [main] + ([exempt] if exempt is not None and self.exempt_layers else [])
        self.graph_safe = all(b.graph_safe for b in self.backends)
        self.name = main.name

    def setup(self, cache: StaticKVCache, q: torch.Tensor) -> None:
        for backend in self.backends:
            backend.setup(cache, q)

    def after_prefill(self, cache: StaticKVCache) -> None:
        for backend in self.backends:
            backend.after_prefill(cache)

    def reset(self) -> None:
        for backend in self.backends:
            backend.reset()

    def before_step(self, lengths: Sequence[int]) -> None:
        for backend in self.backends:
            backend.before_step(lengths)

    def set_pdl_chain(self, on: bool) -> None:
        super().set_pdl_chain(on)
        for backend in self.backends:
            backend.set_pdl_chain(on)

    def __call__(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        if layer in self.exempt_layers:
            assert self.exempt is not None
            return self.exempt(layer, q)
        return self.main(layer, q)
