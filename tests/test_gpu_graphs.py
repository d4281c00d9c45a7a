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


@pytest.mark.parametrize("function", ["santa_prop", "santa_flash", "santa_strat", "santa_iid",
                                      "santa_flash_two_pass", "santa_flash_compact"])
def test_graph_replays_draw_fresh_samples_and_reset_reproduces(function):
    import santa_kernels.triton_santa as ts
    import santa_kernels.triton_santa_flash2 as tf2
    import santa_kernels.triton_santa_flash_compact as tfc
    from santa_bench.inputs import DecodeShape, make_decode_inputs

    q, kv = make_decode_inputs(DecodeShape(batch=2, ctx=4096), device="cuda")
    two_pass = function == "santa_flash_two_pass"
    workspace = ts.SantaWorkspace.for_inputs(q, kv, 64, 64, seed=1, store_counts=two_pass)
    module = {"santa_flash_two_pass": tf2, "santa_flash_compact": tfc}.get(function, ts)
    kernel = getattr(module, function)
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


@pytest.mark.parametrize("layout", ["contiguous", "paged"])
def test_one_pass_compact_draws_the_masked_kernels_counts_on_the_gpu(layout):
    """Llama shape, 8k, S=2048 and 64: the compiled one-pass compact kernel (K through
    tensor descriptors where contiguous) draws the masked fused kernel's counts given the
    same uniforms, in its lagged loop and, for a short sequence of the batch, the loop
    without the lag; outputs agree to bf16 rounding."""
    import santa_kernels.triton_santa as ts
    import santa_kernels.triton_santa_flash_compact as tfc
    from santa_bench.inputs import DecodeShape, make_decode_inputs

    q, kv = make_decode_inputs(DecodeShape(batch=2, ctx=8192), device="cuda")
    lengths = torch.tensor([8192, 700], device="cuda")  # 11 tiles: 186 samples a tile
    kv = type(kv).contiguous(kv.k, kv.v, lengths)
    if layout == "paged":
        kv = kv.to_paged(16, torch.Generator().manual_seed(1))
    gen = torch.Generator("cuda").manual_seed(4)
    for S in (2048, 64):
        uniforms = torch.rand(2, 32, 128, device="cuda", generator=gen)
        masked, info = ts.santa_flash(q, kv, S, uniforms=uniforms, return_counts=True)
        out, got = tfc.santa_flash_compact(q, kv, S, uniforms=uniforms, return_counts=True)
        assert torch.equal(got.row_counts(), info.row_counts()), S
        torch.testing.assert_close(out.float(), masked.float(), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("pdl", [False, True])
def test_one_pass_compact_pairs_on_the_gpu(pdl):
    """Llama shape, 32k B=2, S=2048 (P = 4: pairs, closed-form columns, V once) and 128
    (P = 1): the masked fused kernel's counts given the same uniforms; under a CUDA graph
    (the merge a programmatic dependent with ``pdl``) a replay gives the eager output of
    the same seed and step."""
    import santa_kernels.triton_santa as ts
    import santa_kernels.triton_santa_flash_compact as tfc
    from santa_bench.inputs import DecodeShape, make_decode_inputs

    q, kv = make_decode_inputs(DecodeShape(batch=2, ctx=32768), device="cuda")
    gen = torch.Generator("cuda").manual_seed(5)
    for S in (2048, 128):
        uniforms = torch.rand(2, 32, 512, device="cuda", generator=gen)
        masked, info = ts.santa_flash(q, kv, S, uniforms=uniforms, return_counts=True)
        out, got = tfc.santa_flash_compact(q, kv, S, uniforms=uniforms, return_counts=True,
                                           pdl=pdl)
        assert torch.equal(got.row_counts(), info.row_counts()), S
        torch.testing.assert_close(out.float(), masked.float(), rtol=2e-2, atol=2e-2)
        ws = tfc.compact_workspace(q, kv, S, 64, seed=3)
        eager = tfc.santa_flash_compact(q, kv, S, workspace=ws, pdl=pdl)[0].clone()
        ws.reset_rng(0)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            replayed = tfc.santa_flash_compact(q, kv, S, workspace=ws, pdl=pdl)[0]
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
