"""triton_rest_sample: the rest's masses from the score pass's stats (the default) against
the summing walk (``sums="pass"``), the systematic samples' slots at a split's edges, and
the step's estimate against dense attention (runs under TRITON_INTERPRET=1 on CPU; the
same tests run the compiled kernels on a GPU)."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported anywhere

import pytest
import torch

import santa_kernels as sk
from santa_kernels import selection as sel

ti = pytest.importorskip("santa_kernels.triton_indexed")
ts = pytest.importorskip("santa_kernels.triton_selection")
trs = pytest.importorskip("santa_kernels.triton_rest_sample")
_OK, _WHY = ti.indexed_available()
if not _OK:
    pytest.skip(f"triton-indexed unavailable: {_WHY}", allow_module_level=True)

DEVICE = "cuda" if _WHY == "cuda" else "cpu"


def _problem(kind, group=3, n=700, lengths=(700, 260), seed=0, hkv=2, d=16):
    """Gaussian (``random``), scores from a few integer rows (``tied``) or one strongly
    aligned key per sequence and KV head among Gaussian ones (``peaked``)."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(2, hkv * group, d, generator=gen) * 2.0
    k = torch.randn(2, n, hkv, d, generator=gen)
    if kind == "tied":
        q = torch.randint(-2, 3, q.shape, generator=gen).float()
        k = torch.randint(-1, 2, (12, d), generator=gen).float()[
            torch.randint(0, 12, (2, n, hkv), generator=gen)]
    elif kind == "peaked":  # a token far above the rest in each head, a little mass left
        q = q * 3.0
        for g in range(hkv):
            k[:, 5 + 40 * g, g] = q[:, g * group:(g + 1) * group].mean(1) / 2.0
    v = torch.randn(2, n, hkv, d, generator=gen)
    kv = sk.KVCache.contiguous(k.to(DEVICE), v.to(DEVICE), torch.tensor(lengths, device=DEVICE))
    return q.to(DEVICE), kv


def _plans(q, kv, calls=3, **options):
    """``calls`` plans of one step (each a fresh draw): rows, log-weights, rest masses
    and the step counter each drew with."""
    step = ts.TopKSantaStep(q, kv, seed=7, **options)
    assert step.top.splits > 1
    out = []
    for _ in range(calls):
        rows = step.plan(q, kv).cpu().clone()
        out.append((rows, step.log_weights.cpu().clone(), step.sampler.rest.cpu().clone(),
                    step.rng.clone()))
    return step, out


@pytest.mark.parametrize(("kind", "k", "group"), [("random", 0, 3), ("tied", 16, 3),
                                                   ("random", 40, 1)])
def test_the_rest_masses_from_the_stats_draw_what_the_summing_walk_draws(kind, k, group):
    """Draw by draw, the same sample rows and (up to rounding) log-weights and rest masses
    as the masses summed over every token, rows shorter than the capacity included."""
    q, kv = _problem(kind, group=group)
    _, stats = _plans(q, kv, calls=2, k=k, S=8)
    _, summed = _plans(q, kv, calls=2, k=k, S=8, rest_sums="pass")
    for (rows, lw, rest, _), (rows_p, lw_p, rest_p, _) in zip(stats, summed, strict=True):
        assert torch.equal(rows, rows_p)
        assert torch.equal(lw.isinf(), lw_p.isinf())
        ok = lw.isfinite()
        assert torch.allclose(lw[ok], lw_p[ok], rtol=1e-5, atol=2e-5)
        assert torch.allclose(rest, rest_p, rtol=1e-5, atol=1e-6)
    assert not torch.equal(stats[0][0], stats[1][0])  # fresh draws


