"""Tests of the SANTA++ reference (docs/algorithms.md sections 6 and 9).

Random estimators are judged over fixed seeds: exactness when every team is read, HT/HH
sums unbiased within a confidence bound, error falling with the team budget ``M``.
"""

from __future__ import annotations

import itertools

import pytest
import torch

import santa_kernels as sk
from conftest import decode_problem, dense_num_den
from santa_bench.fidelity import seed_statistics
from santa_bench.methods import REGISTRY, parse_method_specs
from santa_kernels.santapp import (
    build_team_index,
    extend,
    gumbel_topk_select,
    santapp_attention,
)

F64 = torch.float64
Z_BOUND = 5.0  # |mean - expected| / SE; under the null it rarely exceeds 4


pytestmark = pytest.mark.usefixtures("one_thread")


def _dense(q, kv):
    return sk.dense_attention(q, kv, compute_dtype=F64).out


def _max_err(a, b):
    return float((a - b).abs().max())


# ------------------------------------------------------------ exactness
@pytest.mark.parametrize("representative", ["leader", "mean"])
@pytest.mark.parametrize("mix", [0.0, 0.3])
def test_contiguous_all_teams_selected_is_exact(representative, mix):
    # 200 and 193 tokens: 13 teams of 16 each (the last shorter); GQA group 2
    q, kv = decode_problem(n=200, lengths=[200, 193], q_scale=2.0)
    index = build_team_index(kv, team_size=16, representative=representative, sink=0,
                             exact_recent=0)
    assert index.num_teams.tolist() == [[13, 13], [13, 13]]
    out = santapp_attention(q, kv, index, 13, mix=mix, seed=3, compute_dtype=F64, sink=0, window=0)
    assert _max_err(out.out, _dense(q, kv)) < 1e-10
    selected = out.team_weights[index.team_valid[:, [0, 0, 1, 1]]]
    assert torch.all(selected == 1)  # pi = 1 for every team


@pytest.mark.parametrize("scheme", ["gumbel-topk", "multinomial"])
def test_M_above_a_sequences_team_count_reads_all_of_its_teams(scheme):
    # 200 and 120 tokens, teams of 16: 13 and 8 teams. M=10 draws sequence 0's teams and
    # reads all of sequence 1's (gumbel-topk: pi = 1, exact there); M=512 reads everything
    q, kv = decode_problem(n=200, lengths=[200, 120], q_scale=2.0)
    index = build_team_index(kv, team_size=16, sink=0, exact_recent=0)
    assert index.num_teams.tolist() == [[13, 13], [8, 8]]
    dense = _dense(q, kv)
    if scheme == "gumbel-topk":
        big = santapp_attention(q, kv, index, 512, seed=3, compute_dtype=F64, sink=0, window=0)
        assert _max_err(big.out, dense) < 1e-10
        assert big.kv_read_fraction == 1.0
    errs = []
    for seed in range(8):
        out = santapp_attention(q, kv, index, 10, scheme=scheme, seed=seed, compute_dtype=F64,
                                sink=0, window=0)
        errs.append(_max_err(out.out[0], dense[0]))
        if scheme == "gumbel-topk":
            assert _max_err(out.out[1], dense[1]) < 1e-10
            assert torch.all(out.team_weights[1][index.team_valid[1, [0, 0, 1, 1]]] == 1)
    assert min(errs) > 1e-6  # sequence 0 stays sampled


@pytest.mark.parametrize("representative", ["leader", "mean"])
def test_kmeans_all_teams_selected_is_exact(representative):
    q, kv = decode_problem(batch=1, heads=3, kv_heads=1, n=150, q_scale=2.0, seed=4)
    index = build_team_index(kv, policy="kmeans", representative=representative, seed=1, sink=0,
                             exact_recent=0)
    teams = int(index.num_teams.item())
    out = santapp_attention(q, kv, index, teams, seed=0, compute_dtype=F64, sink=0, window=0)
    assert _max_err(out.out, _dense(q, kv)) < 1e-10


def test_exact_set_sink_window_and_tail_are_counted_once():
    # index built on a prefix: the last 9 tokens are the growth tail (exact); sink and
    # window tokens inside teams are masked out of their teams and attended exactly
    q, full = decode_problem(n=160, q_scale=2.0, seed=5)
    prefix = sk.KVCache.contiguous(full.k[:, :151], full.v[:, :151])
    index = build_team_index(prefix, team_size=16, sink=2, exact_recent=0)
    teams = int(index.num_teams.min())
    out = santapp_attention(q, full, index, teams, sink=5, window=20, compute_dtype=F64)
    assert _max_err(out.out, _dense(q, full)) < 1e-10
    # with a window over the whole context every token is exact, whatever M and scheme
    for scheme in ("gumbel-topk", "multinomial"):
        out = santapp_attention(q, full, index, 1, scheme=scheme, window=160, compute_dtype=F64,
                                sink=0)
        assert _max_err(out.out, _dense(q, full)) < 1e-10


