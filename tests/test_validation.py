"""Invalid input raises a clear error that names the offending argument."""

from __future__ import annotations

import pytest
import torch

import santa_kernels as sk
from conftest import decode_problem
from santa_kernels import InputError


@pytest.fixture
def problem():
    return decode_problem(batch=2, heads=4, kv_heads=2, n=32, d=8, dtype=torch.float32)


def test_input_error_is_a_value_error():
    assert issubclass(InputError, ValueError)


@pytest.mark.parametrize(
    ("make_q", "match"),
    [
        (lambda q: q[0], r"^q: expected shape \[B, Hq, d\]"),
        (lambda q: q[:1], r"^q: batch 1 does not match"),
        (lambda q: q[:, :3], r"^q: 3 query heads is not a multiple of the 2 KV heads"),
        (lambda q: q[..., :4], r"^q: head dim 4 does not match"),
        (lambda q: q.to(torch.int32), r"^q: unsupported dtype"),
        (lambda q: q.index_fill(0, torch.tensor([1]), float("nan")), r"^q: contains NaN or inf"),
        (lambda q: q.index_fill(0, torch.tensor([0]), float("inf")), r"^q: contains NaN or inf"),
    ],
)
def test_bad_query(problem, make_q, match):
    q, kv = problem
    with pytest.raises(InputError, match=match):
        sk.attention(make_q(q), kv)


def test_bad_cache_tensors():
    k = torch.randn(1, 16, 2, 8)
    with pytest.raises(InputError, match=r"^k: expected 4 dimensions"):
        sk.KVCache.contiguous(k[0], k[0])
    with pytest.raises(InputError, match=r"^v: shape .* does not match k"):
        sk.KVCache.contiguous(k, k[:, :8])
    with pytest.raises(InputError, match=r"^v: dtype .* does not match k"):
        sk.KVCache.contiguous(k, k.double())
    with pytest.raises(InputError, match=r"^k: unsupported dtype"):
        sk.KVCache.contiguous(k.to(torch.int8), k.to(torch.int8))
    bad = k.clone()
    bad[0, 3, 1, 2] = float("nan")
    with pytest.raises(InputError, match=r"^v: contains NaN or inf"):
        sk.KVCache.contiguous(k, bad)
    with pytest.raises(InputError, match=r"^lengths: every length must be in 1..16"):
        sk.KVCache.contiguous(k, k, torch.tensor([17]))
    with pytest.raises(InputError, match=r"^lengths: every length must be in 1..16"):
        sk.KVCache.contiguous(k, k, torch.tensor([0]))
    with pytest.raises(InputError, match=r"^lengths: expected a 1-D tensor of 1"):
        sk.KVCache.contiguous(k, k, torch.tensor([3, 4]))


def test_bad_page_table():
    pages = torch.randn(4, 8, 2, 8)
    with pytest.raises(InputError, match=r"^page_table: expected a 2-D int32/int64"):
        sk.KVCache.paged(pages, pages, torch.zeros(4, dtype=torch.int32), torch.tensor([8]))
    with pytest.raises(InputError, match=r"^page_table: sequence 0 points outside the page pool"):
        sk.KVCache.paged(
            pages, pages, torch.tensor([[0, 9]], dtype=torch.int32), torch.tensor([16])
        )
    with pytest.raises(InputError, match=r"^page_size: must be > 0"):
        sk.KVCache.contiguous(pages, pages).to_paged(0)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"value": "sys", "S": 0}, r"^S: must be > 0"),
        ({"value": "sys", "S": -4}, r"^S: must be > 0"),
        ({"value": "iid"}, r"^S: value stage 'iid' needs a sample budget S"),
        ({"value": "sys", "S": 2.5}, r"^S: expected an integer"),
        ({"value": "flash", "S": 8, "tile": 0}, r"^tile: must be > 0"),
        ({"value": "prop", "S": 8, "alloc": "round"}, r"^alloc: expected one of"),
        ({"value": "median"}, r"^value: expected one of"),
        ({"score": "approx"}, r"^score: expected one of"),
        ({"score": "bernoulli", "draws": 0}, r"^draws: must be > 0"),
        ({"score": "bernoulli", "grouping": "union"}, r"^grouping: expected one of"),
        ({"scale": -1.0}, r"^scale: must be a positive number"),
        ({"seed": "seven"}, r"^seed: expected an integer"),
        ({"generator": 3}, r"^generator: expected a torch.Generator"),
        ({"min_ctx": -1}, r"^min_ctx: expected an integer >= 0"),
        ({"compute_dtype": torch.float16}, r"^compute_dtype: expected float32 or float64"),
    ],
)
def test_bad_method_arguments(problem, kwargs, match):
    q, kv = problem
    with pytest.raises(InputError, match=match):
        sk.attention(q, kv, **kwargs)


def test_kv_must_be_a_cache(problem):
    q, kv = problem
    with pytest.raises(InputError, match=r"^kv: expected a santa_kernels.KVCache"):
        sk.attention(q, kv.k)
