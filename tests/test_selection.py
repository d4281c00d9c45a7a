"""The selection methods' references: oracle top-k, Quest, vAttention, top-k + S²ANTA.

Deterministic ones are checked exactly (all tokens or all pages chosen is dense; Quest's
bound is an upper bound of every score of its page); the random ones over many seeds
(unbiasedness within a confidence bound, vAttention's (epsilon, delta) promise at the
promised frequency, the variance order of top-k + S²ANTA against S²ANTA-sys).
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import santa_kernels as sk
from conftest import decode_problem
from santa_bench.methods import REGISTRY, MethodError, Promise, parse_method_specs
from santa_kernels import selection as sel
from santa_kernels.scores import exact_scores

F64 = torch.float64


def _dense(q, kv):
    return sk.dense_attention(q, kv, compute_dtype=F64).out


def _scores(q, kv):
    keys, _, valid = kv.padded(F64)
    group = q.shape[1] // kv.num_kv_heads
    return exact_scores(q.double(), keys, valid, kv.head_dim**-0.5, group)[0]


# ------------------------------------------------------------------ oracle top-k
@pytest.mark.parametrize("shared", ["group", "head"])
def test_oracle_topk_with_every_token_is_dense(shared):
    q, kv = decode_problem(lengths=[200, 83])
    out = sel.oracle_topk(q, kv, k=200, shared=shared, compute_dtype=F64)
    torch.testing.assert_close(out.out, _dense(q, kv), rtol=0, atol=1e-12)
    assert out.reads.kv_read_fraction == 1.0


def test_oracle_topk_attends_the_groups_heaviest_tokens():
    q, kv = decode_problem(batch=1, heads=4, kv_heads=2, n=120, q_scale=3.0)
    out = sel.oracle_topk(q, kv, k=7, compute_dtype=F64)
    probs = torch.softmax(_scores(q, kv), -1)
    mass = probs.reshape(1, 2, 2, 120).sum(2)  # [B, Hkv, N]
    support = out.weights.reshape(1, 2, 2, 120) > 0
    for g in range(2):
        chosen = support[0, g].any(0).nonzero().flatten()
        assert (support[0, g, 0] == support[0, g, 1]).all()  # one set per KV head
        assert set(chosen.tolist()) == set(mass[0, g].topk(7).indices.tolist())
        # renormalised: the weights are p restricted to the set, summing to 1
        p = probs[0, 2 * g][chosen]
        torch.testing.assert_close(out.weights[0, 2 * g][chosen], p / p.sum())
    assert out.reads.v_rows.tolist() == [[7, 7]]
    assert out.reads.k_read_fraction == 1.0  # the selection scores every key


def test_oracle_topk_per_head_reads_the_union_of_the_groups_sets():
    q, kv = decode_problem(batch=1, heads=4, kv_heads=1, n=150, q_scale=3.0)
    out = sel.oracle_topk(q, kv, k=5, shared="head", compute_dtype=F64)
    support = out.weights[0] > 0
    assert (support.sum(-1) == 5).all()
    assert out.reads.v_rows.item() == int(support.any(0).sum()) > 5


# ------------------------------------------------------------------ Quest
@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), page=st.sampled_from([1, 3, 8, 16]),
       n=st.integers(1, 90), q_scale=st.floats(0.1, 5.0))
def test_quest_bound_is_an_upper_bound_of_every_score_in_its_page(seed, page, n, q_scale):
    q, kv = decode_problem(batch=2, heads=4, kv_heads=2, n=n, d=8, seed=seed,
                           q_scale=q_scale, lengths=[n, max(1, n // 2)])
    kmin, kmax = sel.quest_bounds(kv, page)
    bound = sel.quest_page_scores(q.double(), kmin, kmax, 8**-0.5)  # [B, Hq, P]
    scores = _scores(q, kv)
    token_page = torch.arange(n) // page
    valid = torch.isfinite(scores)
    assert (scores[valid] <= bound[:, :, token_page][valid] + 1e-9).all()


@pytest.mark.parametrize("shared", ["group", "head"])
def test_quest_with_every_page_is_dense(shared):
    q, kv = decode_problem(lengths=[200, 83])
    out = sel.quest(q, kv, page=16, pages=13, shared=shared, compute_dtype=F64)
    torch.testing.assert_close(out.out, _dense(q, kv), rtol=0, atol=1e-12)


def test_quest_keeps_the_last_page_and_counts_its_bounds():
    q, kv = decode_problem(batch=2, heads=4, kv_heads=2, n=100, lengths=[100, 37])
    out = sel.quest(q, kv, page=8, pages=3, compute_dtype=F64)
    support = out.weights > 0
    for b, n in enumerate((100, 37)):
        last_page = torch.arange((n - 1) // 8 * 8, n)
        assert support[b][:, last_page].all()
        for g in range(2):  # three pages per KV head
            group = support[b].reshape(2, 2, -1)[g].any(0)
            assert len({int(t) // 8 for t in group.nonzero().flatten()}) == 3
    used = torch.tensor([13, 5])
    rows = out.reads.v_rows
    assert (out.reads.k_features == (2 * used[:, None] + rows) * 8).all()
    assert (rows == torch.tensor([[8 + 8 + 4] * 2, [8 + 8 + 5] * 2])).all()


def test_quest_bounds_skip_rows_past_the_length():
    k = torch.zeros(2, 10, 1, 2, dtype=F64)
    k[0, :5, 0, 0] = torch.arange(5.0)
    k[0, 5:, 0, 0] = 100.0  # past the length: not in any bound
    kv = sk.KVCache.contiguous(k, k.clone(), torch.tensor([5, 10]))
    kmin, kmax = sel.quest_bounds(kv, 4)
    assert kmax[0, :, 0, 0].tolist() == [3.0, 4.0, 0.0]
    assert kmin[0, :, 0, 0].tolist() == [0.0, 4.0, 0.0]


# ------------------------------------------------------------------ vAttention
def test_vattention_sink_and_window_over_the_whole_sequence_is_dense():
    q, kv = decode_problem(lengths=[200, 83])
    out = sel.vattention(q, kv, sink=100, window=100, topk=0, seed=0, compute_dtype=F64)
    torch.testing.assert_close(out.out, _dense(q, kv), rtol=0, atol=1e-12)
    torch.testing.assert_close(out.lse, torch.logsumexp(_scores(q, kv), -1))


def test_vattention_tail_sums_are_unbiased():
    """Hansen–Hurwitz: the sampled numerator N̂ = out · D̂ and denominator D̂ average to
    the exact ones over seeds (the ratio itself is self-normalised, so only these two
    are promised unbiased)."""
    q, kv = decode_problem(batch=2, heads=4, kv_heads=2, n=300, d=8, lengths=[300, 180])
    lse = torch.logsumexp(_scores(q, kv), -1)
    _, values, _ = kv.padded(F64)
    expo = torch.exp(_scores(q, kv) - lse[..., None])  # p, so N = o and D = 1
    exact_num = torch.einsum("bhn,bhnd->bhd", expo, values.permute(0, 2, 1, 3)
                             .repeat_interleave(2, dim=1))
    nums, dens, sampled = [], [], 0
    for seed in range(400):
        out = sel.vattention(q, kv, sink=8, window=8, topk=4, epsilon=0.5, delta=0.5,
                             base_rate=0.02, seed=seed, compute_dtype=F64)
        den = torch.exp(out.lse - lse)
        dens.append(den)
        nums.append(out.out * den[..., None])
        sampled += int((out.reads.v_rows < torch.tensor([[300], [180]])).all())
    assert sampled > 300  # the tail was sampled, not read whole
    for estimates, exact in ((torch.stack(dens), torch.ones_like(lse)),
                             (torch.stack(nums), exact_num)):
        mean, se = estimates.mean(0), estimates.std(0) / 400**0.5
        assert (se > 0).all()
        assert ((mean - exact).abs() <= 5 * se + 1e-12).all()
    assert not torch.allclose(nums[0], exact_num)


def _violations(q, kv, epsilon, delta, seeds, scale_eps=1.0):
    lse = torch.logsumexp(_scores(q, kv), -1)
    errors = []
    for seed in range(seeds):
        out = sel.vattention(q, kv, sink=16, window=16, topk=16, epsilon=epsilon,
                             delta=delta, base_rate=0.05, seed=seed, compute_dtype=F64)
        errors.append((torch.exp(out.lse - lse) - 1).abs())
    errors = torch.stack(errors)
    return [float((errors > epsilon * s).double().mean()) for s in (1.0, scale_eps)]


def test_vattention_keeps_its_epsilon_delta_promise_at_the_promised_frequency():
    """Over 200 seeds x 4 heads, the denominator's relative error exceeds epsilon in at
    most delta of the draws (plus three binomial standard errors); at epsilon / 3 the
    same draws break it far more often, so the budget is not vacuously large."""
    q, kv = decode_problem(batch=1, heads=4, kv_heads=2, n=4096, d=16, q_scale=1.0)
    delta = 0.1
    rate, tighter = _violations(q, kv, 0.05, delta, seeds=200, scale_eps=1 / 3)
    trials = 200 * 4
    assert rate <= delta + 3 * math.sqrt(delta * (1 - delta) / trials)
    assert tighter > 2 * delta


def test_vattention_output_mode_bounds_the_output():
    """mode=output sizes the sample for the output's relative error: values with a
    shared direction (as in models) keep it within epsilon at the promised rate."""
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(1, 4, 16, generator=gen, dtype=F64)
    k = torch.randn(1, 2048, 2, 16, generator=gen, dtype=F64)
    v = 1.0 + 0.5 * torch.randn(1, 2048, 2, 16, generator=gen, dtype=F64)
    kv = sk.KVCache.contiguous(k, v)
    dense = _dense(q, kv)
    delta, errors, reads = 0.2, [], []
    for seed in range(100):
        out = sel.vattention(q, kv, sink=8, window=8, topk=8, epsilon=0.02, delta=delta,
                             base_rate=0.05, mode="output", seed=seed, compute_dtype=F64)
        errors.append((out.out - dense).norm(dim=-1) / dense.norm(dim=-1))
        reads.append(out.reads.v_read_fraction)
    rate = float((torch.stack(errors) > 0.02).double().mean())
    assert rate <= delta + 3 * math.sqrt(delta * (1 - delta) / 400)
    assert sum(reads) / len(reads) < 0.9  # it sampled


def test_vattention_checks_its_parameters():
    q, kv = decode_problem()
    for bad in ({"epsilon": 0.0}, {"delta": 1.0}, {"mode": "both"}, {"sink": -1}):
        with pytest.raises(sk.InputError):
            sel.vattention(q, kv, **bad)
    ((method, overrides),) = parse_method_specs("vattention:delta=1.5")
    with pytest.raises(MethodError, match=r"delta must be in \(0, 1\)"):
        method.resolve_params(overrides)
    assert method.promise(method.resolve_params({})) == Promise(0.05, 0.05, "denominator")


# ------------------------------------------------------------------ top-k + S²ANTA
def test_topk_santa_is_unbiased():
    q, kv = decode_problem(batch=2, heads=4, kv_heads=2, n=150, q_scale=2.0,
                           lengths=[150, 61])
    dense = _dense(q, kv)
    outs = torch.stack([sel.topk_santa(q, kv, k=5, S=8, seed=s, compute_dtype=F64).out
                        for s in range(400)])
    mean, se = outs.mean(0), outs.std(0) / 400**0.5
    assert ((mean - dense).abs() <= 5 * se + 1e-12).all()
    assert not torch.allclose(outs[0], dense)


def test_topk_santa_edges():
    q, kv = decode_problem(lengths=[200, 83])
    whole = sel.topk_santa(q, kv, k=200, S=4, seed=0, compute_dtype=F64)
    torch.testing.assert_close(whole.out, _dense(q, kv), rtol=0, atol=1e-12)
    # without a top-k it is S²ANTA-sys, draw for draw
    plain = sel.topk_santa(q, kv, k=0, S=16, seed=5, compute_dtype=F64)
    sys_ = sk.santa_sys(q, kv, S=16, seed=5, compute_dtype=F64)
    torch.testing.assert_close(plain.out, sys_.out)


def test_topk_santa_beats_santa_sys_at_equal_S_on_a_peaked_pattern():
    q, kv = decode_problem(batch=1, heads=4, kv_heads=2, n=400, q_scale=4.0)
    dense = _dense(q, kv)

    def mse(run):
        return float(torch.stack([(run(s) - dense).square().sum() for s in range(100)]).mean())

    ours = mse(lambda s: sel.topk_santa(q, kv, k=16, S=16, seed=s, compute_dtype=F64).out)
    plain = mse(lambda s: sk.santa_sys(q, kv, S=16, seed=s, compute_dtype=F64).out)
    assert ours < 0.5 * plain


# ------------------------------------------------------------------ the registry
def test_the_four_methods_are_registered_with_their_module():
    for name in ("oracle-topk", "quest", "vattention", "topk-santa"):
        method = REGISTRY.get(name)
        assert method.family == "oracle"
        assert method.module == "santa_bench.methods.selection"
        assert method.kernel_kind == "triton" and method.e2e_backend is not None
        assert method.plot.colour is not None
        assert method.deterministic == (name in ("oracle-topk", "quest"))


def test_fidelity_reports_the_promise():
    from santa_bench.runners.fidelity import FidelityGrid, FidelityRunner, expand_fidelity_cases

    grid = FidelityGrid(methods=parse_method_specs(
        "vattention:sink=8,window=8,topk=8,delta=0.2,oracle-topk:k=32"),
        patterns=["peaked"], S=[16], ctx=[512], heads=4, kv_heads=2, head_dim=16, seeds=8)
    runner = FidelityRunner()
    by_method = {}
    for case in expand_fidelity_cases(grid):
        by_method[case["method"]] = {r["metric"]: r for r in runner.run(case)}
    promise = by_method["vattention"]
    assert 0.0 <= promise["promise_violation_rate"]["value"] <= 1.0
    assert promise["promise_held"]["value"] in (0.0, 1.0)
    assert "denominator relative error" in promise["promise_held"]["reason"]
    assert "promise_held" not in by_method["oracle-topk"]


def test_an_index_build_is_timed_after_a_warm_up_as_a_median():
    """Quest's bounds once took 30 ms in the rows where a warm build takes 1 ms: the first
    build paid the first launches. The adapter's timed builds come after one untimed build."""
    import time
    from types import SimpleNamespace

    from santa_bench.methods.selection import selection_prepare

    builds = []

    class Step:  # a selection step whose first build is slow
        workspace = SimpleNamespace(num_splits=1)

        def build(self, kv) -> None:
            time.sleep(0.2 if not builds else 0.001)
            builds.append(kv)

        def __call__(self, q, kv):
            return q.clone()

        def reset_rng(self) -> None:
            pass

    q, kv = decode_problem(batch=1, heads=2, kv_heads=1, n=16, d=8)
    prepared = selection_prepare("stub", lambda *args: Step())(q, kv)
    ms, unit = prepared.metrics["index_build_ms"]
    assert len(builds) == 4 and all(b is kv for b in builds) and unit == "ms" and ms < 100


def test_an_index_build_returns_its_last_build():
    """The timing hands back what the last timed build built (SANTA++'s packed teams)."""
    from santa_kernels.build_timing import median_build_ms

    builds = iter(range(10))
    built, ms = median_build_ms(lambda: next(builds), torch.device("cpu"), repeats=3)
    assert built == 3 and ms >= 0
    built, _ = median_build_ms(lambda: next(builds), torch.device("cpu"), repeats=1,
                               warm_up=False)
    assert built == 4
