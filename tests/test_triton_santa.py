"""Triton SANTA kernels vs float64 torch (docs/algorithms.md sections 2-4, 8, 9).

Run on the CPU through Triton's interpreter; shapes are tiny because the interpreter
executes every program in Python. Two kinds of checks (section 9):
exact agreement of sampled counts given the *same* uniforms, and agreement in
distribution (unbiasedness, mean squared error) over many independent Philox streams.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import math

import pytest
import torch

from santa_kernels import KVCache, attention
from santa_kernels import values as value_stages
from santa_kernels.scores import exact_scores
from santa_kernels.triton_santa import (
    SantaWorkspace,
    num_splits_for,
    sample_splits_for,
    santa_flash,
    santa_iid,
    santa_prop,
    santa_strat,
    santa_sys,
    santa_triton_available,
)
from santa_kernels.validate import InputError

pytestmark = [
    pytest.mark.skipif(not santa_triton_available()[0], reason="no Triton backend"),
    # these tests build CPU tensors: they run the kernels under the interpreter (the GPU
    # checks of the compiled kernels are tests/test_gpu_graphs.py and scripts/)
    pytest.mark.skipif(
        os.environ.get("TRITON_INTERPRET", "0") != "1" and torch.cuda.is_available(),
        reason="CPU tensors: run with TRITON_INTERPRET=1",
    ),
]

TILE = 16


def make_cache(batch=2, hq=4, hkv=2, d=64, n=75, lengths=(75, 41), dtype=torch.float32,
               seed=0, q_scale=2.0):
    gen = torch.Generator().manual_seed(seed)
    q = (torch.randn(batch, hq, d, generator=gen) * q_scale).to(dtype)
    k = torch.randn(batch, n, hkv, d, generator=gen).to(dtype)
    v = torch.randn(batch, n, hkv, d, generator=gen).to(dtype)
    kv = KVCache.contiguous(k, v, torch.tensor(lengths[:batch]))
    return q, kv


def float64_scores(q, kv):
    """Returns (scores [B, Hq, Nmax], values [B, Hkv, Nmax, d] expanded per q head)."""
    keys, values, valid = kv.padded(torch.float64)
    group = q.shape[1] // kv.num_kv_heads
    scores, _ = exact_scores(q.double(), keys, valid, q.shape[-1] ** -0.5, group)
    values = values.permute(0, 2, 1, 3).repeat_interleave(group, dim=1)
    return scores, values


def expected_counts(method, scores, S, uniforms, lengths):
    """Float64 sample counts per row given the kernel's uniforms (the reference's formulas)."""
    cdf = value_stages._cdf(value_stages.softmax_probs(scores))
    if method == "prop":
        return value_stages._counts_from_cdf(cdf, uniforms.double()[..., None], S)
    if method == "strat":
        strata = torch.arange(S, dtype=torch.float64)
        return value_stages._counts_from_thresholds(cdf, (strata + uniforms.double()) / S)
    if method == "iid":
        return value_stages._counts_from_thresholds(cdf, uniforms.double())
    n = scores.shape[-1]
    _, tile_mass, local_cdf = value_stages._tiled(scores, TILE)
    if method == "flash":
        per_tile = torch.clamp(S // ((lengths + TILE - 1) // TILE), min=1).double()
        counts = value_stages._counts_from_cdf(local_cdf, uniforms.double()[..., None],
                                               per_tile[:, None, None, None])
        weights = counts * (tile_mass[..., None] / per_tile[:, None, None, None])
        return value_stages._untile(counts, n), value_stages._untile(weights, n)
    budgets = value_stages.largest_remainder_budgets(tile_mass, S)  # largest-remainder
    counts = value_stages._counts_from_cdf(local_cdf, uniforms.double()[..., None],
                                           budgets[..., None])
    return value_stages._untile(counts, n)


def run_method(method, q, kv, S, uniforms=None, **kw):
    if method == "flash":
        return santa_flash(q, kv, S, tile=TILE, uniforms=uniforms, return_counts=True, **kw)
    if method == "largest-remainder":
        return santa_prop(q, kv, S, tile=TILE, alloc="largest-remainder", uniforms=uniforms,
                          **kw)
    fn = {"prop": santa_prop, "strat": santa_strat, "iid": santa_iid}[method]
    return fn(q, kv, S, tile=TILE, uniforms=uniforms, **kw)


def uniforms_for(method, q, kv, S, seed=1):
    batch, hq, _ = q.shape
    n_tiles = math.ceil(kv.k.shape[1] / TILE) if kv.layout == "contiguous" else math.ceil(
        kv.page_table.shape[1] * kv.page_size / TILE)
    shape = {"prop": (batch, hq), "strat": (batch, hq, S), "iid": (batch, hq, S),
             "flash": (batch, hq, n_tiles), "largest-remainder": (batch, hq, n_tiles)}[method]
    return torch.rand(shape, generator=torch.Generator().manual_seed(seed))


def check_exact(method, q, kv, S, out_tol=1e-5, **kw):
    uniforms = uniforms_for(method, q, kv, S)
    out, info = run_method(method, q, kv, S, uniforms, **kw)
    assert info.S == S and out.dtype == q.dtype and out.shape == q.shape
    scores, values = float64_scores(q, kv)
    n = scores.shape[-1]
    expected = expected_counts(method, scores, S, uniforms[..., : math.ceil(n / TILE)]
                               if method in ("flash", "largest-remainder") else uniforms,
                               kv.lengths)
    if method == "flash":
        expected, weights = expected
    else:
        weights = expected / S
    counts = info.row_counts()[..., :n].double()
    torch.testing.assert_close(counts, expected, rtol=0, atol=0)
    exact_out = torch.einsum("bhn,bhnd->bhd", weights, values)
    torch.testing.assert_close(out.double(), exact_out, rtol=out_tol, atol=out_tol)
    return out, info


# ------------------------------------------------------------ exact agreement
@pytest.mark.parametrize("method", ["prop", "strat", "iid", "flash", "largest-remainder"])
@pytest.mark.parametrize("layout", ["contiguous", "paged"])
def test_counts_match_float64_given_same_uniforms(method, layout):
    q, kv = make_cache()
    if layout == "paged":
        kv = kv.to_paged(8, torch.Generator().manual_seed(1))
    check_exact(method, q, kv, S=24)


@pytest.mark.parametrize(("hq", "hkv"), [(2, 2), (8, 2)])
def test_gqa_groups_1_and_4(hq, hkv):
    q, kv = make_cache(hq=hq, hkv=hkv)
    check_exact("prop", q, kv, S=16)
    check_exact("flash", q, kv, S=16)


def test_budget_at_least_context_and_uneven_tiles():
    q, kv = make_cache(n=21, lengths=(21, 5))  # S >= N, N not a multiple of the tile
    check_exact("prop", q, kv, S=64)
    check_exact("flash", q, kv, S=64)


def test_bf16_inputs():
    q, kv = make_cache(dtype=torch.bfloat16)
    out, _ = check_exact("prop", q, kv, S=16, out_tol=2e-2)
    assert out.dtype == torch.bfloat16
    out, _ = check_exact("flash", q, kv, S=16, out_tol=2e-2)
    assert out.dtype == torch.bfloat16


def test_head_dim_128_multiple_splits():
    q, kv = make_cache(batch=1, hq=2, hkv=1, d=128, n=100, lengths=(100,))
    ws = SantaWorkspace.for_inputs(q, kv, 16, TILE, num_splits=3)
    uniforms = uniforms_for("flash", q, kv, 16)
    out, info = santa_flash(q, kv, 16, tile=TILE, uniforms=uniforms, workspace=ws,
                            return_counts=True)
    scores, values = float64_scores(q, kv)
    counts, weights = expected_counts("flash", scores, 16, uniforms, kv.lengths)
    torch.testing.assert_close(info.row_counts().double(), counts, rtol=0, atol=0)
    torch.testing.assert_close(out.double(), torch.einsum("bhn,bhnd->bhd", weights, values),
                               rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------ degenerate inputs
def test_one_hot_attention_is_exact():
    q, kv = make_cache(batch=1, hq=2, hkv=1, n=40, lengths=(40,))
    q = torch.zeros_like(q)
    q[..., 0] = 100.0
    k = kv.k.clone()
    k[..., 0] = 0.0
    k[0, 27, 0, 0] = 10.0  # score 125 against 0: every sample hits row 27
    kv = KVCache.contiguous(k, kv.v)
    for fn in (santa_prop, santa_strat, santa_iid, santa_flash):
        out, _ = fn(q, kv, 8, tile=TILE, seed=3)
        torch.testing.assert_close(out, kv.v[0, 27, 0].expand_as(out), rtol=0, atol=1e-6)


def test_single_token_context():
    q, kv = make_cache(batch=1, n=1, lengths=(1,))
    for fn in (santa_prop, santa_strat, santa_iid, santa_flash):
        out, _ = fn(q, kv, 4, tile=TILE, seed=0)
        expected = kv.v[0, 0].repeat_interleave(2, dim=0)
        torch.testing.assert_close(out[0], expected, rtol=0, atol=1e-6)


# ------------------------------------------------------------ randomness (section 8)
def test_philox_counter_draws_fresh_numbers_and_replays():
    q, kv = make_cache()
    ws = SantaWorkspace.for_inputs(q, kv, 16, TILE)
    first = santa_prop(q, kv, 16, tile=TILE, workspace=ws, seed=5)[0].clone()
    second = santa_prop(q, kv, 16, tile=TILE, workspace=ws, seed=5)[0].clone()
    assert int(ws.rng[0]) == 2
    assert not torch.equal(first, second)  # the step counter changed the stream
    ws.reset_rng(0)
    torch.testing.assert_close(santa_prop(q, kv, 16, tile=TILE, workspace=ws, seed=5)[0], first,
                               rtol=0, atol=0)
    flash_first = santa_flash(q, kv, 16, tile=TILE, workspace=ws, seed=5)[0].clone()
    assert int(ws.rng[0]) == 2
    ws.reset_rng(1)
    torch.testing.assert_close(santa_flash(q, kv, 16, tile=TILE, workspace=ws, seed=5)[0],
                               flash_first, rtol=0, atol=0)


def test_read_accounting_and_availability():
    ok, reason = santa_triton_available()
    assert ok and reason
    q, kv = make_cache()
    _, info = santa_sys(q, kv, 8, tile=TILE, stash_dtype=torch.float16)
    assert torch.equal(info.row_counts().sum(-1), torch.full((2, 4), 8))
    reads = info.read_counts(kv.head_dim)
    assert torch.equal(reads.k_rows, kv.lengths[:, None].expand(-1, 2))
    assert bool((reads.v_rows >= 1).all()) and bool((reads.v_rows <= 16).all())
    assert num_splits_for(8, 512) == 64 and num_splits_for(64, 512) == 9


# ------------------------------------------------------------ in distribution
REPLICAS = 48  # independent Philox streams: batch elements holding the same sequence


def replicated_cache(n=80, hq=4, d=32, kind="gaussian"):
    """``gaussian``: Q x3 (the harness's inputs); ``peaked``: Q x8 (a few rows hold the
    mass); ``needle``: Q x1 and row 37 aligned with head 0's query (96% of head 0's mass
    on that row, the other heads diffuse)."""
    q_scale = {"gaussian": 3.0, "peaked": 8.0, "needle": 1.0}[kind]
    q, kv = make_cache(batch=1, hq=hq, hkv=1, d=d, n=n, lengths=(n,), q_scale=q_scale, seed=7)
    if kind == "needle":
        k = kv.k.clone()
        direction = q[0, 0] / q[0, 0].norm()
        k[0, 37, 0] = direction * 8.0 * math.sqrt(d) / q[0, 0].norm()  # score +8 for head 0
        kv = KVCache.contiguous(k, kv.v)
    expand = (REPLICAS, -1, -1, -1)
    q = q.expand(REPLICAS, -1, -1).contiguous()
    kv = KVCache.contiguous(kv.k.expand(*expand).contiguous(), kv.v.expand(*expand).contiguous())
    return q, kv


@pytest.mark.parametrize(
    ("method", "calls", "kind"),
    [("prop", 2, "gaussian"), ("flash", 2, "gaussian"), ("strat", 1, "gaussian"),
     ("prop", 2, "needle"), ("prop", 2, "peaked"), ("flash", 2, "needle"),
     ("prop-fp16-stash", 2, "needle")],
)
def test_unbiased_and_reference_mse(method, calls, kind):
    """Accuracy is not traded silently: on Gaussian, peaked and needle inputs
    the kernel is unbiased and its error against dense matches its reference's."""
    q, kv = replicated_cache(kind=kind)
    S = 16
    stash = torch.float16 if method.endswith("fp16-stash") else torch.float32
    method = method.removesuffix("-fp16-stash")
    ws = SantaWorkspace.for_inputs(q, kv, S, TILE, num_splits=2, stash_dtype=stash)
    fn = {"prop": santa_prop, "flash": santa_flash, "strat": santa_strat}[method]
    kw = {} if method == "flash" else {"stash_dtype": stash}
    draws = torch.cat([fn(q, kv, S, tile=TILE, workspace=ws, seed=11, **kw)[0].double()
                       for _ in range(calls)])  # [R, Hq, d]
    dense = attention(q[:1], KVCache.contiguous(kv.k[:1], kv.v[:1]),
                      compute_dtype=torch.float64).out[0]
    reference = torch.cat([
        attention(q, kv, value=method, S=S, tile=TILE, seed=100 + i,
                  compute_dtype=torch.float64).out for i in range(calls)])
    draws_count = draws.shape[0]
    # unbiasedness: z-scores of the mean over independent streams (section 9)
    spread = draws.std(dim=0).clamp_min(1e-3)
    z = (draws.mean(dim=0) - dense) / (spread / math.sqrt(draws_count))
    assert float(z.abs().max()) < 5.0, float(z.abs().max())
    assert float((z**2).mean()) < 2.0, float((z**2).mean())
    # same spread as the reference estimator
    mse = ((draws - dense) ** 2).sum(dim=-1).mean()
    mse_reference = ((reference - dense) ** 2).sum(dim=-1).mean()
    assert 0.7 < float(mse / mse_reference) < 1.4, float(mse / mse_reference)


