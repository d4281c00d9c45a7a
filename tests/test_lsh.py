"""MagicPIG (SimHash sampling): collision probabilities, unbiased sums, exact sink/window,
reads, the registry entry and the commands that run it."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
import torch

import santa_kernels as sk
from conftest import decode_problem
from santa_kernels.lsh import (
    binomial_tail,
    build_lsh_index,
    collision_probability,
    lsh_attention,
    magicpig,
    simhash_codes,
    simhash_planes,
    stack_lsh_indexes,
)
from santa_kernels.validate import InputError

pytestmark = pytest.mark.usefixtures("one_thread")


def _exact_tail(rho: float, n: int, m: int) -> float:
    r = Fraction(rho)
    return float(sum(math.comb(n, j) * r**j * (1 - r) ** (n - j) for j in range(m, n + 1)))


@pytest.mark.parametrize(("n", "m"), [(150, 2), (150, 1), (4, 2), (60, 10), (10, 10)])
def test_binomial_tail_keeps_its_relative_precision(n: int, m: int):
    rhos = [0.0, 1e-12, 1e-6, 1e-3, 0.01, 0.1, 0.5, 0.9, 1.0]
    ours = binomial_tail(torch.tensor(rhos, dtype=torch.float64), n, m).tolist()
    for rho, got in zip(rhos, ours, strict=True):
        want = _exact_tail(rho, n, m)
        assert abs(got - want) <= 1e-10 * want + 1e-300, (rho, got, want)


def _keys_at_angles(thetas: torch.Tensor, d: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A query and keys at the given angles from it (random orientation and norms)."""
    gen = torch.Generator().manual_seed(5)
    basis, _ = torch.linalg.qr(torch.randn(d, d, generator=gen, dtype=torch.float64))
    q = 1.7 * basis[:, 0]
    norms = 0.5 + torch.rand(len(thetas), generator=gen, dtype=torch.float64)
    keys = norms[:, None] * (thetas.cos()[:, None] * basis[:, 0] + thetas.sin()[:, None]
                             * basis[:, 1])
    return q, keys


@pytest.mark.parametrize(("K", "L", "m"), [(3, 5, 2), (2, 4, 1), (1, 6, 4)])
def test_collision_probability_matches_simhash_frequencies(K: int, L: int, m: int):
    """Over fresh hyperplanes, a key's frequency of >= m colliding tables matches the
    formula within 5 binomial standard errors, at angles 0.05 pi .. 0.95 pi."""
    thetas = torch.linspace(0.05, 0.95, 10, dtype=torch.float64) * math.pi
    q, keys = _keys_at_angles(thetas, d=12)
    draws = 3000
    hits = torch.zeros(len(thetas))
    one_table = torch.zeros(len(thetas))
    for seed in range(draws):
        planes = simhash_planes(12, K, L, seed, dtype=torch.float64, device="cpu")
        same = simhash_codes(keys, planes, K, L) == simhash_codes(q, planes, K, L)
        hits += (same.sum(-1) >= m).double()
        one_table += same[:, 0].double()
    cos = thetas.cos()
    want = collision_probability(cos, K, L, m)
    err = 5 * (want * (1 - want) / draws).sqrt() + 1e-3
    assert ((hits / draws - want).abs() <= err).all(), (hits / draws, want)
    per_table = (1 - thetas / math.pi) ** K
    assert ((one_table / draws - per_table).abs()
            <= 5 * (per_table * (1 - per_table) / draws).sqrt() + 1e-3).all()
    # the frequencies tell the formula from one table's probability, so the test can fail
    assert ((hits / draws - per_table).abs() > err).any()


def _exact_sums(q, kv, scale=None):
    """The sums the estimator targets: ``sum_i e^{s_i - m} v_i`` and ``sum_i e^{s_i - m}``."""
    keys, values, valid = kv.padded(torch.float64)
    group = q.shape[1] // kv.num_kv_heads
    tau = scale or kv.head_dim**-0.5
    k = keys.permute(0, 2, 1, 3).repeat_interleave(group, dim=1)
    v = values.permute(0, 2, 1, 3).repeat_interleave(group, dim=1)
    s = tau * torch.einsum("bhd,bhnd->bhn", q.double(), k).masked_fill(~valid[:, None], -math.inf)
    e = (s - s.amax(-1, keepdim=True)).exp()
    return torch.einsum("bhn,bhnd->bhd", e, v), e.sum(-1)


