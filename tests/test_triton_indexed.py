"""triton-indexed and the selection fast paths against their references (runs under
TRITON_INTERPRET=1 on CPU; the same tests run the compiled kernels on a GPU)."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported anywhere

from functools import partial

import pytest
import torch

import santa_kernels as sk
from conftest import decode_problem, kv_on
from santa_kernels import selection as sel
from santa_kernels.scores import exact_scores

ti = pytest.importorskip("santa_kernels.triton_indexed")
ts = pytest.importorskip("santa_kernels.triton_selection")
_OK, _WHY = ti.indexed_available()
if not _OK:
    pytest.skip(f"triton-indexed unavailable: {_WHY}", allow_module_level=True)

DEVICE = "cuda" if _WHY == "cuda" else "cpu"
TOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2}

_cpu = partial(kv_on, device="cpu")  # the references run on the CPU


def _problem(batch=2, hkv=2, group=3, n=150, d=16, dtype=torch.float32, lengths=(150, 77),
             q_scale=1.0, seed=0):
    q, kv = decode_problem(batch=batch, heads=hkv * group, kv_heads=hkv, n=n, d=d,
                           q_scale=q_scale, seed=seed, lengths=list(lengths), dtype=dtype)
    return q.to(DEVICE), sk.KVCache.contiguous(kv.k.to(DEVICE), kv.v.to(DEVICE),
                                               kv.lengths.to(DEVICE))


def _close(out, ref, dtype):
    err = float((out.cpu().double() - ref.cpu().double()).norm() / ref.norm())
    assert err < TOL[dtype], err


# ------------------------------------------------------------------ the kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("group", [1, 3])
@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("weights", ["none", "shared", "per-head"])
def test_indexed_rows_with_padding_and_log_weights(dtype, group, splits, weights):
    q, kv = _problem(group=group, dtype=dtype)
    gen = torch.Generator().manual_seed(group + splits)
    idx = torch.randint(-10, 150, (2, 2, 40), generator=gen, dtype=torch.int32)  # -: none
    lw = None
    if weights != "none":
        heads = 2 * group if weights == "per-head" else 2
        lw = torch.randn(2, heads, 40, generator=gen)
        lw[lw < -1.2] = float("-inf")  # a row left out (of a head)
        lw = lw.to(DEVICE)
    out = ti.indexed_attention(q, kv, idx.to(DEVICE), log_weights=lw, num_splits=splits)
    ref = sel.indexed_reference(q.cpu(), _cpu(kv), idx, None if lw is None else lw.cpu())
    _close(out, ref, dtype)


@pytest.mark.parametrize("page", [4, 16])
def test_indexed_blocks_on_a_paged_cache(page):
    q, kv = _problem(dtype=torch.bfloat16)
    paged = kv.to_paged(16, generator=torch.Generator().manual_seed(2))
    gen = torch.Generator().manual_seed(page)
    blocks = torch.randint(-1, 150 // page + 1, (2, 2, 6), generator=gen, dtype=torch.int32)
    counts = torch.tensor([[6, 4], [5, 6]], dtype=torch.int32)
    out = ti.indexed_attention(q, paged, blocks.to(DEVICE), counts=counts.to(DEVICE),
                               block=page, num_splits=2)
    keep = torch.arange(6)[None, None, :] < counts[..., None]
    listed = torch.where(keep, blocks, -1).long()
    tokens = listed[..., None] * page + torch.arange(page)
    tokens = torch.where(listed[..., None] >= 0, tokens, -1).flatten(2)
    _close(out, sel.indexed_reference(q.cpu(), _cpu(kv), tokens), torch.bfloat16)


def test_uniform_tail_draws_exclusions_and_whole_ranges():
    q, kv = _problem()
    count = torch.tensor([[5, 20], [150, 0]], dtype=torch.int32)  # 150 >= range: whole
    lo = torch.tensor([4, 4], dtype=torch.int32)
    hi = torch.tensor([140, 70], dtype=torch.int32)
    log_w = torch.log((hi - lo)[:, None].float() / count.clamp_min(1).float())
    log_w[1, 0] = 0.0
    exclude = torch.zeros(2, 2, 150, dtype=torch.uint8)
    exclude[:, :, 10:40] = 1
    rng = torch.zeros(1, dtype=torch.int64, device=DEVICE)
    samples = torch.full((4, 256), -1, dtype=torch.int32, device=DEVICE)
    tail = ti.UniformTail(count.to(DEVICE), lo.to(DEVICE), hi.to(DEVICE), log_w.to(DEVICE),
                          exclude.to(DEVICE), rng, seed=3, stride=256)
    idx = torch.tensor([[[0, 1, 2], [149, -1, 3]], [[76, 75, -1], [0, 1, 2]]],
                       dtype=torch.int32)
    out = ti.indexed_attention(q, kv, idx.to(DEVICE), tail=tail, num_splits=2,
                               samples=samples)
    drawn = samples.cpu().view(2, 2, 256).long()
    assert ((drawn >= 0).sum(-1) == torch.tensor([[5, 20], [66, 0]])).all()
    assert drawn[1, 0, :66].tolist() == list(range(4, 70))  # the whole range, once each
    inside = drawn[drawn >= 0]
    assert ((inside >= 4) & (inside < 140)).all()
    lw = log_w[..., None].expand(2, 2, 256).clone()
    lw[exclude.long().gather(2, drawn.clamp_min(0)) > 0] = float("-inf")
    tokens = torch.cat([idx.long(), drawn], -1)
    weights = torch.cat([torch.zeros(2, 2, 3), lw], -1)
    _close(out, sel.indexed_reference(q.cpu(), _cpu(kv), tokens, weights), torch.float32)
    rng.add_(1)  # the next step draws other rows
    ti.indexed_attention(q, kv, idx.to(DEVICE), tail=tail, num_splits=2, samples=samples)
    assert not torch.equal(samples.cpu().view(2, 2, 256)[0, 1, :20], drawn[0, 1, :20])


@pytest.mark.parametrize("paged", [False, True])
def test_rows_scored_from_a_stash_read_no_key(paged):
    """With the score pass's stash as ``scores`` the listed rows (per-head log-weights)
    and the drawn tail attend as when their keys are read: the same output with every
    key replaced by 1e30 (so none is read), on a contiguous and a paged cache."""
    q, kv = _problem(lengths=(150, 77))
    if paged:
        kv = kv.to_paged(16, generator=torch.Generator().manual_seed(1))
    stash = ti.qk_scores(q, kv)
    huge = torch.full_like(kv.k, 1e30)
    blind = (sk.KVCache.paged(huge, kv.v, kv.page_table, kv.lengths) if paged
             else sk.KVCache.contiguous(huge, kv.v, kv.lengths))
    idx = torch.tensor([[[0, 1, 2, 9], [149, -1, 3, 60]], [[76, 75, -1, 5], [0, 1, 2, 3]]],
                       dtype=torch.int32, device=DEVICE)
    lw = torch.randn(2, 6, 4, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    rng = torch.zeros(1, dtype=torch.int64, device=DEVICE)
    tail = ti.UniformTail(torch.tensor([[7, 30], [3, 9]], dtype=torch.int32, device=DEVICE),
                          torch.tensor([4, 4], dtype=torch.int32, device=DEVICE),
                          torch.tensor([140, 70], dtype=torch.int32, device=DEVICE),
                          torch.full((2, 2), 0.5, device=DEVICE), None, rng, seed=5,
                          stride=64)
    for kw in ({"log_weights": lw}, {"tail": tail}):
        want = ti.indexed_attention(q, kv, idx, num_splits=2, **kw)
        got = ti.indexed_attention(q, blind, idx, num_splits=2, scores=stash, **kw)
        assert torch.isfinite(got).all()
        assert torch.allclose(got.cpu(), want.cpu(), atol=1e-5)
    with pytest.raises(sk.InputError, match="scores"):
        ti.indexed_attention(q, kv, idx, scores=stash[:, :, :10])


def test_tail_draws_are_uniform():
    """40 steps of 100 draws (fewer than the range: with replacement) over 140 tokens."""
    q, kv = _problem(batch=1, hkv=1, group=1, lengths=(150,))
    rng = torch.zeros(1, dtype=torch.int64, device=DEVICE)
    samples = torch.full((1, 128), -1, dtype=torch.int32, device=DEVICE)
    tail = ti.UniformTail(torch.tensor([[100]], dtype=torch.int32, device=DEVICE),
                          torch.tensor([5], dtype=torch.int32, device=DEVICE),
                          torch.tensor([145], dtype=torch.int32, device=DEVICE),
                          torch.zeros(1, 1, device=DEVICE), None, rng, seed=9, stride=128)
    drawn = []
    for _ in range(40):
        ti.indexed_attention(q, kv, tail=tail, samples=samples)
        drawn.append(samples.cpu()[0, :100].long() - 5)
        rng.add_(1)
    counts = torch.bincount(torch.cat(drawn), minlength=140).double()
    expected = 4000 / 140
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert counts.numel() == 140 and chi2 < 205  # 139 degrees of freedom: p ~ 2e-4


def test_scores_of_every_token_contiguous_and_paged():
    q, kv = _problem()
    keys, _, valid = _cpu(kv).padded(torch.float64)
    exact = exact_scores(q.cpu().double(), keys, valid, 16**-0.5, 3)[0]
    for cache in (kv, kv.to_paged(16, generator=torch.Generator().manual_seed(0))):
        got = ti.qk_scores(q, cache).cpu().double()
        assert torch.isinf(got[1, :, 77:]).all() and (got[1, :, 77:] < 0).all()
        torch.testing.assert_close(got[:, :, :150][valid[:, None].expand_as(exact)],
                                   exact[valid[:, None].expand_as(exact)], rtol=1e-5,
                                   atol=1e-5)


def test_bad_inputs_give_one_line_errors():
    q, kv = _problem()
    with pytest.raises(sk.InputError, match="indices"):
        ti.indexed_attention(q, kv, torch.zeros(2, 2, 4, dtype=torch.int64, device=DEVICE))
    with pytest.raises(sk.InputError, match="give row indices"):
        ti.indexed_attention(q, kv)
    with pytest.raises(sk.InputError, match="log_weights"):
        ti.indexed_attention(q, kv, torch.zeros(2, 2, 4, dtype=torch.int32, device=DEVICE),
                             log_weights=torch.zeros(2, 5, 4, device=DEVICE))


# ------------------------------------------------------------------ the fast paths
@pytest.mark.parametrize("shared", ["group", "head"])
def test_oracle_topk_step_is_its_reference(shared):
    q, kv = _problem(n=300, lengths=(300, 141), q_scale=2.0)
    step = ts.OracleTopKStep(q, kv, k=20, shared=shared)
    ref = sel.oracle_topk(q.cpu(), _cpu(kv), k=20, shared=shared, compute_dtype=torch.float64)
    _close(step(q, kv), ref.out, torch.float32)
    reads = step.read_counts(q, kv)
    assert reads.v_rows.tolist() == ref.reads.v_rows.tolist()
    assert reads.k_features.tolist() == ref.reads.k_features.tolist()


@pytest.mark.parametrize("layout", ["contiguous", "paged"])
@pytest.mark.parametrize("shared", ["group", "head"])
def test_quest_step_is_its_reference(layout, shared):
    q, kv = _problem(n=300, lengths=(300, 141), q_scale=2.0)
    cache = kv if layout == "contiguous" else kv.to_paged(
        16, generator=torch.Generator().manual_seed(0))
    step = ts.QuestStep(q, cache, page=8, pages=5, shared=shared)
    step.build(cache)
    ref = sel.quest(q.cpu(), _cpu(kv), page=8, pages=5, shared=shared,
                    compute_dtype=torch.float64)
    _close(step(q, cache), ref.out, torch.float32)
    reads = step.read_counts(q, cache)
    assert reads.v_rows.tolist() == ref.reads.v_rows.tolist()
    assert reads.k_features.tolist() == ref.reads.k_features.tolist()


@pytest.mark.parametrize("layout", ["contiguous", "paged"])
def test_quest_bounds_extended_token_by_token_equal_a_full_build(layout):
    q, kv = _problem(n=160, lengths=(160, 160))
    cache = kv if layout == "contiguous" else kv.to_paged(
        16, generator=torch.Generator().manual_seed(0))
    lengths = cache.lengths.clone()
    cache.lengths.copy_(torch.tensor([100, 33], device=DEVICE))
    step = ts.QuestStep(q, cache, page=8, pages=4)
    step.build(cache)
    for _ in range(30):  # decode steps append one token each (page starts included)
        cache.lengths.add_(1)
        step(q, cache)
    full = ts.QuestStep(q, cache, page=8, pages=4)
    full.build(cache)
    assert torch.equal(step.bounds[0], full.bounds[0])
    cache.lengths.copy_(lengths)


def test_vattention_step_reads_the_range_whole_when_the_budget_asks():
    q, kv = _problem(n=300, lengths=(300, 141))
    step = ts.VAttentionStep(q, kv, sink=4, window=4, topk=8, epsilon=0.001, delta=0.5)
    _close(step(q, kv), sk.dense_attention(q.cpu(), _cpu(kv), compute_dtype=torch.float64).out,
           torch.float32)
    assert step.read_counts(q, kv).v_read_fraction == 1.0
    with pytest.raises(sk.InputError, match="mode=output"):
        ts.VAttentionStep(q, kv, mode="output")


def test_vattention_step_samples_fresh_tails_whose_error_matches_the_reference():
    q, kv = _problem(batch=1, n=600, lengths=(600,), q_scale=1.5)
    dense = sk.dense_attention(q.cpu(), _cpu(kv), compute_dtype=torch.float64).out
    params = dict(sink=8, window=8, topk=8, epsilon=0.2, delta=0.2, base_rate=0.05)
    step = ts.VAttentionStep(q, kv, **params, seed=1)
    fast = torch.stack([step(q, kv).cpu().double() for _ in range(40)])
    ref = torch.stack([sel.vattention(q.cpu(), _cpu(kv), **params, seed=s,
                                      compute_dtype=torch.float64).out for s in range(40)])
    assert not torch.equal(fast[0], fast[1])  # a fresh draw every call
    err_fast = ((fast - dense).norm(dim=-1) / dense.norm(dim=-1)).mean()
    err_ref = ((ref - dense).norm(dim=-1) / dense.norm(dim=-1)).mean()
    assert 0.5 < float(err_fast / err_ref) < 2.0
    assert step.read_counts(q, kv).v_read_fraction < 0.9


def test_topk_santa_step_is_unbiased_and_exact_with_every_token():
    q, kv = _problem(batch=1, n=120, lengths=(120,), q_scale=2.0)
    dense = sk.dense_attention(q.cpu(), _cpu(kv), compute_dtype=torch.float64).out
    whole = ts.TopKSantaStep(q, kv, k=200, S=4)
    _close(whole(q, kv), dense, torch.float32)
    step = ts.TopKSantaStep(q, kv, k=4, S=8, seed=2)
    outs = torch.stack([step(q, kv).cpu().double() for _ in range(160)])
    mean, se = outs.mean(0), outs.std(0) / 160**0.5
    assert ((mean - dense).abs() <= 5 * se + 1e-5).all()
    assert not torch.equal(outs[0], outs[1])
    reads = step.read_counts(q, kv)
    assert 4 < int(reads.v_rows.max()) <= 4 + 3 * 8


def test_counter_uniforms():
    step = torch.zeros(1, dtype=torch.int64, device=DEVICE)
    u = ts.counter_uniform(7, step, (64, 1000)).cpu()
    assert u.min() >= 0 and u.max() < 1 and abs(float(u.mean()) - 0.5) < 0.01
    assert not torch.equal(u, ts.counter_uniform(7, step + 1, (64, 1000)).cpu())
    assert torch.equal(u, ts.counter_uniform(7, step, (64, 1000)).cpu())