@pytest.mark.parametrize("method", ["prop", "strat", "largest-remainder"])
def test_long_prefix_path_matches_float64(method, monkeypatch):
    # contexts whose tile prefix exceeds MAX_PREFIX_IN_REGS search it in global memory
    import santa_kernels.triton_santa as triton_santa

    monkeypatch.setattr(triton_santa, "MAX_PREFIX_IN_REGS", 2)
    q, kv = make_cache(n=75, lengths=(75, 41))
    check_exact(method, q, kv, S=7)


@pytest.mark.parametrize("method", ["prop", "strat", "iid"])
@pytest.mark.parametrize("subs", [2, 4])
def test_wide_score_loads_match_float64(method, subs, monkeypatch):
    # the score pass loads K SUBS tiles at a time; statistics stay per tile
    import santa_kernels.triton_santa as triton_santa

    config = {**triton_santa.HOPPER_CONFIGS[64], "subs": subs}
    monkeypatch.setitem(triton_santa.HOPPER_CONFIGS, 64, config)
    q, kv = make_cache(hq=6, hkv=2, n=75, lengths=(75, 41))  # group of 3: padded
    check_exact(method, q, kv, S=24)
    paged = kv.to_paged(8, torch.Generator().manual_seed(2))
    check_exact(method, q, paged, S=9)



