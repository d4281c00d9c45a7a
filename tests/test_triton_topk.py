"""triton-topk: the score pass with its stats and the radix select, against torch and, on
model-like inputs, a stable sort (runs under TRITON_INTERPRET=1 on CPU; the same tests run
the compiled kernels on a GPU)."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported anywhere

import pytest
import torch

import santa_kernels as sk

ti = pytest.importorskip("santa_kernels.triton_indexed")
tk = pytest.importorskip("santa_kernels.triton_topk")
_OK, _WHY = ti.indexed_available()
if not _OK:
    pytest.skip(f"triton-indexed unavailable: {_WHY}", allow_module_level=True)

DEVICE = "cuda" if _WHY == "cuda" else "cpu"


def _tied_problem(batch=2, hkv=2, group=3, n=600, d=16, lengths=(600, 77), pool=12, seed=0):
    """Keys drawn from ``pool`` integer rows, so many tokens share a score (ties in every
    head, hence in the group's summed probabilities)."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randint(-2, 3, (batch, hkv * group, d), generator=gen).float()
    rows = torch.randint(-1, 2, (pool, d), generator=gen).float()
    pick = torch.randint(0, pool, (batch, n, hkv), generator=gen)
    k = rows[pick]
    v = torch.randn(batch, n, hkv, d, generator=gen)
    kv = sk.KVCache.contiguous(k.to(DEVICE), v.to(DEVICE), torch.tensor(lengths, device=DEVICE))
    return q.to(DEVICE), kv


def _random_problem(batch=2, hkv=2, group=4, n=700, d=16, lengths=(700, 341), seed=1):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, hkv * group, d, generator=gen) * 2.0
    k = torch.randn(batch, n, hkv, d, generator=gen)
    v = torch.randn(batch, n, hkv, d, generator=gen)
    return q.to(DEVICE), sk.KVCache.contiguous(k.to(DEVICE), v.to(DEVICE),
                                               torch.tensor(lengths, device=DEVICE))


def _select(q, kv, k, per_head, sink=0, window=0, **options):
    scale = q.shape[-1] ** -0.5
    top = tk.TopKSelect(q, kv, k, per_head=per_head, scale=scale, **options)
    width = k * (top.group if per_head else 1)
    out = torch.full((q.shape[0], kv.num_kv_heads, width), 7, dtype=torch.int32,
                     device=q.device)
    top.run_scores(q, kv)
    top.run_select(kv, out, sink, window)
    assert top.splits > 1  # the stats of several splits are merged
    return top, out.cpu()


def _check_top_set(chosen, values, allowed, k):
    """``chosen [k]`` (-1 padded) is a top-``k`` set of ``values [N]`` over ``allowed``:
    distinct, allowed, ``min(k, allowed)`` of them, none smaller than a left-out one."""
    picked = chosen[chosen >= 0].long()
    assert torch.equal(chosen[: len(picked)], chosen[chosen >= 0])  # -1 only at the end
    assert len(set(picked.tolist())) == len(picked) == min(k, int(allowed.sum()))
    assert allowed[picked].all()
    rest = allowed.clone()
    rest[picked] = False
    if rest.any() and len(picked):
        assert values[picked].min() >= values[rest].max()
    # the same values as torch.topk's set (the sets agree up to ties)
    ref = values.masked_fill(~allowed, float("-inf")).topk(len(picked)).values
    assert torch.equal(values[picked].sort(descending=True).values, ref)


@pytest.mark.parametrize("k", [1, 20, 77, 400, 600])
@pytest.mark.parametrize("tied", [False, True])
def test_select_per_head_is_torch_topk_of_the_scores(k, tied):
    q, kv = (_tied_problem if tied else _random_problem)()
    top, out = _select(q, kv, k, per_head=True)
    scores = top.scores.cpu()
    lengths = kv.lengths.cpu()
    n = scores.shape[-1]
    for b in range(q.shape[0]):
        allowed = torch.arange(n) < lengths[b]
        for h in range(q.shape[1]):
            g, j = divmod(h, top.group)
            _check_top_set(out[b, g, j * k:(j + 1) * k], scores[b, h], allowed, k)


