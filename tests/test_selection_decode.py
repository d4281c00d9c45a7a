"""The selection methods in the accuracy runs' decode engine: the GPU path's code (the
selection on the device, the indexed Triton kernel, Quest's bounds built after the
prefill and extended every step) through Triton's interpreter, against the references."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are imported

import pytest
from test_engine import prompts

from conftest import tiny_llama
from santa_bench.accuracy.engine import Engine, Prompt
from santa_bench.methods import REGISTRY

pytest.importorskip("transformers")


def _interpreted() -> bool:
    from santa_kernels import triton_indexed as ti

    return ti.indexed_available() == (True, "interpreter")


@pytest.mark.parametrize("spec", [("oracle-topk", {"k": 8}), ("quest", {"page": 4, "pages": 3}),
                                  ("vattention", {"sink": 4, "window": 4, "topk": 4,
                                                  "epsilon": 0.3, "delta": 0.3}),
                                  ("topk-santa", {"k": 4, "S": 8})])
def test_selection_methods_decode_through_their_kernels(spec):
    if not _interpreted():
        pytest.skip("the Triton kernels were imported without TRITON_INTERPRET=1")
    name, overrides = spec
    method = REGISTRY.get(name)
    params = method.resolve_params(overrides)
    engine = Engine(tiny_llama(layers=2), device="cpu", batch=2)
    batch = [Prompt(p.ids, 4) for p in prompts(2)]
    fast = engine.generate(method, params, batch, seed=0, backend="triton")
    assert all(1 <= len(t) <= 4 for t in fast.tokens)
    assert fast.kv_read_fraction and all(0 < f <= 1 for f in fast.kv_read_fraction)
    if name in ("oracle-topk", "quest"):  # deterministic: the reference's tokens
        reference = engine.generate(method, params, batch, seed=0, backend="reference")
        assert fast.tokens == reference.tokens