@pytest.mark.parametrize("method", ["prop", "strat", "iid", "largest-remainder"])
@pytest.mark.parametrize("splits", [2, 8])
def test_sample_pass_split_over_programs_matches_float64(method, splits, monkeypatch):
    # several programs per head share its samples; the last adds the partial sums
    import santa_kernels.triton_santa as triton_santa

    config = {**triton_santa.HOPPER_CONFIGS[64], "sample_splits": splits}
    monkeypatch.setitem(triton_santa.HOPPER_CONFIGS, 64, config)
    q, kv = make_cache(hq=6, hkv=2, n=75, lengths=(75, 41))
    first, _ = check_exact(method, q, kv, S=21)  # S not a multiple of the split
    again, _ = check_exact(method, q, kv, S=21)  # the tickets were reset by the last call
    torch.testing.assert_close(again, first, rtol=0, atol=0)


def test_sample_splits_for():
    assert sample_splits_for(32, 128) == 4  # B=1: 32 heads, 4 programs each
    assert sample_splits_for(256, 128) == 1  # B=8: 256 heads, ~2 per SM already
    assert sample_splits_for(32, 16) == 1  # too few samples to share
    assert sample_splits_for(4096, 2048) == 1


@pytest.mark.parametrize("method", ["prop", "largest-remainder"])
def test_large_batch_score_pass_config_matches_float64(method, monkeypatch):
    # B * Hkv >= large_groups: the score pass picks its own launch and split count
    import santa_kernels.triton_santa as triton_santa

    config = {**triton_santa.HOPPER_CONFIGS[64], "stream_large": (1, 4, 8), "large_groups": 2}
    monkeypatch.setitem(triton_santa.HOPPER_CONFIGS, 64, config)
    q, kv = make_cache(hq=6, hkv=2, n=200, lengths=(200, 41))  # 4 groups, 13 tiles
    assert triton_santa.num_splits_for(4, 13, 132, 8) == 4  # the pass's own: 4 splits
    workspace = SantaWorkspace.for_inputs(q, kv, 21, TILE, num_splits=1)  # not the pass's
    check_exact(method, q, kv, S=21, workspace=workspace)


