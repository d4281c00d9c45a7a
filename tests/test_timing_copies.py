"""The kernel adapters' ``rebind``: timing copies over other inputs share one workspace and
random state (as the layers of a decode step do); ``per-copy`` prepares each anew.

Run on the CPU through Triton's interpreter (tiny shapes)."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

import santa_kernels as sk
from santa_bench.baselines import clone_kv
from santa_bench.baselines import get as get_baseline
from santa_bench.methods import REGISTRY
from santa_bench.runners.kernel import input_copier
from santa_kernels.triton_santa import santa_triton_available

pytestmark = [
    pytest.mark.skipif(not santa_triton_available()[0], reason="no Triton backend"),
    pytest.mark.skipif(
        os.environ.get("TRITON_INTERPRET", "0") != "1" and torch.cuda.is_available(),
        reason="CPU tensors: run with TRITON_INTERPRET=1",
    ),
]


def _inputs(seed: int = 0, n: int = 96):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, 4, 64, generator=gen) * 2
    k, v = torch.randn(2, 1, n, 2, 64, generator=gen)
    return q, sk.KVCache.contiguous(k, v)


@pytest.mark.parametrize(("name", "params"), [
    ("santa-prop", {"S": 8, "tile": 16}),
    ("santa-iid", {"S": 8}),
    ("bernoulli", {"S": 8, "tile": 16, "value_stage": "prop"}),
])
def test_a_rebound_copy_shares_the_workspace_and_random_state(name, params):
    method = REGISTRY.get(name)
    params = method.resolve_params(params)
    q, kv = _inputs()
    prepared = method.prepare(q, kv, seed=3, **params)
    shared = input_copier(method, prepared, q, kv, 3, params, "shared")(1)
    own = input_copier(method, prepared, q, kv, 3, params, "per-copy")(1)
    # the copy's own storage, the original's workspace: the same output buffer
    assert shared().data_ptr() == prepared().data_ptr() != own().data_ptr()
    prepared.reset_rng(0)
    first = prepared().clone()
    prepared.reset_rng(0)  # the shared step counter: the copy draws what the original drew
    assert torch.equal(shared(), first)
    own.reset_rng(0)  # its own workspace, seeded 3 + 1: other draws
    assert not torch.equal(own(), first)


def test_a_rebound_dense_copy_computes_over_its_own_inputs():
    prepared = get_baseline("triton-splitkv").prepare(*_inputs(0))
    other_q, other_kv = _inputs(1)
    assert prepared.rebind is not None
    copy = prepared.rebind(other_q, other_kv)
    expected = sk.dense_attention(other_q, other_kv, compute_dtype=torch.float64).out
    torch.testing.assert_close(copy().double(), expected, rtol=1e-4, atol=1e-5)
    assert copy().data_ptr() == prepared().data_ptr()  # one output buffer, one workspace


def test_a_rebound_santapp_copy_indexes_its_own_cache():
    method = REGISTRY.get("santapp")
    params = method.resolve_params({"M": 4, "team_size": 8})
    q, kv = _inputs(n=128)
    prepared = method.prepare(q, kv, seed=0, **params)
    copy = prepared.rebind(q.clone(), clone_kv(kv))
    assert copy().data_ptr() == prepared().data_ptr()  # the plan matches: one workspace
    prepared.reset_rng(0)
    first = prepared().clone()
    prepared.reset_rng(0)
    torch.testing.assert_close(copy(), first)