def test_multinomial_with_one_team_is_exact():
    q, kv = decode_problem(n=100, q_scale=2.0)
    index = build_team_index(kv, team_size=128, sink=0, exact_recent=0)
    out = santapp_attention(q, kv, index, 1, scheme="multinomial", compute_dtype=F64, sink=0,
                            window=0)
    assert _max_err(out.out, _dense(q, kv)) < 1e-10


# ------------------------------------------------------------ statistics
@pytest.mark.parametrize("scheme", ["gumbel-topk", "multinomial"])
def test_error_falls_as_M_grows(scheme):
    q, kv = decode_problem(n=512, q_scale=3.0, seed=1)
    index = build_team_index(kv, team_size=16, sink=0, exact_recent=0)  # 32 teams
    exact = _dense(q, kv)

    def mean_error(M: int) -> float:
        errors = [
            float(
                (
                    santapp_attention(q, kv, index, M, scheme=scheme, seed=s, compute_dtype=F64,
                                      sink=0, window=0).out
                    - exact
                ).norm()
                / exact.norm()
            )
            for s in range(40)
        ]
        return sum(errors) / len(errors)

    errors = [mean_error(M) for M in (2, 4, 8, 16)]
    print(scheme, [f"{e:.3f}" for e in errors])
    assert all(a > b for a, b in itertools.pairwise(errors)), errors


def test_gumbel_topk_horvitz_thompson_identity():
    # E[1{g selected} / pi_g] = 1 for every team, so the HT team count averages to n
    gen = torch.Generator().manual_seed(0)
    teams, M, draws = 20, 5, 20000
    phi = torch.randn(teams, generator=gen, dtype=F64)
    phi[3] = -float("inf")  # a padding slot: never selected
    selected, pi = gumbel_topk_select(phi.expand(draws, teams), M, gen)
    assert torch.all(selected.sum(-1) == M) and not selected[:, 3].any()
    assert torch.all(pi[selected] > 0) and torch.all(pi[selected] <= 1)
    ht = torch.where(selected, 1 / torch.where(selected, pi, 1), 0)
    mean, se = ht.mean(0), ht.std(0) / draws**0.5
    finite = torch.isfinite(phi)
    z = (mean[finite] - 1).abs() / se[finite]
    assert float(z.max()) < Z_BOUND, z
    count = ht.sum(-1)
    z_count = abs(float(count.mean()) - (teams - 1)) / float(count.std() / draws**0.5)
    assert z_count < Z_BOUND


def test_gumbel_topk_inclusion_matches_selection_frequency():
    # the unconditional inclusion probability is E[pi_g(kappa_g)], kappa_g the M-th largest
    # perturbed logit of the other teams: compare it with the selection frequency
    gen = torch.Generator().manual_seed(1)
    teams, M, draws = 12, 4, 20000
    phi = torch.randn(teams, generator=gen, dtype=F64) * 1.5
    selected, _ = gumbel_topk_select(phi.expand(draws, teams), M, gen)
    freq = selected.double().mean(0)
    z = phi - torch.log(-torch.log(torch.rand(draws, teams, generator=gen, dtype=F64)))
    top = torch.topk(z, M + 1, dim=-1).values
    in_top = z >= top[:, M - 1 : M]
    kappa = torch.where(in_top, top[:, M : M + 1], top[:, M - 1 : M])
    expected = (-torch.expm1(-torch.exp(phi - kappa))).mean(0)
    bound = Z_BOUND * (expected * (1 - expected) / draws).sqrt() * 2**0.5
    assert torch.all((freq - expected).abs() < bound + 1e-3), (freq, expected)