@pytest.mark.parametrize("method", ["prop", "strat", "iid", "largest-remainder"])
@pytest.mark.parametrize("phased", [0, 2])
def test_scaled_row_search_matches_float64(method, phased, monkeypatch):
    """``index_scaled_rows``: the row inside each sampled tile by one rescaled threshold a
    sample against the running sums (no CDF a row, no row mask): the same counts as
    float64, with tiles cut by the length (rows past it hold -inf) and a group of 3."""
    import santa_kernels.triton_santa as triton_santa

    config = {**triton_santa.HOPPER_CONFIGS[64], "index_scaled_rows": 1 << 30,
              "sample_phased": phased, "sample_phased_block": 16}
    monkeypatch.setitem(triton_santa.HOPPER_CONFIGS, 64, config)
    q, kv = make_cache(hq=6, hkv=2, n=75, lengths=(75, 41))
    check_exact(method, q, kv, S=24)
    paged = kv.to_paged(8, torch.Generator().manual_seed(2))
    check_exact(method, q, paged, S=9)


def test_scaled_search_rule():
    """The scaled row search up to ``index_scaled_rows`` heads or from
    ``index_scaled_block`` samples a block; neither key: never."""
    from santa_kernels.triton_santa import _scaled_search

    cfg = {"index_scaled_rows": 64, "index_scaled_block": 256}
    assert _scaled_search(cfg, 64, 128) and _scaled_search(cfg, 256, 256)
    assert not _scaled_search(cfg, 65, 128) and not _scaled_search(cfg, 256, 128)
    assert not _scaled_search({}, 1, 1 << 20)


