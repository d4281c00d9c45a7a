"""triton-indexed and the selection fast paths against their references (runs under
TRITON_INTERPRET=1 on CPU; the same tests run the compiled kernels on a GPU)."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported anywhere

import math
from functools import partial

import pytest
import torch

import santa_kernels as sk
from conftest import decode_problem, kv_on, record_launches
from santa_kernels import selection as sel
from santa_kernels.scores import exact_scores

ti = pytest.importorskip("santa_kernels.triton_indexed")
ts = pytest.importorskip("santa_kernels.triton_selection")
_OK, _WHY = ti.indexed_available()
if not _OK:
    pytest.skip(f"triton-indexed unavailable: {_WHY}", allow_module_level=True)

DEVICE = "cuda" if _WHY == "cuda" else "cpu"
TOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2}
STRIDE = 256  # draws kept apart per (sequence, KV head) in the launch-option tests

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


# ---------------------------------------------- vAttention's tail under the launch options
# the rows a step (chunk) and the split count change how the draws are gathered, never
# which tokens are drawn or what they estimate
def _tail(count, lo, hi, exclude=None, seed=3):
    """A tail of ``count [B, Hkv]`` draws over ``[lo, hi)`` weighted ``n_s / count``."""
    count = torch.tensor(count, dtype=torch.int32)
    lo, hi = torch.tensor(lo, dtype=torch.int32), torch.tensor(hi, dtype=torch.int32)
    log_w = torch.log((hi - lo).clamp_min(1)[:, None].float() / count.clamp_min(1).float())
    rng = torch.zeros(1, dtype=torch.int64, device=DEVICE)
    return ti.UniformTail(count.to(DEVICE), lo.to(DEVICE), hi.to(DEVICE), log_w.to(DEVICE),
                          None if exclude is None else exclude.to(DEVICE), rng, seed=seed,
                          stride=STRIDE)


def _drawn(q, kv, tail, idx=None, **launch):
    """``(out, samples [B·Hkv, STRIDE])`` of one call."""
    samples = torch.full((tail.count.numel(), STRIDE), -1, dtype=torch.int32, device=DEVICE)
    out = ti.indexed_attention(q, kv, idx, tail=tail, samples=samples, **launch)
    return out.cpu(), samples.cpu()


# 5 draws over 13 splits: most splits empty; 150 >= the range: each token once; 0: none
COUNTS = [[5, 37], [150, 0]]
LAUNCHES = [dict(chunk=16, num_splits=1), dict(chunk=16, num_splits=13),
            dict(chunk=32, num_splits=3), dict(chunk=128, num_splits=2),
            dict(chunk=256, num_splits=5)]


@pytest.mark.parametrize("launch", LAUNCHES, ids=lambda x: f"{x['chunk']}x{x['num_splits']}")
def test_the_draws_and_the_output_do_not_depend_on_the_rows_a_step_or_the_splits(launch):
    """The same tokens drawn as by the default launch (keyed by draw, not by tile or
    split), the whole range read once where the count reaches it, exclusions and short
    rows alike; the output the reference's over the listed and drawn rows."""
    q, kv = _problem()
    exclude = torch.zeros(2, 2, 150, dtype=torch.uint8)
    exclude[:, :, 10:40] = 1
    tail = _tail(COUNTS, [4, 4], [140, 70], exclude)
    idx = torch.tensor([[[0, 1, 2], [149, -1, 3]], [[76, 75, -1], [0, 1, 2]]],
                       dtype=torch.int32, device=DEVICE)
    base_out, base = _drawn(q, kv, tail, idx)
    out, samples = _drawn(q, kv, tail, idx, **launch)
    assert torch.equal(samples, base)
    drawn = samples.view(2, 2, STRIDE).long()
    assert ((drawn >= 0).sum(-1) == torch.tensor([[5, 37], [66, 0]])).all()
    assert drawn[1, 0, :66].tolist() == list(range(4, 70))
    assert torch.allclose(out, base_out, atol=1e-5)
    lw = tail.log_weight.cpu()[..., None].expand(2, 2, STRIDE).clone()
    lw[exclude.long().gather(2, drawn.clamp_min(0)) > 0] = float("-inf")
    tokens = torch.cat([idx.cpu().long(), drawn], -1)
    weights = torch.cat([torch.zeros(2, 2, 3), lw], -1)
    ref = sel.indexed_reference(q.cpu(), sk.KVCache.contiguous(kv.k.cpu(), kv.v.cpu(),
                                                               kv.lengths.cpu()),
                                tokens, weights)
    assert float((out.double() - ref).norm() / ref.norm()) < 1e-4