@pytest.mark.parametrize(
    ("scheme", "mix"),
    [("multinomial", 0.0), ("multinomial", 0.2), ("gumbel-topk", 0.0), ("gumbel-topk", 0.2)],
)
def test_num_and_den_are_unbiased(scheme, mix):
    q, kv = decode_problem(batch=1, n=203, q_scale=1.5, seed=2)
    # 13 teams, the last of 11 tokens
    index = build_team_index(kv, team_size=16, sink=0, exact_recent=0)
    exact, top = dense_num_den(q, kv)

    def draw(seed: int) -> torch.Tensor:
        out = santapp_attention(
            q, kv, index, 4, scheme=scheme, mix=mix, seed=seed, compute_dtype=F64, sink=0, window=0
        )
        rescale = torch.exp(out.shift - top)[..., None]
        return torch.cat([out.num * rescale, out.den[..., None] * rescale], dim=-1)

    stats = seed_statistics(draw, exact, seeds=600)
    assert stats.max_abs_z < Z_BOUND, stats.as_metrics()
    assert stats.rel_bias < 0.25 * stats.rel_rmse


# ------------------------------------------------------------ index
@pytest.mark.parametrize("duplicates", [False, True])
def test_kmeans_index_partitions_the_tokens(duplicates):
    _, kv = decode_problem(n=150, lengths=[150, 97], seed=7)
    if duplicates:  # many identical keys: leaders still end up in their own teams
        k = kv.k.clone()
        k[:, 20:80] = k[:, 20:21]
        kv = sk.KVCache.contiguous(k, kv.v, kv.lengths)
    index = build_team_index(kv, policy="kmeans", team_size=16, leaders=4, sink=3,
                             exact_recent=5, seed=2, representative="leader")
    for b, length in enumerate(kv.lengths.tolist()):
        for h in range(kv.num_kv_heads):
            valid = index.team_valid[b, h]
            members = index.members[b, h][valid]
            listed = members[members >= 0]
            assert sorted(listed.tolist()) == list(range(3, length - 5))  # each token once
            assert int(index.sizes[b, h].sum()) == length - 8
            assert torch.equal((members >= 0).sum(-1), index.sizes[b, h][valid])
            team_ids = torch.nonzero(valid).flatten()
            for name in ("leaders", "rep_pos"):
                pos = getattr(index, name)[b, h][valid]
                assert torch.equal(index.team_of[b, h, pos], team_ids), name
            # at most `leaders` teams per k-means parent: about N / P parents
            assert int(valid.sum()) <= 4 * -(-(length - 8) // 16)


def test_contiguous_index_and_growth():
    q, kv = decode_problem(n=132, q_scale=2.0, seed=8)
    prefix = sk.KVCache.contiguous(kv.k[:, :100], kv.v[:, :100])
    index = build_team_index(prefix, team_size=16, sink=0, exact_recent=0)
    assert index.sizes[0, 0].tolist() == [16] * 6 + [4]
    assert torch.equal(index.members[0, 0, 6, :4], torch.arange(96, 100))
    grown = extend(index, sk.KVCache.contiguous(kv.k[:, :115], kv.v[:, :115]))
    assert grown.num_teams.tolist() == [[7, 7], [7, 7]]  # 15 tokens wait in the exact tail
    assert torch.all(grown.team_of[:, :, 100:] == -1)
    grown = extend(grown, sk.KVCache.contiguous(kv.k[:, :116], kv.v[:, :116]))
    assert grown.num_teams.tolist() == [[8, 8], [8, 8]]
    assert torch.equal(grown.members[1, 1, 7], torch.arange(100, 116))
    grown = extend(grown, kv)
    assert grown.num_teams.tolist() == [[9, 9], [9, 9]]
    out = santapp_attention(q, kv, grown, 9, compute_dtype=F64, sink=0, window=0)
    assert _max_err(out.out, _dense(q, kv)) < 1e-10


def test_contiguous_and_paged_layouts_agree():
    q, kv = decode_problem(n=203, lengths=[203, 150], q_scale=2.0, seed=9)
    paged = kv.to_paged(32, generator=torch.Generator().manual_seed(0))
    for policy in ("contiguous", "kmeans"):
        a = build_team_index(kv, policy=policy, seed=3, sink=0, exact_recent=0)
        b = build_team_index(paged, policy=policy, seed=3, sink=0, exact_recent=0)
        assert torch.equal(a.members, b.members) and torch.equal(a.rep_keys, b.rep_keys)
        for scheme in ("gumbel-topk", "multinomial"):
            x = santapp_attention(q, kv, a, 6, scheme=scheme, seed=11, compute_dtype=F64, sink=0,
                                  window=0)
            y = santapp_attention(q, paged, b, 6, scheme=scheme, seed=11, compute_dtype=F64,
                                  sink=0, window=0)
            assert torch.equal(x.out, y.out)
            assert torch.equal(x.reads.v_rows, y.reads.v_rows)


# ------------------------------------------------------------ reads and validation
def test_reads_never_exceed_one_and_shrink_with_M():
    q, kv = decode_problem(n=512, heads=8, kv_heads=2, q_scale=2.0, seed=10)
    index = build_team_index(kv, team_size=16, sink=0, exact_recent=0)
    previous = None
    for M in (1, 2, 4, 8, 16, 32):
        # the same seed perturbs the logits identically: top-M sets are nested
        out = santapp_attention(q, kv, index, M, seed=4, sink=0, window=0)
        rows = out.reads.v_rows
        assert torch.all(rows <= kv.lengths[:, None]) and out.kv_read_fraction <= 1
        assert torch.all(out.representatives_read == 32)
        assert out.read_equivalent > out.kv_read_fraction
        if previous is not None:
            assert torch.all(rows >= previous)
        previous = rows
    assert out.kv_read_fraction == 1.0
    small = santapp_attention(q, kv, index, 2, scheme="multinomial", seed=0, sink=0, window=0)
    assert small.kv_read_fraction <= 4 * 2 * 16 / 512  # at most G*M teams of 16 per group


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"M": 0}, "M: must be > 0"),
        ({"M": 2.0}, "M: expected an integer"),
        ({"scheme": "poisson"}, "scheme: expected one of"),
        ({"mix": 1.0}, r"mix: expected a number in \[0, 1\)"),
        ({"mix": -0.1}, "mix: expected"),
        ({"sink": -1}, "sink: expected an integer >= 0"),
        ({"window": -2}, "window: expected an integer >= 0"),
        ({"compute_dtype": torch.float16}, "compute_dtype:"),
    ],
)
def test_invalid_decode_arguments_raise(kwargs, message):
    q, kv = decode_problem(n=200)
    index = build_team_index(kv, sink=0, exact_recent=0)
    args = {"M": 4, **kwargs}
    with pytest.raises(sk.InputError, match=f"^{message}"):
        santapp_attention(q, kv, index, **args)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"team_size": 0}, "team_size: must be > 0"),
        ({"leaders": -1}, "leaders: must be > 0"),
        ({"policy": "lsh"}, "policy: expected one of"),
        ({"representative": "median"}, "representative: expected one of"),
        ({"sink": -1}, "sink:"),
        ({"exact_recent": -1}, "exact_recent:"),
    ],
)
def test_invalid_index_arguments_raise(kwargs, message):
    _, kv = decode_problem(n=64)
    with pytest.raises(sk.InputError, match=f"^{message}"):
        build_team_index(kv, **kwargs)