@pytest.mark.parametrize("k", [1, 20, 77, 400, 600])
@pytest.mark.parametrize("tied", [False, True])
def test_select_by_group_mass_is_torch_topk_of_the_summed_probabilities(k, tied):
    q, kv = (_tied_problem if tied else _random_problem)()
    top, out = _select(q, kv, k, per_head=False)
    scores, mass = top.scores.cpu().double(), top.mass.cpu()
    lengths = kv.lengths.cpu()
    n = scores.shape[-1]
    assert torch.allclose(top.lse.cpu().double(), torch.logsumexp(scores, -1), atol=1e-5)
    probs = torch.softmax(scores, -1).view(q.shape[0], kv.num_kv_heads, top.group, n).sum(2)
    for b in range(q.shape[0]):
        allowed = torch.arange(n) < lengths[b]
        assert torch.allclose(mass[b][:, allowed].double(), probs[b][:, allowed], atol=1e-6)
        assert (mass[b][:, ~allowed] == -1).all()
        for g in range(kv.num_kv_heads):
            _check_top_set(out[b, g], mass[b, g], allowed, k)
    assert int(top.hist.abs().sum()) == 0  # zeroed for the next call


def test_select_between_a_sink_and_a_window_and_its_threshold():
    q, kv = _tied_problem(lengths=(600, 95))
    top, out = _select(q, kv, 30, per_head=False, sink=10, window=50)
    lo, hi = torch.tensor([10, 10]), torch.tensor([550, 45])
    mass = top.mass.cpu()
    n = mass.shape[-1]
    keys = mass.view(torch.int32).long()  # non-negative floats: bits in value order
    for b in range(2):
        allowed = (torch.arange(n) >= lo[b].item()) & (torch.arange(n) < hi[b].item())
        for g in range(kv.num_kv_heads):
            _check_top_set(out[b, g], mass[b, g], allowed, 30)
            # chosen exactly when key > T, or key == T up to the last tie taken
            row = b * kv.num_kv_heads + g
            thr, last = int(top.thr_key[row]) & 0x7FFFFFFF, int(top.thr_tok[row])
            mark = allowed & ((keys[b, g] > thr) | ((keys[b, g] == thr)
                                                    & (torch.arange(n) <= last)))
            chosen = torch.zeros(n, dtype=torch.bool)
            chosen[out[b, g][out[b, g] >= 0].long()] = True
            assert torch.equal(mark, chosen)


def test_scores_and_stats_match_torch_contiguous_and_paged():
    q, kv = _random_problem(n=500, lengths=(500, 233))
    paged = kv.to_paged(16, generator=torch.Generator().manual_seed(0))
    scale = q.shape[-1] ** -0.5
    for cache in (kv, paged):
        ref = ti.qk_scores(q, cache, scale=scale).cpu()
        top = tk.TopKSelect(q, cache, 8, scale=scale)
        assert torch.allclose(top.run_scores(q, cache).cpu(), ref, atol=1e-5)
        out = torch.empty(2, 2, 8, dtype=torch.int32, device=DEVICE)
        top.run_select(cache, out)
        assert torch.allclose(top.lse.cpu(), torch.logsumexp(ref, -1), atol=1e-5)