@pytest.mark.parametrize("center", ["mean", "none"])
@pytest.mark.parametrize(("K", "L", "m"), [(2, 4, 2), (3, 6, 1)])
def test_numerator_and_denominator_are_unbiased(center: str, K: int, L: int, m: int):
    q, kv = decode_problem(batch=2, heads=4, kv_heads=2, n=40, d=8, q_scale=1.5, seed=3,
                           lengths=[40, 27])
    kv = sk.KVCache.contiguous(kv.k + 0.7, kv.v, kv.lengths)  # off-centre keys
    num, den = _exact_sums(q, kv)
    seeds = 1000
    nums, dens, unweighted = [], [], []
    for seed in range(seeds):
        res = magicpig(q, kv, K=K, L=L, min_hits=m, sink=2, window=3, center=center,
                       seed=seed, compute_dtype=torch.float64)
        nums.append(res.num)
        dens.append(res.den)
        # the same draws without the 1/P weights: biased, so the bound below has power
        unweighted.append((res.den[..., None] * res.weights * res.inclusion).sum(-1))
    for draws, exact in ((torch.stack(nums), num), (torch.stack(dens), den)):
        mean, stderr = draws.mean(0), draws.std(0) / seeds**0.5
        assert ((mean - exact).abs() <= 5 * stderr + 1e-12).all()
        assert draws.std(0).max() > 0  # random, not exact
    biased = torch.stack(unweighted)
    stderr = biased.std(0) / seeds**0.5
    assert ((biased.mean(0) - den).abs() > 5 * stderr).any()


def test_sink_window_and_tokens_past_the_index_are_exact():
    q, kv = decode_problem(batch=2, heads=4, kv_heads=2, n=60, d=8, seed=4, lengths=[60, 45])
    lengths = kv.lengths.tolist()
    for seed in range(20):
        res = magicpig(q, kv, K=4, L=3, sink=5, window=7, seed=seed,
                       compute_dtype=torch.float64)
        for b, n in enumerate(lengths):
            exact = torch.zeros(60, dtype=torch.bool)
            exact[:5] = True
            exact[n - 7 : n] = True
            assert res.sampled[b][:, exact].all() and (res.inclusion[b][:, exact] == 1).all()
            assert (res.inclusion[b][:, n:] == 0).all() and not res.sampled[b][:, n:].any()
            hashed = res.inclusion[b][:, ~exact][:, : n - 12]  # P of the sampled ones
            picked = res.sampled[b][:, ~exact][:, : n - 12]
            assert ((hashed > 0) & (hashed < 1) == picked).all() and picked.any()
    # nothing left to hash: the output is dense attention, whatever the seed
    dense = sk.dense_attention(q, kv, compute_dtype=torch.float64).out
    for seed in range(3):
        res = magicpig(q, kv, K=4, L=3, sink=30, window=30, seed=seed,
                       compute_dtype=torch.float64)
        torch.testing.assert_close(res.out, dense, rtol=1e-12, atol=1e-12)
    # an index of a prefix: the tokens added since (decode tokens) are exact
    prefix = sk.KVCache.contiguous(kv.k[:, :50], kv.v[:, :50], torch.tensor([50, 40]))
    index = build_lsh_index(prefix, K=4, L=3, sink=5, window=7, seed=1)
    res = lsh_attention(q, kv, index, min_hits=1)
    assert res.sampled[0][:, 43:60].all() and (res.inclusion[0][:, 43:60] == 1).all()
    assert res.sampled[1][:, 33:45].all() and (res.inclusion[1][:, 33:45] == 1).all()