def test_a_chunk_outside_the_tile_sizes_is_refused():
    q, kv = _problem()
    tail = _tail(COUNTS, [4, 4], [140, 70])
    for chunk in (8, 48, 512, True):
        with pytest.raises(sk.InputError, match=r"^chunk: expected one of 16, 32, 64, 128, "):
            ti.indexed_attention(q, kv, tail=tail, chunk=chunk)


def test_the_tail_sums_are_unbiased_for_any_launch():
    """Hansen-Hurwitz: over 120 steps the tail's weighted sums ``Σ w e^s`` and
    ``Σ w e^s v`` (read from the split partials) average to the range's exact sums less
    the excluded tokens, within 5 standard errors, at two launches that draw alike."""
    q, kv = _problem(batch=1, hkv=1, group=2, lengths=(150,), q_scale=1.5)
    exclude = torch.zeros(1, 1, 150, dtype=torch.uint8)
    exclude[0, 0, [20, 21, 90]] = 1
    lo, hi, count = 10, 130, 30
    tail = _tail([[count]], [lo], [hi], exclude, seed=11)
    keys, values, valid = kv.padded(torch.float64)
    scores, _ = exact_scores(q.double().cpu(), keys.cpu(), valid.cpu(),
                             1.0 / math.sqrt(16), 2)  # [1, 2, 150]
    expo = scores.exp()[0]  # [2, N]
    keep = torch.zeros(150, dtype=torch.bool)
    keep[lo:hi] = True
    keep &= exclude[0, 0] == 0
    want_den = (expo * keep).sum(-1)  # [2]
    want_num = (expo * keep) @ values.cpu()[0, :, 0]  # [2, d]
    for chunk, splits in ((16, 4), (64, 3)):
        ws = ti.IndexedWorkspace(1, 2, 16, splits, device=DEVICE)
        tail.rng.zero_()
        dens, nums = [], []
        for _ in range(120):
            ti.indexed_attention(q, kv, tail=tail, workspace=ws, chunk=chunk)
            rows = 2 * splits
            m = ws.partial_m[:rows].cpu().double().view(2, splits)
            lsum = ws.partial_l[:rows].cpu().double().view(2, splits)
            acc = ws.partial_out[:rows * 16].cpu().double().view(2, splits, 16)
            scale = torch.where(torch.isfinite(m), torch.exp2(m), torch.zeros_like(m))
            dens.append((scale * lsum).sum(-1))
            nums.append((scale[..., None] * acc).sum(1))
            tail.rng.add_(1)
        den, num = torch.stack(dens), torch.stack(nums)
        se_den = den.std(0) / math.sqrt(len(dens))
        se_num = num.std(0) / math.sqrt(len(nums))
        assert ((den.mean(0) - want_den).abs() <= 5 * se_den).all()
        assert ((num.mean(0) - want_num).abs() <= 5 * se_num + 1e-9).all()


def test_vattention_steps_built_with_other_launches_draw_alike():
    """Steps whose attend takes other rows a step and programs an SM (so other splits)
    give the same output and read the same rows as a default step, step after step."""
    q, kv = _problem(batch=1, n=300, lengths=(300,), q_scale=1.5)
    params = dict(sink=4, window=4, topk=8, epsilon=0.3, delta=0.3, base_rate=0.05, seed=7)
    plain = ts.VAttentionStep(q, kv, **params)
    other = ts.VAttentionStep(q, kv, **params, attend_chunk=16, attend_programs_per_sm=40,
                              attend_max_registers=None, attend_stages=2)
    assert other.chunk == 16 and plain.chunk == ti.CHUNK[16]
    assert other.max_registers is None
    assert plain.max_registers == ts.VATTENTION_MAX_REGISTERS
    assert other.workspace.num_splits != plain.workspace.num_splits
    for _ in range(2):
        assert torch.allclose(other(q, kv).cpu(), plain(q, kv).cpu(), atol=1e-5)
    assert torch.equal(other.read_counts(q, kv).v_rows, plain.read_counts(q, kv).v_rows)


