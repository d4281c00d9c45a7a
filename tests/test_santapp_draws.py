"""Tests of SANTA++'s GQA draws (``draw=head|pooled|union``, docs/algorithms.md section 6).

``pooled``: one draw of ``M`` teams per KV head from the heads' mean probabilities;
``union``: each head's own draw, every head weighting the group's union by its inclusion
probability. Both keep the HT/HH sums unbiased; fixed seeds, z-tests over many draws.
"""

from __future__ import annotations

import pytest
import torch

import santa_kernels as sk
from conftest import decode_problem, dense_num_den, load_script
from santa_bench.baselines import Unsupported
from santa_bench.fidelity import seed_statistics
from santa_bench.labels import config_key
from santa_bench.methods import REGISTRY
from santa_bench.methods.santapp import TritonSantaPPDecode, santapp_prepare
from santa_kernels.santapp import build_team_index, santapp_attention

F64 = torch.float64
Z_BOUND = 4.0  # |mean - expected| / SE


pytestmark = pytest.mark.usefixtures("one_thread")


def _problem(n: int = 203, seed: int = 2):
    # GQA group 4 (8 query / 2 KV heads); 13 teams of 16, the last of 11 tokens
    q, kv = decode_problem(batch=1, heads=8, kv_heads=2, n=n, q_scale=1.5, seed=seed)
    return q, kv, build_team_index(kv, team_size=16, sink=0, exact_recent=0)


@pytest.mark.parametrize("draw", ["pooled", "union"])
@pytest.mark.parametrize(("scheme", "mix"),
                         [("gumbel-topk", 0.0), ("gumbel-topk", 0.2), ("multinomial", 0.0)])
def test_num_and_den_are_unbiased(draw, scheme, mix):
    q, kv, index = _problem()
    exact, top = dense_num_den(q, kv)

    def one(seed: int) -> torch.Tensor:
        out = santapp_attention(q, kv, index, 4, scheme=scheme, mix=mix, seed=seed, draw=draw,
                                compute_dtype=F64, sink=0, window=0)
        rescale = torch.exp(out.shift - top)[..., None]
        return torch.cat([out.num * rescale, out.den[..., None] * rescale], dim=-1)

    stats = seed_statistics(one, exact, seeds=500)
    assert stats.max_abs_z < Z_BOUND, stats.as_metrics()
    assert stats.rel_bias < 0.25 * stats.rel_rmse


@pytest.mark.parametrize("draw", ["pooled", "union"])
@pytest.mark.parametrize("scheme", ["gumbel-topk", "multinomial"])
def test_inclusion_probabilities_lie_in_zero_one(draw, scheme):
    q, kv, index = _problem()
    for seed in range(20):
        out = santapp_attention(q, kv, index, 3, scheme=scheme, draw=draw, seed=seed,
                                compute_dtype=F64, sink=0, window=0)
        w = out.team_weights
        chosen = w > 0
        assert chosen.any() and torch.all(torch.isfinite(w))
        if scheme == "gumbel-topk":  # w = 1 / pi with pi in (0, 1]
            assert torch.all(w[chosen] >= 1)
        # every head of a KV head weights the same teams alike
        by_kv = w.reshape(1, 2, 4, -1)
        assert torch.equal(by_kv, by_kv[:, :, :1].expand_as(by_kv))


@pytest.mark.parametrize("draw", ["pooled", "union"])
def test_M_at_the_team_count_is_exact(draw):
    q, kv, index = _problem()
    dense = sk.dense_attention(q, kv, compute_dtype=F64).out
    out = santapp_attention(q, kv, index, 13, draw=draw, seed=1, compute_dtype=F64, sink=0,
                            window=0)
    assert float((out.out - dense).abs().max()) < 1e-10
    assert torch.all(out.team_weights[:, :, :13] == 1)  # pi = 1 for every team
    # multinomial with one team: drawn M times, weight M / (M * 1)
    q1, kv1 = decode_problem(batch=1, heads=8, kv_heads=2, n=16, seed=3)
    idx1 = build_team_index(kv1, team_size=16, sink=0, exact_recent=0)
    one = santapp_attention(q1, kv1, idx1, 5, draw=draw, scheme="multinomial", seed=0,
                            compute_dtype=F64, sink=0, window=0)
    dense1 = sk.dense_attention(q1, kv1, compute_dtype=F64).out
    assert float((one.out - dense1).abs().max()) < 1e-10