def _check_samples(step, plan, k, S, lengths, exact=True):
    """Each head with rest mass has ``S`` samples, one a slot: off the top set, within
    its sequence, in token order, each weighed ``log(M / S) + lse − s``, and (``exact``)
    where ``searchsorted`` puts the call's systematic draws on the float64 running sum of
    the rest (so they are distributed as the reference's; on peaked scores the fp32 sum
    drops tokens below its rounding); a head without keeps none."""
    rows, lw, rest, rng = plan
    batch, hq, _ = lw.shape
    group = hq // rows.shape[1]
    rest = rest.view(batch, hq, -1).double().sum(-1)
    scores = step.scores.cpu().double()
    lse = torch.logsumexp(scores, -1)
    probs = torch.softmax(scores, -1)
    for g in range(rows.shape[1]):
        for b in range(batch):
            top = rows[b, g, :k]
            probs[b, g * group:(g + 1) * group, top[top >= 0].long()] = 0.0
    u = ts.counter_uniform(step.seed, rng, (batch, hq, 1)).cpu().double()
    drawn = torch.searchsorted(probs.cumsum(-1), (u + torch.arange(S)) / S * rest[..., None],
                               right=True)
    for b in range(batch):
        for h in range(hq):
            g, j = divmod(h, group)
            top = set(rows[b, g, :k].tolist()) - {-1}
            got = rows[b, g, k + j * S:k + (j + 1) * S]
            w = lw[b, h, k + j * S:k + (j + 1) * S].double()
            if rest[b, h] == 0:
                assert (got == -1).all() and w.isneginf().all()
                continue
            assert (got >= 0).all() and (got < lengths[b]).all(), got
            assert not top & set(got.tolist())
            assert (got[1:] >= got[:-1]).all()
            assert not exact or torch.equal(got.long(), drawn[b, h])
            want = (rest[b, h] / S).log() + lse[b, h] - scores[b, h, got.long()]
            assert torch.allclose(w, want, atol=1e-4)


@pytest.mark.parametrize(("kind", "k"), [("peaked", 0), ("peaked", 8), ("peaked", 40),
                                         ("tied", 8), ("random", 40)])
def test_every_slot_of_a_head_with_rest_mass_holds_one_sample(kind, k):
    """Peaked scores (the top set holding nearly all of a split's mass: its rest mass
    from the stats is rounding there) and ties: no draw leaves its split's range or a
    slot."""
    q, kv = _problem(kind, group=2, lengths=(700, 77))
    step, plans = _plans(q, kv, calls=3, k=k, S=16)
    for plan in plans:
        _check_samples(step, plan, k, 16, kv.lengths.tolist(), exact=kind != "peaked")


def _whole_split_problem():
    """Sequences whose first split's tokens score well above the others (a top set of
    its size takes it whole), the rest keeping some mass."""
    q, kv = _problem("random", group=2, n=640, lengths=(640, 500), seed=3)
    span = ts.TopKSantaStep(q, kv, k=8, S=4).top.tiles_per_split * ti.SCORE_BLOCK_N[16]
    k = kv.k.clone()
    for g in range(kv.num_kv_heads):
        k[:, :span, g] = k[:, :span, g] * 0.1 + q[:, 2 * g:2 * g + 2].mean(1)[:, None] * 1.5
    return q, sk.KVCache.contiguous(k, kv.v, kv.lengths), span


def test_a_split_the_top_set_takes_whole_has_no_rest_mass_and_no_sample():
    q, kv, span = _whole_split_problem()
    step, plans = _plans(q, kv, calls=4, k=span, S=16)
    for plan in plans:
        rows, _, rest, _ = plan
        assert torch.equal(rows[:, :, :span].sort(-1).values,
                           torch.arange(span, dtype=torch.int32).expand(2, 2, span))
        splits = rest.view(2, 4, -1)
        assert (splits[..., 0] == 0).all() and (splits[..., 1:].sum(-1) > 0).all()
        assert (rows[:, :, span:] >= span).all()
        _check_samples(step, plan, span, 16, kv.lengths.tolist())


def test_a_top_set_of_every_token_leaves_no_rest():
    q, kv = _problem("random", group=2, n=640, lengths=(640, 41))
    _, plans = _plans(q, kv, calls=1, k=640, S=4)
    rows, lw, rest, _ = plans[0]
    assert (rest == 0).all() and (rows[:, :, 640:] == -1).all()
    assert lw[:, :, 640:].isneginf().all()