@pytest.mark.parametrize(("k", "group"), [(0, 3), (16, 3), (16, 1)])
def test_rest_samples_are_torch_systematic_samples_of_the_rest(k, group):
    """The rest sampler's tokens and log-weights against ``searchsorted`` on the
    cumulative rest (the same uniform per head), its rest sums against torch."""
    ts = pytest.importorskip("santa_kernels.triton_selection")
    q, kv = _random_problem(hkv=2, group=group, n=700, lengths=(700, 260))
    S = 8
    step = ts.TopKSantaStep(q, kv, k=k, S=S, seed=4)
    assert step.top.splits > 1
    rows = step.plan(q, kv).cpu().long()
    scores = step.scores.cpu().double()
    batch, hq, _ = scores.shape
    group = hq // kv.num_kv_heads
    probs = torch.softmax(scores, -1)
    rest = probs.clone()
    if k:
        for b in range(batch):
            for g in range(kv.num_kv_heads):
                top = rows[b, g, :k]
                rest[b, g * group:(g + 1) * group, top[top >= 0]] = 0.0
    mass = rest.sum(-1)
    sums = step.sampler.rest.view(batch, hq, -1).sum(-1).cpu().double()
    assert torch.allclose(sums, mass, rtol=1e-4, atol=1e-7)
    u = ts.counter_uniform(4, step.rng, (batch, hq, 1)).cpu().double()
    thresholds = (u + torch.arange(S)) / S * mass[..., None]
    drawn = torch.searchsorted(rest.cumsum(-1), thresholds, right=True)
    lw = step.log_weights.cpu().double()
    for b in range(batch):
        for h in range(hq):
            g, j = divmod(h, group)
            got = rows[b, g, k + j * S:k + (j + 1) * S]
            assert torch.equal(got, drawn[b, h])
            want = (mass[b, h].log() + torch.logsumexp(scores[b, h], -1) - torch.tensor(S).log()
                    - scores[b, h, got])
            assert torch.allclose(lw[b, h, k + j * S:k + (j + 1) * S], want, atol=1e-4)


