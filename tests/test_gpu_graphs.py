"""CUDA-graph replays of the sampled kernels draw fresh numbers (GPU only).

The Philox offset of a SANTA call lives in a device counter that the call's kernels
advance, so a captured graph replays different samples each time, and resetting the
counter replays a run exactly (docs/algorithms.md section 8). Skipped without CUDA; the
same mechanism is tested call by call in the interpreter (test_triton_santa.py).
"""

from __future__ import annotations

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.mark.parametrize("function", ["santa_prop", "santa_flash", "santa_strat", "santa_iid"])
def test_graph_replays_draw_fresh_samples_and_reset_reproduces(function):
    import santa_kernels.triton_santa as ts
    import santa_kernels.triton_santa_flash as tsf
    from santa_bench.inputs import DecodeShape, make_decode_inputs

    q, kv = make_decode_inputs(DecodeShape(batch=2, ctx=4096), device="cuda")
    if function == "santa_flash":
        workspace = tsf.flash_workspace(q, kv, 64, 64, seed=1)
    else:
        workspace = ts.SantaWorkspace.for_inputs(q, kv, 64, 64, seed=1)
    kernel = getattr(ts, function)
    kernel(q, kv, 64, workspace=workspace)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, _ = kernel(q, kv, 64, workspace=workspace)
    workspace.reset_rng(0)
    graph.replay()
    first = out.clone()
    graph.replay()
    second = out.clone()
    assert not torch.equal(first, second)  # fresh numbers on every replay
    workspace.reset_rng(0)
    graph.replay()
    assert torch.equal(out, first)  # same seed and step: the same run