def test_the_plans_are_unbiased_where_the_top_set_takes_most_of_a_split():
    """The mean of many draws' estimates (the rows and log-weights of each, attended in
    float64) against dense attention, within 5 standard errors."""
    q, kv, span = _whole_split_problem()
    cpu = sk.KVCache.contiguous(kv.k.cpu(), kv.v.cpu(), kv.lengths.cpu())
    dense = sk.dense_attention(q.cpu(), cpu, compute_dtype=torch.float64).out
    step = ts.TopKSantaStep(q, kv, k=span - 40, S=8, seed=1)
    step.plan(q, kv)  # the scores and the top set, then many draws of the rest
    draws, outs = 30, []
    for _ in range(draws):
        step.rng += 1
        step.sampler.run(kv, step.rows, step.log_weights, step.rng, 12345)
        outs.append(sel.indexed_reference(q.cpu(), cpu, step.rows.cpu(),
                                          step.log_weights.cpu()))
    outs = torch.stack(outs)
    mean, se = outs.mean(0), outs.std(0) / draws**0.5
    assert ((mean - dense).abs() <= 5 * se + 1e-6).all()
    assert not torch.equal(outs[0], outs[1])


def test_the_sampler_refuses_an_unknown_source_of_masses():
    q, kv = _problem("random", n=300, lengths=(300, 41))
    top = ts.TopKSelect(q, kv, 8, scale=0.25)
    with pytest.raises(sk.InputError, match=r"^sums: expected one of stats, pass, "
                                            r"got 'walk'$"):
        trs.RestSampler(top, 8, 4, sums="walk")


class _Skipped:
    """A kernel whose launches do nothing (the rest masses set by the test instead)."""

    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


@pytest.mark.parametrize(("scale0", "scale1"), [(1.3, 0.7), (0.6, 1.0)])
def test_rest_masses_off_the_walks_sums_keep_each_split_to_its_own_slots(monkeypatch, scale0,
                                                                          scale1):
    """Split masses unlike the walk's sums (as rounding makes them, here scaled): each
    split writes only the slots between its earlier splits' masses and its own end, the
    slots its walk falls short of go to its last token of the rest, and every slot of a
    head holds one sample."""
    q, kv = _problem("random", group=2, n=640, lengths=(640, 500), seed=4)
    S, k = 16, 8
    step = ts.TopKSantaStep(q, kv, k=k, S=S, seed=2)
    span = step.top.tiles_per_split * step.top.block_n
    assert step.top.splits == 2
    step.plan(q, kv)
    rest = step.sampler.rest.view(2, 4, 2)
    rest[..., 0] *= scale0
    rest[..., 1] *= scale1
    step.rows[..., k:] = -1
    step.log_weights[..., k:] = float("-inf")
    monkeypatch.setattr(trs, "_rest_stats_kernel", _Skipped())
    step.sampler.run(kv, step.rows, step.log_weights, step.rng,
                     (step.seed ^ ts.UNIFORM_KEY) & 0x7FFFFFFF)
    rows, lw = step.rows.cpu(), step.log_weights.cpu()
    r = rest.cpu().double()
    mass = r.sum(-1)
    u = ts.counter_uniform(step.seed, step.rng, (2, 4, 1)).cpu().double()[..., 0]
    scores = step.scores.cpu().double()
    for b in range(2):
        for h in range(4):
            g, j = divmod(h, 2)
            got = rows[b, g, k + j * S:k + (j + 1) * S].long()
            w = lw[b, h, k + j * S:k + (j + 1) * S].double()
            assert (got >= 0).all() and (got[1:] >= got[:-1]).all()
            pos = (u[b, h] + torch.arange(S)) * mass[b, h] / S
            owned = int((pos < r[b, h, 0]).sum())  # split 0's slots
            assert (got[:owned] < span).all() and (got[owned:] >= span).all()
            top = set(rows[b, g, :k].tolist())
            off = [t for t in range(span) if t not in top]
            probs = torch.softmax(scores[b, h], -1)
            walked = float(probs[off].sum())  # split 0's walk ends here
            short = (pos < r[b, h, 0]) & (pos >= walked * (1 + 1e-6))
            assert (got[short] == off[-1]).all()
            want = (mass[b, h] / S).log() + torch.logsumexp(scores[b, h], -1) - scores[b, h, got]
            assert torch.allclose(w, want, atol=1e-4)
            if scale0 > 1:
                assert short.any()  # the case this draws