@pytest.mark.parametrize("per_head", [False, True])
def test_select_with_every_token_tied_takes_the_first_ones(per_head):
    q, kv = _tied_problem(pool=1, lengths=(600, 150))
    top, out = _select(q, kv, 100, per_head=per_head)
    for b in range(2):
        for g in range(kv.num_kv_heads):
            width = 100 * (top.group if per_head else 1)
            assert out[b, g].tolist() == list(range(100)) * (width // 100)


@pytest.mark.parametrize("shared", ["group", "head"])
def test_oracle_topk_step_on_a_paged_cache_is_the_contiguous_one(shared):
    ts = pytest.importorskip("santa_kernels.triton_selection")
    q, kv = _random_problem(n=640, lengths=(640, 200))
    paged = kv.to_paged(16, generator=torch.Generator().manual_seed(2))
    flat = ts.OracleTopKStep(q, kv, k=40, shared=shared)
    pages = ts.OracleTopKStep(q, paged, k=40, shared=shared)
    assert torch.equal(flat.select(q, kv).cpu(), pages.select(q, paged).cpu())
    assert torch.allclose(flat(q, kv).cpu(), pages(q, paged).cpu(), atol=1e-6)


def _both_selects(make, k, per_head, sink=0, window=0):
    """The one-program-a-row select's and the spread select's results on one problem."""
    q, kv = make()
    runs = []
    for spread in (False, True):
        top, out = _select(q, kv, k, per_head, sink, window, spread=spread)
        runs.append((top, out))
    return runs


@pytest.mark.parametrize("per_head", [False, True])
@pytest.mark.parametrize(("tied", "k", "sink", "window"),
                         [(False, 1, 0, 0), (False, 150, 0, 0), (True, 64, 0, 0),
                          (True, 300, 20, 40), (False, 1500, 0, 0)])
def test_spread_select_takes_the_one_program_selects_tokens(per_head, tied, k, sink, window):
    """Split like the score pass (the second byte, then the writes and the last program's
    candidates): the same tokens per row, the same threshold and last tie, the
    histograms and arrival counts back at zero, the same list on a second call."""
    def make():
        fn = _tied_problem if tied else _random_problem
        return fn(batch=2, hkv=2, group=2, n=1500, d=16, lengths=(1500, 530), seed=3)

    (old, old_out), (new, new_out) = _both_selects(make, k, per_head, sink, window)
    assert new.splits > 4
    assert torch.equal(old_out.sort(-1).values, new_out.sort(-1).values)
    assert torch.equal(old.thr_key.cpu(), new.thr_key.cpu())
    assert torch.equal(old.thr_tok.cpu(), new.thr_tok.cpu())
    for buf in (new.hist, new.hist2, new.arrivals):
        assert int(buf.abs().sum()) == 0
    again = torch.full_like(new_out, 7).to(DEVICE)
    new.run_select(make()[1], again, sink, window)
    assert torch.equal(again.cpu(), new_out)


# spans of the select's programs against the score pass's (256 tokens at n = 1500 here):
# finer (64, 128: a last program of 28 or 92 tokens), coarser (512) and one program a row
SPANS = [64, 128, 512, 2048]


@pytest.mark.parametrize("span", SPANS)
@pytest.mark.parametrize(("per_head", "tied", "k", "sink", "window"),
                         [(False, True, 64, 0, 0), (False, False, 300, 20, 40),
                          (True, True, 150, 8, 24), (True, False, 1, 0, 0)])
def test_a_select_span_takes_the_default_spans_tokens(span, per_head, tied, k, sink, window):
    """``select_span`` splits the mass, second-byte and write kernels in spans of its own
    (at most the score pass's; the lse still from the score pass's splits): the same
    mass, tokens in the same order, threshold and last tie as the default span; buffers
    back at zero."""
    fn = _tied_problem if tied else _random_problem
    q, kv = fn(batch=2, hkv=2, group=2, n=1500, d=16, lengths=(1500, 530), seed=3)
    (old, old_out), (new, new_out) = (
        _select(q, kv, k, per_head, sink, window, **options)
        for options in ({}, {"select_span": span, "mass_block": min(span, tk.MASS_BLOCK)}))
    assert (old.splits, old.span, old.select_splits) == (6, 256, 6)
    capped = min(span, 256)  # at most the score pass's span
    assert (new.splits, new.span, new.select_splits) == (6, capped, -(-1500 // capped))
    assert torch.equal(old_out, new_out)
    for name in ("thr_key", "thr_tok") + (() if per_head else ("lse", "mass")):
        assert torch.equal(getattr(old, name).cpu(), getattr(new, name).cpu())
    for buf in (new.hist, new.hist2, new.arrivals):
        assert int(buf.abs().sum()) == 0


@pytest.mark.parametrize("span", [128, 256])
@pytest.mark.parametrize(("per_head", "tied", "k", "sink", "window"),
                         [(False, True, 64, 0, 0), (False, False, 300, 20, 40),
                          (True, True, 150, 8, 24), (True, False, 1, 0, 0)])
def test_the_finish_in_its_own_launch_takes_the_last_programs_tokens(span, per_head, tied, k,
                                                                     sink, window):
    """``finish_launch``: the candidates resolved by a launch of their own, a program a
    row, rather than the write kernel's last program: the same tokens in the same order,
    threshold and last tie; histograms back at zero and the arrival counts untouched."""
    fn = _tied_problem if tied else _random_problem
    q, kv = fn(batch=2, hkv=2, group=2, n=1500, d=16, lengths=(1500, 530), seed=5)
    (old, old_out), (new, new_out) = (
        _select(q, kv, k, per_head, sink, window, select_span=span,
                mass_block=min(span, tk.MASS_BLOCK), finish_launch=finish)
        for finish in (False, True))
    assert torch.equal(old_out, new_out)
    for name in ("thr_key", "thr_tok"):
        assert torch.equal(getattr(old, name).cpu(), getattr(new, name).cpu())
    for buf in (new.hist, new.hist2, new.arrivals):
        assert int(buf.abs().sum()) == 0


@pytest.mark.parametrize("span", [128, 2048])
def test_a_select_span_draws_the_same_rest_samples(span):
    """top-k + S²ANTA and vAttention with a select span: the same top set, systematic
    samples and log-weights (the rest sampler stays split like the score pass)."""
    ts = pytest.importorskip("santa_kernels.triton_selection")
    q, kv = _random_problem(batch=2, hkv=2, group=3, n=900, lengths=(900, 300), seed=6)
    plans = []
    for options in ({}, {"select_span": span, "mass_block": 128}):
        santa = ts.TopKSantaStep(q, kv, k=40, S=16, seed=1, select_options=options)
        vatt = ts.VAttentionStep(q, kv, sink=8, window=16, topk=32, seed=1,
                                 select_options=options)
        listed, tail = vatt.plan(q, kv)
        plans.append((santa.plan(q, kv).cpu(), santa.log_weights.cpu(), listed.cpu(),
                      tail.count.cpu(), tail.log_weight.cpu()))
        assert santa.sampler.rest.numel() == 2 * 6 * santa.top.splits
    for old, new in zip(*plans, strict=True):
        assert torch.equal(old, new)


@pytest.mark.parametrize("span", [64, 128, 4096])
def test_a_rest_span_draws_the_score_pass_spans_rest_samples(span):
    """top-k + S²ANTA with the rest sampler in spans of its own (``rest_span``; a longer
    one is capped at the score pass's): the same top set, systematic samples and
    log-weights as split like the score pass, its rest sums over its own splits."""
    ts = pytest.importorskip("santa_kernels.triton_selection")
    q, kv = _random_problem(batch=2, hkv=2, group=3, n=900, lengths=(900, 300), seed=8)
    plans = []
    for options in ({}, {"rest_span": span}):
        santa = ts.TopKSantaStep(q, kv, k=40, S=16, seed=2, **options)
        plans.append((santa.plan(q, kv).cpu(), santa.log_weights.cpu(),
                      santa.sampler.rest.view(2, 6, -1).sum(-1).cpu()))
        score_span = santa.top.tiles_per_split * santa.top.block_n
        assert santa.sampler.span == min(span if options else score_span, score_span)
        assert santa.sampler.splits == -(-900 // santa.sampler.span)
    assert plans[0][0].shape == plans[1][0].shape
    assert torch.equal(plans[0][0], plans[1][0])
    torch.testing.assert_close(plans[0][1], plans[1][1], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(plans[0][2], plans[1][2], rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("shared", ["group", "head"])
def test_oracle_topk_spread_select_chooses_the_references_rows(shared):
    """oracle-topk's rows against the reference's top-k mask and the one-program select;
    its output against both."""
    ts = pytest.importorskip("santa_kernels.triton_selection")
    from santa_kernels import selection as ref

    q, kv = _random_problem(batch=2, hkv=2, group=4, n=1200, lengths=(1200, 411), seed=5)
    k = 90
    outs, rows = [], []
    for spread in (False, True):
        step = ts.OracleTopKStep(q, kv, k=k, shared=shared,
                                 select_options={"spread": spread})
        rows.append(step.select(q, kv).cpu())
        outs.append(step(q, kv).cpu())
    assert torch.equal(rows[0].sort(-1).values, rows[1].sort(-1).values)
    assert torch.allclose(outs[0], outs[1], atol=1e-5)
    scored = ref._scored(q, kv, None, torch.float64)
    mask = ref.group_topk_mask(scored, k, shared).cpu()  # [B, Hq, N]
    group = q.shape[1] // kv.num_kv_heads
    for b in range(q.shape[0]):
        for h in range(q.shape[1]):
            g, j = divmod(h, group)
            got = rows[1][b, g] if shared == "group" else rows[1][b, g, j * k:(j + 1) * k]
            want = mask[b, h].nonzero().flatten()
            assert torch.equal(got[got >= 0].sort().values.long(), want)
    dense = ref.oracle_topk(q, kv, k=k, shared=shared).out.cpu()
    assert torch.allclose(outs[1], dense.to(outs[1].dtype), atol=1e-4)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_topk_santa_and_vattention_draw_the_same_with_the_spread_select(seed):
    """The random methods' plans under both selects, seed by seed: the same top set, the
    same systematic samples and log-weights (top-k + S²ANTA), the same exact rows and
    tail budget (vAttention), so their distributions are the one-program select's."""
    ts = pytest.importorskip("santa_kernels.triton_selection")
    q, kv = _random_problem(batch=2, hkv=2, group=3, n=900, lengths=(900, 300), seed=6)
    plans = []
    for spread in (False, True):
        options = {"spread": spread}
        santa = ts.TopKSantaStep(q, kv, k=40, S=16, seed=seed, select_options=options)
        rows = santa.plan(q, kv).cpu()
        vatt = ts.VAttentionStep(q, kv, sink=8, window=16, topk=32, seed=seed,
                                 select_options=options)
        listed, tail = vatt.plan(q, kv)
        plans.append((rows, santa.log_weights.cpu(), listed.cpu(), tail.count.cpu(),
                      tail.log_weight.cpu(), vatt.top.token_scores.cpu()))
    (rows0, lw0, listed0, count0, tlw0, ex0), (rows1, lw1, listed1, count1, tlw1, ex1) = plans
    assert torch.equal(rows0[..., :40].sort(-1).values, rows1[..., :40].sort(-1).values)
    assert torch.equal(rows0[..., 40:], rows1[..., 40:])
    assert torch.equal(lw0, lw1)
    assert torch.equal(listed0[..., :24], listed1[..., :24])
    assert torch.equal(listed0[..., 24:].sort(-1).values, listed1[..., 24:].sort(-1).values)
    assert torch.equal(count0, count1) and torch.equal(tlw0, tlw1) and torch.equal(ex0, ex1)


@pytest.mark.parametrize("tail_scores", ["stash", "token"])
def test_vattention_and_topk_santa_plans_are_kernels_only(tail_scores):
    """A plan advances the step counter in its score pass and leaves vAttention's top-k
    out of its tail in its plan kernel (clearing the last call's marks, or -inf in the
    token-major copy): no torch op (a launch of its own) besides the kernels, and the
    same counter, exclusions and draws as when torch did both."""
    from torch.utils._python_dispatch import TorchDispatchMode

    ts = pytest.importorskip("santa_kernels.triton_selection")

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.add(func.__name__)
            return func(*args, **(kwargs or {}))

    q, kv = _random_problem(batch=2, hkv=2, group=2, n=400, lengths=(400, 150), seed=8)
    vatt = ts.VAttentionStep(q, kv, sink=4, window=8, topk=16, seed=3, tail_scores=tail_scores)
    santa = ts.TopKSantaStep(q, kv, k=8, S=4, seed=3)
    for _ in range(2):  # the second call clears the first call's marks
        for step in (vatt, santa):
            with Ops() as ops:
                step.plan(q, kv)
            assert not {"add_.Tensor", "zero_.default", "fill_.Scalar"} & ops.names
    assert int(vatt.rng) == int(santa.rng) == 2
    for b in range(2):
        for g in range(kv.num_kv_heads):
            top = vatt.listed[b, g, 12:].cpu()
            top = top[top >= 0].sort().values.long()
            if tail_scores == "stash":
                marked = vatt.exclude[b, g].nonzero().flatten().cpu()
            else:  # -inf on the top-k, and past the length as in the stash
                out = vatt.top.token_scores[b, g, :, 0].cpu() == float("-inf")
                out &= vatt.scores[b, g * 2].cpu() > float("-inf")
                marked = out.nonzero().flatten()
            assert torch.equal(marked, top)
    # the second call's draws: those of a fresh step at counter 1 (torch advancing it)
    fresh = ts.VAttentionStep(q, kv, sink=4, window=8, topk=16, seed=3,
                              tail_scores=tail_scores)
    fresh.reset_rng(1)
    _, tail = fresh.plan(q, kv)
    assert torch.equal(tail.count.cpu(), vatt.count.cpu())
    assert torch.equal(tail.log_weight.cpu(), vatt.log_weight.cpu())


# inputs like a model's (Gaussian, peaked, tied, near-equal scores), seed by seed,
# against a stable torch sort: the same tokens (ties in token order), threshold, last tie
HKV, GROUP, D = 2, 2, 16


def _problem(kind: str, seed: int, n: int, lengths: tuple[int, int]):
    """Queries and a cache whose scores are ``kind``: ``gauss`` (spread), ``peaked`` (a
    few tokens far above the rest, whose probabilities underflow to ties at 0), ``tied``
    (keys from a pool of 6 rows) or ``narrow`` (keys equal but for tiny noise: every
    token in the k-th key's bucket)."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(2, HKV * GROUP, D, generator=gen)
    k = torch.randn(2, n, HKV, D, generator=gen)
    if kind == "peaked":
        q = q * 3.0
        for b in range(2):
            hot = torch.randperm(n, generator=gen)[:5]
            k[b, hot] = q[b].view(HKV, GROUP, D).sum(1) * torch.rand(5, 1, 1, generator=gen) * 4
    elif kind == "tied":
        pool = torch.randint(-1, 2, (6, D), generator=gen).float()
        k = pool[torch.randint(0, 6, (2, n, HKV), generator=gen)]
    elif kind == "narrow":
        k = k[:, :1].expand(2, n, HKV, D) + 1e-4 * torch.randn(2, n, HKV, D, generator=gen)
    v = torch.randn(2, n, HKV, D, generator=gen)
    kv = sk.KVCache.contiguous(k.to(DEVICE), v.to(DEVICE), torch.tensor(lengths, device=DEVICE))
    return q.to(DEVICE), kv


def _order_keys(x: torch.Tensor) -> torch.Tensor:
    """``_order_key`` in torch: int64 keys in the order of the fp32 values ``x``."""
    u = x.contiguous().view(torch.int32).long() & 0xFFFFFFFF
    return torch.where(u >> 31 == 1, u ^ 0xFFFFFFFF, u | 0x80000000)


def _check_row(chosen, values, allowed, k, thr_key, thr_tok):
    """``chosen [k]`` is the first ``min(k, allowed)`` tokens of a stable sort of
    ``values`` over ``allowed`` (descending: ties in token order), ``-1`` after; every
    allowed token is chosen exactly when ``key > T`` or ``key = T`` up to the last tie."""
    keys = _order_keys(values)
    order = torch.sort(keys.masked_fill(~allowed, -1), descending=True, stable=True).indices
    want = order[:min(k, int(allowed.sum()))]
    got = chosen[chosen >= 0].long()
    assert (chosen[len(got):] == -1).all()
    assert torch.equal(got.sort().values, want.sort().values)
    if int(allowed.sum()) < k:
        return  # every allowed token: no k-th key
    thr = int(thr_key) & 0xFFFFFFFF
    assert thr == int(keys[want[-1]])
    assert int(thr_tok) == int(want[keys[want] == thr].max())
    tok = torch.arange(len(values))
    mark = allowed & ((keys > thr) | ((keys == thr) & (tok <= int(thr_tok))))
    assert torch.equal(mark.nonzero().flatten(), want.sort().values)


CASES = [  # (kind, n, lengths, k, sink, window)
    ("gauss", 1024, (1024, 700), 100, 0, 0),
    ("gauss", 768, (768, 40), 64, 0, 0),  # fewer allowed than k in one sequence
    ("peaked", 1024, (1024, 513), 64, 0, 0),  # k past the few large masses: ties at 0
    ("peaked", 640, (640, 300), 3, 16, 32),
    ("tied", 1024, (1024, 900), 150, 0, 0),
    ("tied", 512, (512, 120), 90, 8, 24),  # 88 allowed in the second sequence
    ("narrow", 768, (768, 600), 200, 4, 4),
]


@pytest.mark.parametrize("spread", [True, False])
@pytest.mark.parametrize("per_head", [False, True])
@pytest.mark.parametrize(("kind", "n", "lengths", "k", "sink", "window"), CASES)
def test_select_is_a_stable_sort_of_the_values(spread, per_head, kind, n, lengths, k,
                                               sink, window):
    for seed in range(3):
        q, kv = _problem(kind, seed, n, lengths)
        top, out = _select(q, kv, k, per_head, sink, window, spread=spread)
        values = (top.scores if per_head else top.mass).cpu()
        for b in range(2):
            length = lengths[b]
            lo = min(length, sink)
            tok = torch.arange(n)
            allowed = (tok >= lo) & (tok < max(length - window, lo))
            for sel in range(values.shape[1]):
                row = b * values.shape[1] + sel
                g, j = divmod(sel, GROUP) if per_head else (sel, 0)
                _check_row(out[b, g, j * k:(j + 1) * k], values[b, sel], allowed, k,
                           top.thr_key[row], top.thr_tok[row])
        assert int(top.hist.abs().sum()) == 0 and int(top.arrivals.abs().sum()) == 0