def _flash_float64(q, kv, S, uniforms, tile=64):
    """The float64 expectation of santa-flash given a tile's uniforms (the reference's
    formulas): ``(counts [B, Hq, N], output [B, Hq, d])``."""
    from santa_kernels import values as value_stages
    from santa_kernels.scores import exact_scores

    keys, values, valid = kv.padded(torch.float64)
    group = q.shape[1] // kv.num_kv_heads
    scores, _ = exact_scores(q.double(), keys, valid, q.shape[-1] ** -0.5, group)
    n = scores.shape[-1]
    _, tile_mass, local_cdf = value_stages._tiled(scores, tile)
    per_tile = torch.clamp(S // ((kv.lengths + tile - 1) // tile), min=1).double()
    per_tile = per_tile.to(scores.device)[:, None, None, None]
    counts = value_stages._counts_from_cdf(
        local_cdf, uniforms.double()[..., : local_cdf.shape[-2], None], per_tile)
    weights = value_stages._untile(counts * (tile_mass[..., None] / per_tile), n)
    values = values.permute(0, 2, 1, 3).repeat_interleave(group, dim=1)
    return value_stages._untile(counts, n), torch.einsum("bhn,bhnd->bhd", weights, values)


def _check_flash_float64(q, kv, S, uniforms, out, info):
    """The compiled kernel's counts are the float64 expectation's but for rare rounding
    flips at a tile's systematic floors (bf16 scores on tensor cores against float64: at
    most 1 sample in 1000 moves), and on every head whose counts agree its output is the
    expectation's to bf16 rounding."""
    expected, exact = _flash_float64(q, kv, S, uniforms)
    got = info.row_counts()[..., : expected.shape[-1]].double()
    moved = float((got - expected).abs().sum() / (2 * expected.sum()))
    assert moved <= 1e-3, (S, moved)
    same = (got == expected).all(dim=-1)  # [B, Hq]
    assert float(same.float().mean()) >= 0.9, (S, float(same.float().mean()))
    torch.testing.assert_close(out.double()[same], exact[same], rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("layout", ["contiguous", "paged"])
def test_flash_draws_the_float64_counts_on_the_gpu(layout):
    """Llama shape, 8k, S=2048 (P = 16: unpacked columns), 256 (P = 2: pairs) and 64: the
    compiled kernel (K through tensor descriptors where contiguous, V in words) draws the
    float64 counts given the same uniforms, in its lagged loop and, for a short sequence
    of the batch, the loop without the lag."""
    import santa_kernels.triton_santa_flash as tsf
    from santa_bench.inputs import DecodeShape, make_decode_inputs

    q, kv = make_decode_inputs(DecodeShape(batch=2, ctx=8192), device="cuda")
    lengths = torch.tensor([8192, 700], device="cuda")  # 11 tiles: 186 samples a tile
    kv = type(kv).contiguous(kv.k, kv.v, lengths)
    if layout == "paged":
        kv = kv.to_paged(16, torch.Generator().manual_seed(1))
    gen = torch.Generator("cuda").manual_seed(4)
    for S in (2048, 256, 64):
        uniforms = torch.rand(2, 32, 128, device="cuda", generator=gen)
        out, info = tsf.santa_flash(q, kv, S, uniforms=uniforms, return_counts=True)
        _check_flash_float64(q, kv, S, uniforms, out, info)


@pytest.mark.parametrize("batch", [2, 4])
def test_flash_pairs_and_graph_replays_on_the_gpu(batch):
    """Llama shape, 32k, S=2048 (P = 4: pairs, closed-form columns, V once) and 128
    (P = 1): the float64 counts given the same uniforms; under a CUDA graph (the merge a
    programmatic dependent at B=2, 16 sequences x KV heads; after the streaming kernel at
    B=4, 32) a replay gives the eager output of the same seed and step."""
    import santa_kernels.triton_santa_flash as tsf
    from santa_bench.inputs import DecodeShape, make_decode_inputs

    q, kv = make_decode_inputs(DecodeShape(batch=batch, ctx=32768), device="cuda")
    gen = torch.Generator("cuda").manual_seed(5)
    for S in (2048, 128):
        uniforms = torch.rand(batch, 32, 512, device="cuda", generator=gen)
        out, info = tsf.santa_flash(q, kv, S, uniforms=uniforms, return_counts=True)
        _check_flash_float64(q, kv, S, uniforms, out, info)
        ws = tsf.flash_workspace(q, kv, S, 64, seed=3)
        eager = tsf.santa_flash(q, kv, S, workspace=ws)[0].clone()
        ws.reset_rng(0)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            replayed = tsf.santa_flash(q, kv, S, workspace=ws)[0]
        ws.reset_rng(0)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(replayed, eager), S


def test_stash_l2_policy_changes_no_sample_on_the_gpu(monkeypatch):
    """32k B=4, Llama shape: the 8.4 MB stash goes under evict_last by default; without
    the hint the same uniforms give the same samples and the same output, bit for bit."""
    import santa_kernels.triton_santa as ts
    from santa_bench.inputs import DecodeShape, make_decode_inputs

    q, kv = make_decode_inputs(DecodeShape(batch=4, ctx=32768), device="cuda")
    uniforms = torch.rand(4, 32, device="cuda", generator=torch.Generator("cuda").manual_seed(2))
    workspace = ts.SantaWorkspace.for_inputs(q, kv, 128, 64, stash_dtype=torch.float16)
    cfg = ts._config(128)
    assert ts._stash_evict(cfg, 4 * 32, 32768, workspace.stash) == "evict_last"
    hinted, info = ts.santa_prop(q, kv, 128, uniforms=uniforms, workspace=workspace,
                                 stash_dtype=torch.float16)
    hinted, index = hinted.clone(), info.sample_index.clone()
    monkeypatch.setitem(ts.HOPPER_CONFIGS, 128, {**cfg, "stash_evict": ""})
    plain, info = ts.santa_prop(q, kv, 128, uniforms=uniforms, workspace=workspace,
                                stash_dtype=torch.float16)
    assert torch.equal(info.sample_index, index)
    assert torch.equal(plain, hinted)


@pytest.mark.parametrize("batch", [4, 8])
def test_large_sample_blocks_draw_the_per_row_samples_on_the_gpu(batch, monkeypatch):
    """32k, S=256, Llama shape: the default launch (256 samples a block, the scaled row
    search; at B=4 the phased loops) draws the samples of 128-sample blocks with the
    per-row CDF given the same uniforms, up to rounding: at most 1 in 1000 samples
    differs, each inside its tile (the tile search is the same; a rounding step can cross
    rows of near-zero weight, so not always to the next row: 2 rows seen on the H200), and
    the heads with the same samples agree to bf16 rounding."""
    import santa_kernels.triton_santa as ts
    from santa_bench.inputs import DecodeShape, make_decode_inputs

    q, kv = make_decode_inputs(DecodeShape(batch=batch, ctx=32768), device="cuda")
    gen = torch.Generator("cuda").manual_seed(3)
    uniforms = torch.rand(batch, 32, device="cuda", generator=gen)
    cfg = ts._config(128)
    launch = ts._sample_launch(cfg, batch * 32, 256)
    assert launch.phased and launch.scaled and launch.block == 256
    large, info = ts.santa_prop(q, kv, 256, uniforms=uniforms, stash_dtype=torch.float16)
    large, index = large.clone(), info.sample_index.clone()
    monkeypatch.setitem(ts.HOPPER_CONFIGS, 128, {
        **cfg, "sample_phased_block": 128, "index_scaled_block": 1 << 62,
        "sample_phased_skip_block": 1 << 62})
    small, info = ts.santa_prop(q, kv, 256, uniforms=uniforms, stash_dtype=torch.float16)
    moved = info.sample_index != index
    assert int(moved.sum()) <= index.numel() // 1000
    assert torch.equal(info.sample_index // 64, index // 64)
    same = ~moved.any(dim=-1)  # [B, Hq]
    assert int(same.sum()) >= same.numel() // 2
    diff = (small.float() - large.float())[same].norm(dim=-1)
    assert float((diff / small.float()[same].norm(dim=-1)).max()) < 1e-2