@pytest.mark.parametrize("method", ["prop", "iid"])
def test_block_triggered_scaled_search_matches_float64(method, monkeypatch):
    """Blocks of ``index_scaled_block`` samples take the scaled search at any head count
    (here 6 heads, above ``index_scaled_rows``): the same counts as float64."""
    import santa_kernels.triton_santa as triton_santa

    config = {**triton_santa.HOPPER_CONFIGS[64], "index_scaled_rows": 0, "sample_phased": 2,
              "sample_phased_block": 32, "index_scaled_block": 32}
    monkeypatch.setitem(triton_santa.HOPPER_CONFIGS, 64, config)
    launches = []  # what each call launched: the scaled search must be among them

    def recorded(*args):
        launches.append(sample_launch(*args))
        return launches[-1]

    sample_launch = triton_santa._sample_launch
    monkeypatch.setattr(triton_santa, "_sample_launch", recorded)
    q, kv = make_cache(hq=6, hkv=2, n=75, lengths=(75, 41))
    check_exact(method, q, kv, S=40)
    assert launches and all(launch.scaled and launch.block == 32 for launch in launches)


def test_bad_uniforms_raise_before_any_launch():
    """The uniforms' shape is checked before the score pass runs: a failed call leaves the
    workspace's step where it was, and the next call draws what a fresh one would."""
    q, kv = make_cache(hq=6, hkv=2, n=75, lengths=(75, 41))
    ws = SantaWorkspace.for_inputs(q, kv, 9, TILE)
    with pytest.raises(InputError, match="uniforms"):
        santa_strat(q, kv, 9, tile=TILE, uniforms=torch.rand(2, 6, 8), workspace=ws)
    assert int(ws.rng[0]) == 0
    check_exact("strat", q, kv, S=9, workspace=ws)