def test_query_and_index_mismatches_raise():
    q, kv = decode_problem(n=64)
    index = build_team_index(kv, sink=0, exact_recent=0)
    with pytest.raises(sk.InputError, match=r"^q: batch"):
        santapp_attention(q[:1], kv, index, 2, sink=0, window=0)
    with pytest.raises(sk.InputError, match=r"^q: 3 query heads"):
        santapp_attention(q[:, :3], kv, index, 2, sink=0, window=0)
    _, other = decode_problem(batch=1, n=64)
    with pytest.raises(sk.InputError, match=r"^index: built for 2 sequences"):
        santapp_attention(q[:1], other, index, 2, sink=0, window=0)
    short = sk.KVCache.contiguous(kv.k[:, :40], kv.v[:, :40])
    with pytest.raises(sk.InputError, match=r"^index: covers"):
        santapp_attention(q, short, index, 2, sink=0, window=0)


# ------------------------------------------------------------ registry
def test_registry_entry_builds_the_index_and_decodes():
    q, kv = decode_problem(n=256, q_scale=2.0, dtype=torch.bfloat16)
    [(method, overrides)] = parse_method_specs("santapp:M=8;policy=kmeans;mix=0.1")
    assert method is REGISTRY.get("santapp") and method.family == "santapp"
    params = method.resolve_params(overrides)
    assert params["M"] == 8 and params["team_size"] == 16 and params["mix"] == 0.1
    out = method.run_reference(q, kv, params, seed=0)
    assert out.out.shape == q.shape and 0 < out.reads.kv_read_fraction < 1
    assert method.bytes_read(out.reads, 2, q.shape[1]) == out.reads.kv_bytes(2)
    dense_like = method.run_reference(
        q.double(), kv, method.resolve_params({"M": 16, "sink": 0, "window": 0}), seed=0,
        compute_dtype=F64,
    )
    assert _max_err(dense_like.out, _dense(q.double(), kv)) < 1e-10