def test_a_fresh_call_is_its_index_then_attention_and_reads_add_up():
    q, kv = decode_problem(batch=2, heads=6, kv_heads=2, n=80, d=16, seed=6, lengths=[80, 55])
    params = {"K": 5, "L": 9, "sink": 3, "window": 5}
    res = magicpig(q, kv, **params, min_hits=2, seed=11, scale=0.3)
    index = build_lsh_index(kv, **params, seed=11)
    again = lsh_attention(q, kv, index, min_hits=2, scale=0.3)
    assert torch.equal(res.out, again.out) and torch.equal(res.sampled, again.sampled)
    other = magicpig(q, kv, **params, min_hits=2, seed=12, scale=0.3)
    assert not torch.equal(res.sampled, other.sampled)
    union = res.sampled.reshape(2, 2, 3, 80).any(dim=2).sum(-1)
    assert torch.equal(res.reads.k_rows, union) and torch.equal(res.reads.v_rows, union)
    assert torch.equal(res.reads.k_features, union * 16)
    hashed = torch.tensor([80 - 8, 55 - 8])
    assert torch.equal(res.index_bytes, (hashed * math.ceil(5 * 9 / 8))[:, None].expand(2, 2))
    dense_bytes = 2 * (80 + 55) * 2 * 16 * 2
    assert res.index_read_fraction == pytest.approx(float(res.index_bytes.sum()) / dense_bytes)
    assert res.read_equivalent == pytest.approx(res.reads.kv_read_fraction
                                                + res.index_read_fraction)
    torch.testing.assert_close(res.weights.sum(-1), torch.ones(2, 6))
    # paged caches give the same draw
    paged = kv.to_paged(16, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(magicpig(q, paged, **params, seed=11, scale=0.3).out, res.out)


def test_stacked_indexes_serve_a_batch_in_one_call():
    """Sequences indexed one by one (hyperplanes of their own) and attended in one call
    give what one call per sequence gives."""
    q, kv = decode_problem(batch=3, heads=4, kv_heads=2, n=50, d=8, seed=9,
                           lengths=[50, 31, 44])
    rows = [sk.KVCache.contiguous(kv.k[b : b + 1, :n], kv.v[b : b + 1, :n])
            for b, n in enumerate([50, 31, 44])]
    indexes = [build_lsh_index(row, K=4, L=6, sink=2, window=5, seed=10 + b,
                               compute_dtype=torch.float64) for b, row in enumerate(rows)]
    stacked = stack_lsh_indexes(indexes)
    assert stacked.seeds == (10, 11, 12) and stacked.codes.shape[:3] == (3, 2, 50)
    together = lsh_attention(q, kv, stacked, min_hits=1, compute_dtype=torch.float64)
    for b, (row, index) in enumerate(zip(rows, indexes, strict=True)):
        alone = lsh_attention(q[b : b + 1], row, index, min_hits=1,
                              compute_dtype=torch.float64)
        n = row.max_len
        torch.testing.assert_close(together.out[b], alone.out[0], rtol=1e-12, atol=1e-12)
        assert torch.equal(together.sampled[b, :, :n], alone.sampled[0])
        assert torch.equal(together.reads.v_rows[b], alone.reads.v_rows[0])
    other = build_lsh_index(rows[0], K=5, L=6, sink=2, window=5)
    with pytest.raises(InputError, match="must agree"):
        stack_lsh_indexes([indexes[0], other])


def test_more_tables_sample_more_keys_and_err_less():
    q, kv = decode_problem(batch=1, heads=4, kv_heads=2, n=300, d=16, q_scale=2.0, seed=8)
    dense = sk.dense_attention(q, kv, compute_dtype=torch.float64).out
    err, read = {}, {}
    for L in (4, 32):
        draws = [magicpig(q, kv, K=4, L=L, sink=0, window=0, seed=s,
                          compute_dtype=torch.float64) for s in range(40)]
        err[L] = sum(float((d.out - dense).norm() / dense.norm()) for d in draws) / 40
        read[L] = sum(d.reads.kv_read_fraction for d in draws) / 40
    assert read[32] > read[4] and err[32] < err[4]


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"K": 0}, "K: must be > 0"),
    ({"K": 32}, "K: at most 31"),
    ({"L": 4, "min_hits": 5}, "min_hits: expected 1..4"),
    ({"sink": -1}, "sink: expected an integer >= 0"),
    ({"center": "median"}, "center: expected one of"),
])
def test_bad_parameters_name_themselves(kwargs, message):
    q, kv = decode_problem()
    with pytest.raises(InputError, match=message):
        magicpig(q, kv, **kwargs)


def test_registry_entry_is_reference_only_and_listed():
    from typer.testing import CliRunner

    from santa_bench.cli import app
    from santa_bench.methods import REGISTRY, parse_method_specs

    method = REGISTRY.get("magicpig")
    assert method.family == "lsh" and method.module == "santa_bench.methods.lsh"
    assert method.available() == (True, "")
    ok, reason = method.kernel_available()
    assert not ok and "reference only" in reason
    assert not method.has_e2e_kernel and method.prefill_index is not None
    assert method.plot.colour and method.plot.marker
    ((m, overrides),) = parse_method_specs("magicpig:K=6,L=20,min_hits=3")
    params = m.resolve_params(overrides)
    assert params == {"K": 6, "L": 20, "min_hits": 3, "sink": 4, "window": 64,
                      "center": "mean"}
    q, kv = decode_problem(n=120, d=8)
    res = m.run_reference(q, kv, params, seed=2, compute_dtype=torch.float64)
    assert res.out.shape == q.shape and 0 < res.reads.kv_read_fraction < 1
    from santa_bench import cli

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cli.console, "_width", 400)  # no cell folded
        listed = CliRunner().invoke(app, ["list"], catch_exceptions=False)
    assert listed.exit_code == 0
    line = next(row for row in listed.output.splitlines() if "magicpig" in row)
    assert "santa_bench.methods.lsh" in line and "lsh" in line