def test_stash_l2_policy_follows_the_stash_size():
    """evict_last for a stash of at most ``stash_l2_bytes`` (B * Hq * rows * element
    size), nothing above it or without the key; an explicit ``stash_evict`` wins."""
    from santa_kernels.triton_santa import _stash_evict

    stash = torch.empty(1, dtype=torch.float16)
    cfg = {"stash_l2_bytes": 12 << 20}
    assert _stash_evict(cfg, 4 * 32, 32768, stash) == "evict_last"  # 8 MiB
    assert _stash_evict(cfg, 8 * 32, 32768, stash) == ""  # 16 MiB
    assert _stash_evict({}, 1, 64, stash) == ""
    assert _stash_evict({**cfg, "stash_evict": ""}, 1, 64, stash) == ""


@pytest.mark.parametrize("policy", ["evict_last", "evict_first"])
def test_stash_l2_policy_changes_no_sample(policy, monkeypatch):
    """The stash's cache policy passes through both passes and changes no sample (the
    interpreter ignores the hint; test_gpu_graphs.py checks it compiled, at 32k B=4)."""
    import santa_kernels.triton_santa as triton_santa

    q, kv = make_cache(hq=8, hkv=2, n=300, lengths=(300, 77))
    uniforms = torch.rand(2, 8, generator=torch.Generator().manual_seed(5))
    plain, info = triton_santa.santa_prop(q, kv, 24, uniforms=uniforms)
    plain, index = plain.clone(), info.sample_index.clone()
    config = {**triton_santa.HOPPER_CONFIGS[64], "stash_evict": policy}
    monkeypatch.setitem(triton_santa.HOPPER_CONFIGS, 64, config)
    hinted, info = triton_santa.santa_prop(q, kv, 24, uniforms=uniforms)
    assert torch.equal(info.sample_index, index)
    assert torch.equal(hinted, plain)


@pytest.mark.parametrize("method", ["prop", "strat", "largest-remainder"])
def test_score_pass_through_tensor_descriptors_matches_float64(method, monkeypatch):
    """K through a tensor descriptor (``tma``: Hopper's bulk copies): the same counts as
    float64; the last tile of the last sequence runs past the tensor (zero-filled rows,
    masked), the other sequence's last tile reads its neighbour's rows (masked)."""
    import santa_kernels.triton_santa as triton_santa

    config = {**triton_santa.HOPPER_CONFIGS[64], "tma": True}
    monkeypatch.setitem(triton_santa.HOPPER_CONFIGS, 64, config)
    q, kv = make_cache(hq=6, hkv=2, n=75, lengths=(75, 41))  # 75 rows: no whole tiles
    assert triton_santa._k_descriptor(kv, TILE) is not None
    check_exact(method, q, kv, S=24)
    paged = kv.to_paged(8, torch.Generator().manual_seed(2))  # no descriptor: plain loads
    assert triton_santa._k_descriptor(paged, TILE) is None
    check_exact(method, q, paged, S=9)


def test_tensor_descriptor_only_for_packed_caches():
    import santa_kernels.triton_santa as triton_santa

    _, kv = make_cache(n=64, lengths=(64, 64))
    assert triton_santa._k_descriptor(kv, TILE) is not None
    k = torch.randn(2, 64, 2, 128)[..., :64]  # a head's row is not packed against the next
    v = torch.randn(2, 64, 2, 64)
    strided = KVCache.contiguous(k, v, torch.tensor([64, 64]))
    assert triton_santa._k_descriptor(strided, TILE) is None




