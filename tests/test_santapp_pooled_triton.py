"""Triton SANTA++ with ``draw=pooled`` (one draw of ``M`` teams per (sequence, KV head) from
its query heads' mean team probabilities, docs/algorithms.md section 6) against the float64
reference, on the CPU through Triton's interpreter at small shapes: the same teams, weights
and output given the same Gumbel noise; over 200 Philox draws the same mean as the
reference's and unbiased Horvitz-Thompson sums; exact where ``M`` covers every team; and
at most ``M`` teams read per KV head, as the byte model counts them.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import math
from functools import partial

import pytest
import torch
from test_triton_santapp import _gumbels
from test_triton_santapp import _problem as _problem_any

import santa_kernels as sk
from conftest import dense_num_den, kv_on
from santa_bench.baselines import Unsupported
from santa_bench.fidelity import seed_statistics
from santa_bench.methods import REGISTRY
from santa_kernels.santapp import build_team_index, santapp_attention
from santa_kernels.triton_santapp import (
    SantaPPWorkspace,
    build_packed,
    make_plan,
    pack_teams,
    santapp_decode,
    santapp_triton_available,
)

pytestmark = [pytest.mark.skipif(not santapp_triton_available()[0], reason="no Triton backend"),
              pytest.mark.usefixtures("one_thread")]

DEVICE = "cuda" if santapp_triton_available()[1].startswith("cuda") else "cpu"
F64 = torch.float64
Z_BOUND = 4.0  # |mean - expected| / SE
SEEDS = 200
_problem = partial(_problem_any, dtype=torch.float32)  # the kernel takes no float64


# ------------------------------------------------------------ same noise as the reference
@pytest.mark.parametrize(
    ("team_size", "heads", "sink", "window", "M", "lengths", "plan"),
    [
        (8, 8, 2, 5, 6, [256, 211], {}),  # GQA 4, the atomic merge
        (8, 8, 0, 0, 6, [256, 211], {"merge_atomic": False}),  # the merge kernel
        # GQA 6 (12/2 shape), one team a tile, its entries preloaded, two tiles a program
        (16, 12, 2, 5, 5, [256, 256], {"teams_per_block": 1, "attend_loops": 2,
                                       "attend_preload": True}),
        (8, 8, 0, 4, 7, [256, 240], {"teams_per_block": 2, "attend_loops": 3}),
        # M above the shorter sequence's 12 teams: every one of them, pi = 1
        (8, 8, 0, 0, 16, [256, 96], {}),
    ],
)
def test_pooled_matches_reference_given_the_same_gumbels(team_size, heads, sink, window, M,
                                                         lengths, plan):
    q, kv = _problem(batch=2, heads=heads, kv_heads=2, n=256, d=16, q_scale=2.0,
                     lengths=lengths)
    index = build_team_index(kv, team_size=team_size, sink=sink, exact_recent=window)
    packed = pack_teams(kv, index)
    workspace = SantaPPWorkspace.for_inputs(q, kv, packed, M, draw="pooled", **plan)
    assert workspace.plan.union_cap == M and not workspace.plan.head_lists
    gumbels = _gumbels(2, 2, packed.max_teams, seed=M)
    out, info = santapp_decode(q, kv, packed, M, gumbels=gumbels, workspace=workspace)
    ref = santapp_attention(q.float(), kv, index, M, sink=sink, window=window, gumbels=gumbels,
                            compute_dtype=F64, draw="pooled")
    chosen = (ref.team_weights > 0).cpu()
    assert torch.equal(info.selected().cpu(), chosen)
    torch.testing.assert_close(info.team_weights().cpu(), ref.team_weights.cpu(), rtol=1e-4,
                               atol=0)
    assert float((out.double() - ref.out).abs().max()) < 2e-5
    # one list of M teams a (sequence, KV head), every query head of the group the same
    teams = index.num_teams
    assert torch.equal(info.count.cpu().long(), teams.clamp_max(M))
    assert torch.equal(info.members(), chosen[:, ::heads // 2])
    finite = torch.isfinite(info.pool_kappa.cpu())
    assert torch.equal(finite, teams > M)  # kappa = -inf where every team is taken
    reads = info.read_counts()
    assert torch.equal(reads.v_rows, ref.reads.v_rows)
    assert reads.kv_read_fraction == pytest.approx(ref.kv_read_fraction)


# ------------------------------------------------------------ Philox noise, many draws
def _kernel_ht_sums(q, kv, index, team_w, top) -> torch.Tensor:
    """``[B, Hq, d + 1]``: the HT numerator and denominator of one kernel draw (its
    teams' ``1/pi`` per head over their members, 1 on the exact set), shifted by ``top``
    as ``dense_num_den``'s; every input on the CPU (the team index is)."""
    group = q.shape[1] // kv.num_kv_heads

    def weight(valid: torch.Tensor) -> torch.Tensor:
        team_of = index.team_of.repeat_interleave(group, dim=1)[..., : valid.shape[-1]]
        w = torch.gather(team_w, 2, team_of.clamp_min(0))
        return torch.where(team_of >= 0, w, 1.0) * valid[:, None, :]

    return dense_num_den(q, kv, weight, top)[0]


def test_pooled_draws_match_the_reference_in_distribution_and_are_unbiased():
    # GQA 4, 31 teams of 8 (sink 2, window 6), 8 drawn: the kernel's own Philox draws
    q, kv = _problem(batch=1, heads=4, kv_heads=1, n=256, d=16, q_scale=1.5, seed=3)
    host_q, host_kv = q.cpu(), kv_on(kv, "cpu")  # the float64 sums and references
    index = build_team_index(kv, team_size=8, sink=2, exact_recent=6)
    packed = pack_teams(kv, index)
    M = 8
    workspace = SantaPPWorkspace.for_inputs(q, kv, packed, M, seed=5, draw="pooled")
    exact, top = dense_num_den(host_q, host_kv)
    outs, teams_weighted = [], []

    def kernel_draw(_: int) -> torch.Tensor:
        out, info = santapp_decode(q, kv, packed, M, workspace=workspace)
        outs.append(out.double().cpu())
        team_w = info.team_weights().cpu()
        assert int(info.members().sum()) == M  # M teams read by the KV head
        teams_weighted.append(team_w[:, 0].sum(-1))  # HT count of the teams: E = 31
        return _kernel_ht_sums(host_q, host_kv, index, team_w, top)

    kernel = seed_statistics(kernel_draw, exact, seeds=SEEDS)
    assert kernel.max_abs_z < Z_BOUND, kernel.as_metrics()
    counts = torch.stack(teams_weighted)
    count_se = counts.std() / math.sqrt(SEEDS)
    assert abs(float(counts.mean()) - 31) / float(count_se) < Z_BOUND

    def reference_draw(seed: int) -> torch.Tensor:
        ref = santapp_attention(host_q, host_kv, index, M, seed=seed, compute_dtype=F64,
                                sink=2, window=6, draw="pooled")
        reference_draw.outs.append(ref.out)
        rescale = torch.exp(ref.shift - top)[..., None]
        return torch.cat([ref.num * rescale, ref.den[..., None] * rescale], dim=-1)

    reference_draw.outs = []
    reference = seed_statistics(reference_draw, exact, seeds=SEEDS)
    assert reference.max_abs_z < Z_BOUND, reference.as_metrics()
    # the ratio estimator is biased: the kernel's mean output is the reference's
    kernel_out, ref_out = torch.stack(outs), torch.stack(reference_draw.outs)
    two_sample = torch.sqrt((kernel_out.var(0) + ref_out.var(0)) / SEEDS)
    gap = (kernel_out.mean(0) - ref_out.mean(0)).abs()
    assert float((gap / two_sample.clamp_min(1e-9)).max()) < Z_BOUND
    dense = sk.dense_attention(host_q, host_kv, compute_dtype=F64).out
    assert float((kernel_out.mean(0) - dense).norm() / dense.norm()) < 0.1


# ------------------------------------------------------------ exact where M covers the teams
@pytest.mark.parametrize(("dtype", "atol"), [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_M_at_the_team_count_is_exact(dtype, atol):
    q, kv = _problem(dtype=dtype, batch=2, heads=8, kv_heads=2, n=200, d=32, q_scale=2.0, seed=6)
    packed = build_packed(kv, team_size=16, sink=3, exact_recent=6)
    assert packed.min_teams == packed.max_teams == 12
    out, info = santapp_decode(q, kv, packed, 12, draw="pooled")
    dense = sk.dense_attention(q, kv, compute_dtype=F64).out
    assert float((out.double() - dense).abs().max()) < atol
    assert torch.all(torch.isinf(info.pool_kappa))  # kappa = -inf: pi = 1
    assert torch.all(info.team_weights()[info.selected()] == 1)
    assert info.read_counts().kv_read_fraction == 1.0


# ------------------------------------------------------------ reads and the byte model
def _poisoned(kv: sk.KVCache, keep: torch.Tensor) -> sk.KVCache:
    """A copy of ``kv`` with NaN in every K and V row outside ``keep [B, Hkv, N]``
    (written after the cache's own finiteness check)."""
    dirty = sk.KVCache.contiguous(kv.k.clone(), kv.v.clone(), kv.lengths.clone())
    drop = ~keep.permute(0, 2, 1).to(kv.device)
    dirty.k[drop] = float("nan")
    dirty.v[drop] = float("nan")
    return dirty


def test_pooled_reads_M_teams_a_kv_head_and_the_byte_model_counts_them():
    """The rows the kernel gathers are the listed teams' and the exact set's (every other
    row NaN leaves the output as it was), ``M`` teams a (sequence, KV head) where
    ``draw=head``'s union holds more; the method's read counts are those rows."""
    method = REGISTRY.get("santapp")
    M, n, sink, window = 4, 256, 4, 8
    q, kv = _problem(batch=2, heads=8, kv_heads=2, n=n, d=16, q_scale=1.0, seed=9,
                     lengths=[256, 230])
    counted = {}
    for draw in ("head", "pooled"):
        params = method.resolve_params({"M": M, "team_size": 8, "sink": sink, "window": window,
                                        "draw": draw})
        prepared = method.prepare(q, kv, seed=1, **params)
        prepared.reset_rng(0)
        counted[draw] = prepared.reads()
    reads = counted["pooled"]
    workspace = prepared.reset_rng.__self__
    assert workspace.plan.draw == "pooled"
    packed = build_packed(kv, team_size=8, sink=sink, exact_recent=window)
    workspace.reset_rng(0)
    clean, info = santapp_decode(q, kv, packed, M, workspace=workspace)
    clean = clean.clone()
    members = info.members()
    assert torch.equal(members.sum(-1), torch.full((2, 2), M))
    # the row masks on the CPU, as the read counts
    start, length = packed.team_start.long().cpu(), packed.team_len.long().cpu()
    positions = torch.arange(n)
    inside = (positions >= start[..., None]) & (positions < (start + length)[..., None])
    teams = (inside & members[..., None]).any(2)  # [B, Hkv, N]
    end = packed.team_end.long().cpu()[:, None, None]
    valid = positions < kv.lengths.cpu()[:, None, None]
    exact = ((positions < torch.minimum(end, torch.tensor(sink))) | (positions >= end)) & valid
    keep = (teams & valid) | exact
    assert int(keep.sum()) < int(valid.sum())  # some teams are left unread
    workspace.reset_rng(0)
    dirty, _ = santapp_decode(q, _poisoned(kv, keep), packed, M, workspace=workspace)
    assert torch.isfinite(dirty).all() and torch.equal(clean, dirty)
    assert torch.equal(reads.v_rows, keep.sum(-1))
    assert torch.equal(reads.k_features, keep.sum(-1) * 16)
    assert int(counted["head"].v_rows.sum()) > int(reads.v_rows.sum())
    # the call's bytes: the tables, these rows at the cache dtype, q and the output
    tables = packed.reps.numel() * packed.reps.element_size() + packed.log_n.numel() * 4
    assert prepared.metrics["bytes_read_tables"][0] == tables
    assert info.bytes_moved(q) == tables + reads.kv_bytes(4) + 2 * q.numel() * 4


# ------------------------------------------------------------ planning and errors
@pytest.mark.parametrize(("hq", "hkv"), [(32, 8), (12, 2)])
def test_pooled_plans_list_M_teams_a_kv_head_at_32k(hq, hkv):
    teams = (32768 - 4 - 64) // 16
    plan = make_plan(8, hq, hkv, 128, teams, 512, 16, 68, draw="pooled")
    head = make_plan(8, hq, hkv, 128, teams, 512, 16, 68)
    assert plan.union_cap == 512 and head.union_cap == min(hq // hkv * 512, teams)
    assert not plan.local and not plan.head_lists and plan.bracket == plan.compact == 0
    assert plan.team_programs * plan.teams_per_block * plan.loops >= 512
    with pytest.raises(sk.InputError, match=r"^draw=pooled: at most 16384 teams"):
        make_plan(1, hq, hkv, 128, 16385, 512, 16, 68, draw="pooled")


def test_pooled_calls_are_checked_and_the_method_runs_them():
    q, kv = _problem(batch=1, heads=4, kv_heads=1, n=128, d=16, q_scale=1.0, seed=4)
    packed = build_packed(kv, team_size=8, sink=0, exact_recent=0)
    with pytest.raises(sk.InputError, match=r"^draw: the SANTA\+\+ kernel implements"):
        santapp_decode(q, kv, packed, 4, draw="union")
    head = SantaPPWorkspace.for_inputs(q, kv, packed, 4)
    with pytest.raises(sk.InputError, match=r"^workspace: planned for draw=head, got "
                                            r"draw=pooled$"):
        santapp_decode(q, kv, packed, 4, workspace=head, draw="pooled")
    with pytest.raises(sk.InputError, match=r"^gumbels: expected shape \(1, 1, 16\)"):
        santapp_decode(q, kv, packed, 4, draw="pooled", gumbels=torch.zeros(1, 4, 16))
    method = REGISTRY.get("santapp")
    params = method.resolve_params({"M": 4, "team_size": 8, "sink": 0, "window": 0,
                                    "draw": "pooled"})
    prepared = method.prepare(q, kv, seed=2, **params)
    first, second = prepared().clone(), prepared().clone()
    assert first.shape == q.shape and not torch.equal(first, second)  # fresh draws
    assert prepared.notes["plan"].draw == "pooled"
    with pytest.raises(Unsupported, match=r"not draw=union \(use --reference\)$"):
        method.prepare(q, kv, seed=2, **{**params, "draw": "union"})


def test_pooled_decodes_in_the_e2e_loop():
    from santa_bench.e2e.attention import LayerRouting
    from santa_bench.e2e.configs import NAMED
    from santa_bench.e2e.loop import DecodeSession
    from santa_bench.e2e.model import Decoder
    from santa_bench.methods.santapp import TritonSantaPPDecode

    model = Decoder.random(NAMED["tiny"], dtype=torch.float32, std=0.1, device=DEVICE)
    session = DecodeSession(model, batch=1, ctx=40, steps=2, layout="paged", page_size=8)
    prompt = torch.randint(0, model.config.vocab, (1, 40),
                           generator=torch.Generator().manual_seed(1))
    session.prefill("dense", prompt, chunk=16)
    # teams packed after the prefill, 2 of the 3 (40 tokens / 16) drawn a call
    params = REGISTRY.get("santapp").resolve_params({"M": 2, "sink": 0, "window": 0,
                                                     "draw": "pooled"})
    teams = TritonSantaPPDecode(params, session.scale, seed=0)
    attend = LayerRouting(teams)
    session.prepare(attend)
    result = session.decode(attend)
    assert teams.workspaces[0] is teams.workspaces[1]  # layers of one plan share it
    assert teams.workspaces[0].plan.draw == "pooled"
    calls = (2 + len(result.attention_ms)) * model.config.num_layers
    assert int(teams.workspaces[0].rng[0]) == calls
    q = torch.randn(1, model.config.num_heads, model.config.head_dim,
                    generator=torch.Generator().manual_seed(2)).to(DEVICE)
    assert 0 < teams.read_fraction(0, q) < 1