def test_gpu_decoding_runs_the_reference_without_a_flag(monkeypatch):
    from santa_bench.accuracy.engine import resolve_backend
    from santa_bench.methods import REGISTRY
    from santa_bench.runners.tasks import case_command, task_case

    method = REGISTRY.get("magicpig")
    assert resolve_backend(method, "cuda") == "reference"  # no --reference needed
    assert resolve_backend(method, "cuda", reference=True) == "reference"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    case = task_case("ruler-vt", "m", method, {"K": 8}, n=2, seed=0, ctx=4096)
    assert (case["device"], case["backend"], case["K"]) == ("cuda", "reference", 8)
    assert "--methods magicpig:K=8,L=150" in case_command(case)


def test_fidelity_command_runs_magicpig(tmp_path):
    from typer.testing import CliRunner

    from santa_bench.cli import app
    from santa_bench.results import ResultStore

    args = ["accuracy", "fidelity", "--patterns", "peaked,needle", "--methods",
            "magicpig:K=6,L=40,window=16", "--ctx", "256", "--heads", "4", "--kv-heads", "2",
            "--head-dim", "16", "--seeds", "4", "--results", str(tmp_path)]
    result = CliRunner().invoke(app, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    frame = ResultStore(tmp_path).load()
    assert set(frame["method"]) == {"magicpig"} and frame["case_hash"].nunique() == 2
    values = frame.set_index(["pattern", "metric"])["value"]
    for pattern in ("peaked", "needle"):
        assert 0 < values[(pattern, "kv_read_fraction")] < 1
        assert values[(pattern, "index_read_fraction")] > 0
        assert values[(pattern, "rel_l2_vs_dense")] > 0
    assert (frame.status == "ok").sum() >= 2 * 8


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_reference_matches_the_cpu_and_times_32k_decode_calls():
    """At Qwen2.5-Coder-0.5B's shape (14/2/64) and 32k: the GPU reference samples what the
    CPU one does (float64 both); then decode calls as the accuracy engine makes them
    (float32, the prompts indexed once, one call for the batch) are timed and printed
    (pytest -s)."""
    import time

    gen = torch.Generator().manual_seed(13)
    n, batch = 32768, 16
    q = (3 * torch.randn(batch, 14, 64, generator=gen)).to(torch.bfloat16)
    k = torch.randn(batch, n, 2, 64, generator=gen).to(torch.bfloat16)
    v = torch.randn(batch, n, 2, 64, generator=gen).to(torch.bfloat16)
    runs = []
    for device in ("cpu", "cuda"):
        kv = sk.KVCache.contiguous(k[:1].to(device), v[:1].to(device))
        index = build_lsh_index(kv, seed=3, compute_dtype=torch.float64)
        runs.append(lsh_attention(q[:1].to(device), kv, index, compute_dtype=torch.float64))
    cpu, gpu = runs
    assert float((gpu.sampled.cpu() == cpu.sampled).double().mean()) > 0.9999
    assert float((gpu.out.cpu() - cpu.out).norm() / cpu.out.norm()) < 1e-2
    for rows in (1, batch):
        kv = sk.KVCache.contiguous(k[:rows].cuda(), v[:rows].cuda())
        query = q[:rows].cuda()
        index = build_lsh_index(kv, seed=3)
        for _ in range(3):
            lsh_attention(query, kv, index)
        torch.cuda.synchronize()
        started = time.perf_counter()
        calls = 20
        for _ in range(calls):
            result = lsh_attention(query, kv, index)
            float(result.reads.kv_read_fraction)  # the engine reads the counts every call
        torch.cuda.synchronize()
        per_call_ms = (time.perf_counter() - started) * 1e3 / calls
        print(f"magicpig reference, 32k, 14/2/64, batch {rows}: {per_call_ms:.2f} ms a call")
        assert result.out.isfinite().all() and 0 < result.reads.kv_read_fraction < 1