@pytest.mark.parametrize("method", ["prop", "strat", "iid", "largest-remainder"])
@pytest.mark.parametrize("splits", [1, 2])
def test_phased_sample_pass_matches_float64(method, splits, monkeypatch):
    """``sample_phased``: the tile search, the stash rows and the V rows in three loops
    that hand their results over through ``sample_index`` (3 blocks of 16 samples a
    program here, the last one partial); the same counts as float64, also with the
    prefix searched in memory."""
    import santa_kernels.triton_santa as triton_santa

    config = {**triton_santa.HOPPER_CONFIGS[64], "sample_phased": 3, "sample_phased_block": 16,
              "sample_splits": splits}
    monkeypatch.setitem(triton_santa.HOPPER_CONFIGS, 64, config)
    launch = triton_santa._sample_launch(config, 12, 40)
    assert (launch.phased, launch.stages, launch.block) == (True, 3, 16)
    q, kv = make_cache(hq=6, hkv=2, n=75, lengths=(75, 41))
    check_exact(method, q, kv, S=40 * splits)
    paged = kv.to_paged(8, torch.Generator().manual_seed(2))
    check_exact(method, q, paged, S=37)
    monkeypatch.setattr(triton_santa, "MAX_PREFIX_IN_REGS", 2)
    check_exact(method, q, kv, S=37)



def test_sample_launch_follows_its_rules():
    from santa_kernels.triton_santa import HOPPER_CONFIGS, _sample_launch

    def phases(cfg, rows, per_program=16):
        launch = _sample_launch(cfg, rows, per_program)
        return launch.phased, launch.stages

    one = {"sample": (8, 128)}
    cfg = {**one, "sample_phased": 2, "sample_phased_skip": (64, 256)}
    assert phases(cfg, 32) == (True, 2)  # B=1: 32 heads
    assert phases(cfg, 64) == (True, 2)
    assert phases(cfg, 128) == (False, 1)  # B=4
    assert phases(cfg, 256) == (True, 2)  # B=8
    assert phases({**one, "sample_phased": 3, "sample_phased_rows": 128}, 32) == (False, 1)
    assert phases(one, 256) == (False, 1)
    # inside the skipped interval the phased loops return where a block holds enough samples
    cfg = {**cfg, "sample_phased_block": 256, "sample_phased_skip_block": 256}
    assert phases(cfg, 128, per_program=128) == (False, 1)  # B=4, S=128
    assert phases(cfg, 128, per_program=256) == (True, 2)  # B=4, S=256
    assert phases(cfg, 128, per_program=200) == (True, 2)  # a 256 block, partly full
    assert phases(cfg, 256, per_program=16) == (True, 2)  # outside: as before
    # blocks: the phased one capped by a program's samples (at least 16), else "sample"'s
    assert _sample_launch(cfg, 256, 1000).block == 256
    assert _sample_launch(cfg, 256, 100).block == 128
    assert _sample_launch(cfg, 128, 100).block == 128  # one loop: (8, 128)
    assert _sample_launch(cfg, 256, 3).block == 16
    # the H200 d=128 default: 4 warps up to 64 heads; B=8 S=256 phased, 256 a block, scaled
    d128 = HOPPER_CONFIGS[128]
    assert _sample_launch(d128, 32, 64).warps == 4
    assert _sample_launch(d128, 256, 256) == _sample_launch(d128, 256, 2048)
    launch = _sample_launch(d128, 256, 256)
    assert (launch.phased, launch.block, launch.scaled, launch.warps) == (True, 256, True, 8)
    assert not _sample_launch(d128, 256, 128).scaled  # B=8 S=128: the per-row CDF


def test_workspace_builds_a_k_descriptor_once_per_cache_tensor():
    """The descriptor of a cache is reused by later calls; another cache tensor (another
    layer) gets its own, and the oldest go past MAX_DESCRIPTORS."""
    import santa_kernels.triton_santa as triton_santa

    q, kv = make_cache(n=64, lengths=(64, 64))
    _, other = make_cache(n=64, lengths=(64, 64), seed=1)
    ws = SantaWorkspace.for_inputs(q, kv, 8, TILE)
    first = ws.k_descriptor(kv, TILE)
    assert first is not None and ws.k_descriptor(kv, TILE) is first
    assert ws.k_descriptor(other, TILE) is not first
    assert ws.k_descriptor(kv.to_paged(8, torch.Generator().manual_seed(2)), TILE) is None
    for seed in range(triton_santa.MAX_DESCRIPTORS):
        ws.k_descriptor(make_cache(n=64, lengths=(64, 64), seed=seed + 2)[1], TILE)
    assert len(ws._k_descriptors) == triton_santa.MAX_DESCRIPTORS
    assert ws.k_descriptor(kv, TILE) is not first  # evicted, built again