def test_pooled_reads_at_most_M_teams_and_union_reads_as_head():
    # 512 tokens: 32 full teams of 16 per KV head, a group of 4 query heads each
    q, kv = decode_problem(batch=2, heads=8, kv_heads=2, n=512, q_scale=2.0, seed=10)
    index = build_team_index(kv, team_size=16, sink=0, exact_recent=0)
    for M in (2, 5, 8):
        for seed in range(5):
            args = {"seed": seed, "sink": 0, "window": 0}
            head = santapp_attention(q, kv, index, M, **args)
            pooled = santapp_attention(q, kv, index, M, draw="pooled", **args)
            union = santapp_attention(q, kv, index, M, draw="union", **args)
            assert torch.all(pooled.reads.v_rows == M * 16)  # exactly M teams a KV head
            assert torch.equal(union.reads.v_rows, head.reads.v_rows)  # the same draws
            assert pooled.kv_read_fraction <= head.kv_read_fraction
            multi = santapp_attention(q, kv, index, M, draw="pooled", scheme="multinomial",
                                      **args)
            assert torch.all(multi.reads.v_rows <= M * 16)


def test_union_weights_every_team_its_group_read():
    q, kv, index = _problem()
    head = santapp_attention(q, kv, index, 3, seed=4, sink=0, window=0, compute_dtype=F64)
    union = santapp_attention(q, kv, index, 3, draw="union", seed=4, sink=0, window=0,
                              compute_dtype=F64)
    read = (head.team_weights > 0).reshape(1, 2, 4, -1).any(dim=2)
    assert torch.equal(union.team_weights.reshape(1, 2, 4, -1)[:, :, 0] > 0, read)
    # a head's own teams are weighted less (the union is likelier to hold them)
    mine = head.team_weights > 0
    assert torch.all(union.team_weights[mine] <= head.team_weights[mine] + 1e-12)


def test_pooled_gumbels_are_per_kv_head_and_draw_is_checked():
    q, kv, index = _problem()
    g = torch.zeros(1, 2, int(index.team_valid.shape[-1]), dtype=F64)
    out = santapp_attention(q, kv, index, 3, draw="pooled", gumbels=g, sink=0, window=0)
    assert torch.all(out.reads.v_rows == 3 * 16)
    with pytest.raises(sk.InputError, match=r"^gumbels: expected shape \(1, 2, 13\)"):
        santapp_attention(q, kv, index, 3, draw="pooled", gumbels=torch.zeros(1, 8, 13))
    with pytest.raises(sk.InputError, match=r"^draw: expected one of"):
        santapp_attention(q, kv, index, 3, draw="shared")


def test_registry_draw_is_pooled_names_old_rows_head_and_the_kernel_refuses_union():
    method = REGISTRY.get("santapp")
    # named in a case unless head: stored head cases keep their hashes, and a pooled case
    # never takes one of theirs
    assert method.resolve_params({})["draw"] == "pooled"
    assert "draw" not in method.resolve_params({"draw": "head"})
    params = method.resolve_params({"draw": "pooled", "M": 4})
    assert params["draw"] == "pooled"
    row = {"method": "santapp", "M": 4.0, "team_size": 16.0}
    assert config_key({**row, "draw": "pooled"}) == "santapp:M=4"
    assert config_key({**row, "draw": "head"}) == "santapp:M=4,draw=head"
    assert config_key({**row, "draw": float("nan")}) == config_key({**row, "draw": "head"})
    q, kv = decode_problem(batch=1, heads=8, kv_heads=2, n=256, q_scale=2.0)
    out = method.run_reference(q, kv, params, seed=0)
    assert out.out.shape == q.shape and 0 < out.kv_read_fraction < 1
    with pytest.raises(Unsupported, match=r"^santapp: the Triton kernel implements draw=head "
                       r"and draw=pooled, not draw=union \(use --reference\)$"):
        santapp_prepare(q, kv, **{**params, "draw": "union"})
    with pytest.raises(Unsupported, match=r"use --reference"):
        TritonSantaPPDecode({"draw": "union"}, 1.0, 0).setup(None, q)


def test_fidelity_script_builds_a_contiguous_index_once_per_cache():
    script = load_script("fidelity_one_index")
    _, kv = decode_problem(batch=1, n=96)
    _, other = decode_problem(batch=1, n=96, seed=1)
    first = script._build_once(kv, team_size=16, sink=0, exact_recent=0)
    assert script._build_once(kv, team_size=16, sink=0, exact_recent=0) is first
    assert torch.equal(first.members, build_team_index(kv, sink=0, exact_recent=0).members)
    assert script._build_once(kv, team_size=8, sink=0, exact_recent=0) is not first
    assert script._build_once(other, team_size=16, sink=0, exact_recent=0) is not first
    kmeans = {"policy": "kmeans", "sink": 0, "exact_recent": 0}
    assert script._build_once(kv, **kmeans) is not script._build_once(kv, **kmeans)