def test_vattention_splits_its_attend_for_the_whole_range():
    """The attend's splits are chosen for the exact rows and the largest tail (the whole
    sampled range), at VATTENTION_PROGRAMS_PER_SM programs an SM by default."""
    q, kv = _problem(batch=1, hkv=1, group=2, n=4096, lengths=(4096,))
    step = ts.VAttentionStep(q, kv, sink=16, window=16, topk=32)
    rows = 16 + 16 + 32 + (4096 - 32)
    assert step.attend_programs_per_sm == ts.VATTENTION_PROGRAMS_PER_SM
    assert step.workspace.num_splits == ti.choose_splits(q, kv, rows,
                                                         ts.VATTENTION_PROGRAMS_PER_SM)
    # the exact rows and an eighth of the capacity left 4 splits on 132 SMs
    assert step.workspace.num_splits > ti.choose_splits(q, kv, 64 + 4096 // 8)
    with pytest.raises(sk.InputError, match=r"^chunk: "):
        ts.VAttentionStep(q, kv, attend_chunk=24)


def test_vattention_steps_launch_their_attend_with_their_registers_and_stages(monkeypatch):
    """attend_max_registers and attend_stages reach the row programs' launch as maxnreg
    and num_stages (the defaults' constants, other values, or none), for the call and for
    read_counts alike."""
    q, kv = _problem(batch=1, n=200, lengths=(200,))
    launches = record_launches(monkeypatch, ti._indexed_stage1)
    params = dict(sink=4, window=4, topk=8, seed=2)
    defaults = (ts.VATTENTION_MAX_REGISTERS, ts.VATTENTION_STAGES)
    for cap, stages in (defaults, (96, 2), (None, None)):
        launches.clear()
        step = (ts.VAttentionStep(q, kv, **params) if (cap, stages) == defaults
                else ts.VAttentionStep(q, kv, **params, attend_max_registers=cap,
                                       attend_stages=stages))
        step(q, kv)
        step.read_counts(q, kv)
        assert [(kw.get("maxnreg", "unset"), kw.get("num_stages", "unset"))
                for k, kw, *_ in launches if k is ti._indexed_stage1] == [(cap, stages)] * 2
    for name in ("attend_max_registers", "attend_stages"):
        for bad in (0, -4, 1.5):
            with pytest.raises(sk.InputError, match=rf"^{name}: "):
                ts.VAttentionStep(q, kv, **params, **{name: bad})
    rows = torch.zeros(1, 2, 4, dtype=torch.int32, device=DEVICE)
    for name in ("max_registers", "stages"):
        with pytest.raises(sk.InputError, match=rf"^{name}: "):
            ti.indexed_attention(q, kv, rows, **{name: 0})


def test_the_exclusions_read_a_word_or_a_byte_at_a_time_alike():
    """An exclude map of whole aligned 4-byte words (the kernel reads its marks a word at
    a time), a row-padded view of one and a map starting off a word (a byte at a time):
    the same draws counted and the same output, marks at every byte of a word."""
    q, kv = _problem()
    marks = torch.zeros(2, 2, 152, dtype=torch.uint8)
    marks[0, 1, 20:24] = 1  # a whole word
    marks[0, 1, [41, 66, 67]] = 1
    marks[1, 0, [5, 6, 60]] = 1
    padded = torch.zeros(2, 2, 153, dtype=torch.uint8)
    padded[..., :152] = marks
    shifted = torch.zeros(2 * 2 * 152 + 1, dtype=torch.uint8)[1:].view(2, 2, 152)
    shifted.copy_(marks)
    idx = torch.tensor([[[0, 1, 2], [149, -1, 3]], [[76, 75, -1], [0, 1, 2]]],
                       dtype=torch.int32, device=DEVICE)
    runs = []
    for exclude in (marks, padded[..., :152], shifted):
        assert ti._word_readable(exclude.to(DEVICE)) == (exclude is marks)
        tail = _tail([[40, 90], [150, 3]], [4, 4], [140, 70], exclude.to(DEVICE), seed=5)
        runs.append(_drawn(q, kv, tail, idx, chunk=32, num_splits=3))
    for out, samples in runs[1:]:
        assert torch.equal(samples, runs[0][1])
        assert torch.allclose(out, runs[0][0], atol=1e-6)
    drawn = runs[0][1].view(2, 2, STRIDE).long()
    lw = _tail([[40, 90], [150, 3]], [4, 4], [140, 70]).log_weight.cpu()
    lw = lw[..., None].expand(2, 2, STRIDE).clone()
    hit = marks.long().gather(2, drawn.clamp_min(0)) > 0
    assert int(hit[0, 1].sum()) > 0 and int(hit[1, 0].sum()) > 0
    lw[hit] = float("-inf")
    tokens = torch.cat([idx.cpu().long(), drawn], -1)
    weights = torch.cat([torch.zeros(2, 2, 3), lw], -1)
    ref = sel.indexed_reference(q.cpu(), sk.KVCache.contiguous(kv.k.cpu(), kv.v.cpu(),
                                                               kv.lengths.cpu()),
                                tokens, weights)
    assert float((runs[0][0].double() - ref).norm() / ref.norm()) < 1e-4
