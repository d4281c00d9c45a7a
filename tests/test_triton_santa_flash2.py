"""Two-pass S²ANTA-flash (``triton_santa_flash2``) vs the fused kernel and float64 torch.

Run on the CPU through Triton's interpreter (docs/algorithms.md section 9): given the same
uniforms (or the same seed and step) the two-pass kernel draws exactly the fused
kernel's counts; over many Philox streams it is unbiased.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")


import pytest
import torch
from test_triton_santa import (
    TILE,
    check_flash_draw,
    check_flash_unbiased,
    make_cache,
    pytestmark,  # noqa: F401 (Triton present; CPU tensors: the interpreter)
    )

from santa_kernels import InputError, KVCache
from santa_kernels.triton_santa import SantaWorkspace, santa_flash
from santa_kernels.triton_santa_flash2 import GATHERS, santa_flash_two_pass


def check_against_fused(q, kv, S, *, out_tol=1e-5, num_splits=None, **gather):
    """Same uniforms: identical counts to santa_flash and to the float64 expectation,
    outputs close to both. ``gather``: pass 2 options (gather_splits, gather_config)."""
    kw = {"workspace": None, **gather}
    if num_splits is not None:
        kw["workspace"] = SantaWorkspace.for_inputs(q, kv, S, TILE, num_splits=num_splits,
                                                    store_counts=True)
    return check_flash_draw(santa_flash_two_pass, q, kv, S, out_tol=out_tol, **kw)


# ------------------------------------------------------------ exact agreement
CASES = [  # (batch, hq, hkv, d, n, lengths)
    (2, 4, 2, 64, 75, (75, 41)),  # G=2, N not a multiple of the tile
    (2, 2, 2, 64, 40, (40, 1)),  # G=1, a length-1 sequence
    (1, 8, 1, 128, 50, (50,)),  # G=8
    (2, 6, 2, 256, 33, (33, 17)),  # G=3 (padded rows)
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"B{c[0]}-Hq{c[1]}-Hkv{c[2]}-d{c[3]}")
@pytest.mark.parametrize("layout", ["contiguous", "paged"])
@pytest.mark.parametrize("gather", GATHERS)
def test_matches_fused_flash_given_same_uniforms(case, layout, gather):
    batch, hq, hkv, d, n, lengths = case
    q, kv = make_cache(batch=batch, hq=hq, hkv=hkv, d=d, n=n, lengths=lengths)
    if layout == "paged":
        kv = kv.to_paged(8, torch.Generator().manual_seed(1))
    check_against_fused(q, kv, S=24, gather=gather)


@pytest.mark.parametrize("gather", ["compact", "inline"])
def test_compact_lists_over_splits_blocks_and_dense_tiles(gather):
    """The row lists: several count programs (lists of several lengths, some empty: the
    short sequence), blocks shorter than a list, S >= N (every row listed, several samples
    a row), and 16-bit V (the weights' two-part dots)."""
    q, kv = make_cache(batch=2, hq=4, hkv=2, n=100, lengths=(100, 7))
    for count_splits in (1, 2, 6):
        check_against_fused(q, kv, S=16, num_splits=6, gather=gather, count_splits=count_splits)
    check_against_fused(q, kv, S=200, num_splits=3, gather=gather, block=16)
    q, kv = make_cache(dtype=torch.bfloat16)
    check_against_fused(q, kv, S=16, out_tol=2e-2, gather=gather)
    q, kv = make_cache(batch=2, hq=2, hkv=1, d=64, n=20, lengths=(20, 1), dtype=torch.float16)
    check_against_fused(q, kv, S=4096, out_tol=2e-2, gather=gather)


def test_multiple_splits_and_budget_above_context():
    q, kv = make_cache(batch=2, hq=4, hkv=2, n=100, lengths=(100, 7))
    check_against_fused(q, kv, S=16, num_splits=3)
    check_against_fused(q, kv, S=200, num_splits=3)  # S >= N: several samples per row
    for gather_splits in (1, 2, 6):  # pass 2 on its own split of the tiles
        check_against_fused(q, kv, S=16, num_splits=6, gather_splits=gather_splits)
    with pytest.raises(InputError, match="gather_splits"):
        check_against_fused(q, kv, S=16, num_splits=3, gather_splits=4)


def test_16_bit_inputs():
    q, kv = make_cache(dtype=torch.bfloat16)
    check_against_fused(q, kv, S=16, out_tol=2e-2)
    # fp16, S=4096 > 2048: the counts split 256 * hi + lo (two tensor-core dots)
    q, kv = make_cache(batch=2, hq=2, hkv=1, d=64, n=20, lengths=(20, 1), dtype=torch.float16)
    check_against_fused(q, kv, S=4096, out_tol=2e-2)


def test_single_token_and_one_hot():
    q, kv = make_cache(batch=1, n=1, lengths=(1,))
    out, _ = santa_flash_two_pass(q, kv, 4, tile=TILE, seed=0)
    torch.testing.assert_close(out[0], kv.v[0, 0].repeat_interleave(2, dim=0), rtol=0, atol=1e-6)
    q, kv = make_cache(batch=1, hq=2, hkv=1, n=40, lengths=(40,))
    q = torch.zeros_like(q)
    q[..., 0] = 100.0
    k = kv.k.clone()
    k[..., 0] = 0.0
    k[0, 27, 0, 0] = 10.0  # score 125 against 0: row 27 carries its tile (and the output)
    kv = KVCache.contiguous(k, kv.v)
    out, _ = santa_flash_two_pass(q, kv, 8, tile=TILE, seed=3)
    torch.testing.assert_close(out, kv.v[0, 27, 0].expand_as(out), rtol=0, atol=1e-6)


# ------------------------------------------------------------ randomness (section 8)
@pytest.mark.parametrize("gather", ["masked", "inline"])
def test_same_philox_stream_as_fused_and_step_advances_once(gather):
    q, kv = make_cache(hq=6, hkv=2, n=75, lengths=(75, 41))
    ws_fused = SantaWorkspace.for_inputs(q, kv, 16, TILE, store_counts=True)
    ws_two = SantaWorkspace.for_inputs(q, kv, 16, TILE, store_counts=True)
    draws = []
    for call in range(2):
        fused = santa_flash(q, kv, 16, tile=TILE, seed=5, workspace=ws_fused,
                            return_counts=True)[1].row_counts().clone()
        out, info = santa_flash_two_pass(q, kv, 16, tile=TILE, seed=5, workspace=ws_two,
                                         gather=gather, return_counts=True)
        assert torch.equal(info.row_counts(), fused)
        assert int(ws_two.rng[0]) == call + 1  # one step per call
        draws.append((out.clone(), fused))
    assert not torch.equal(draws[0][1], draws[1][1])  # the step changed the stream
    ws_two.reset_rng(0)  # replays the first call exactly
    out, info = santa_flash_two_pass(q, kv, 16, tile=TILE, seed=5, workspace=ws_two,
                                     gather=gather, return_counts=True)
    assert torch.equal(info.row_counts(), draws[0][1])
    torch.testing.assert_close(out, draws[0][0], rtol=0, atol=0)
    # the workspace's seed is the default
    ws_two.reset_rng(0, seed=5)
    replay = santa_flash_two_pass(q, kv, 16, tile=TILE, workspace=ws_two, gather=gather,
                                  return_counts=True)[1]
    assert torch.equal(replay.row_counts(), draws[0][1])


def test_group_offsets_same_stream_as_fused():
    q, kv = make_cache(hq=6, hkv=2, n=75, lengths=(75, 41))
    fused = santa_flash(q, kv, 16, tile=TILE, seed=3, return_counts=True,
                        group_offsets=True)[1].row_counts()
    two = santa_flash_two_pass(q, kv, 16, tile=TILE, seed=3, return_counts=True,
                               group_offsets=True)[1].row_counts()
    assert torch.equal(two, fused)
    per_head = santa_flash_two_pass(q, kv, 16, tile=TILE, seed=3, return_counts=True)[1]
    assert not torch.equal(per_head.row_counts(), two)


# ------------------------------------------------------------ in distribution
@pytest.mark.parametrize("gather", GATHERS)
def test_unbiased_and_reference_mse(gather):
    workspaces = {}

    def draw(q, kv, S):
        if "ws" not in workspaces:
            workspaces["ws"] = SantaWorkspace.for_inputs(q, kv, S, TILE, num_splits=2,
                                                         store_counts=True)
        return santa_flash_two_pass(q, kv, S, tile=TILE, workspace=workspaces["ws"], seed=11,
                                    gather=gather)[0]

    check_flash_unbiased(draw)


# ------------------------------------------------------------ input errors
def test_input_errors():
    q, kv = make_cache()
    with pytest.raises(InputError):
        santa_flash_two_pass(q[0], kv, 8, tile=TILE)  # q not [B, Hq, d]
    with pytest.raises(InputError):
        santa_flash_two_pass(q[:, :3], kv, 8, tile=TILE)  # Hq not a multiple of Hkv
    with pytest.raises(InputError):
        santa_flash_two_pass(q[:1], kv, 8, tile=TILE)  # batch differs from the cache's
    with pytest.raises(InputError):
        santa_flash_two_pass(q[..., :32].contiguous(), kv, 8, tile=TILE)  # head dim
    with pytest.raises(InputError):
        santa_flash_two_pass(q, kv.k, 8, tile=TILE)  # not a KVCache
    for bad_s in (0, -3):
        with pytest.raises(InputError):
            santa_flash_two_pass(q, kv, bad_s, tile=TILE)
    with pytest.raises(InputError):
        santa_flash_two_pass(q, kv, 1 << 15, tile=TILE)  # int16 counts
    with pytest.raises(InputError):
        santa_flash_two_pass(q, kv, 8, tile=24)  # not a power of two
    with pytest.raises(InputError, match="uniforms"):
        santa_flash_two_pass(q, kv, 8, tile=TILE, uniforms=torch.rand(2, 4, 3))
    with pytest.raises(InputError, match="store_counts"):
        ws = SantaWorkspace.for_inputs(q, kv, 8, TILE)
        santa_flash_two_pass(q, kv, 8, tile=TILE, workspace=ws)
    with pytest.raises(InputError, match="count_config"):
        santa_flash_two_pass(q, kv, 8, tile=TILE, count_config=(4,))
    with pytest.raises(InputError, match="gather_config"):
        santa_flash_two_pass(q, kv, 8, tile=TILE, gather_config=(0, 2))
    with pytest.raises(InputError, match="gather"):
        santa_flash_two_pass(q, kv, 8, tile=TILE, gather="dense")
    with pytest.raises(InputError, match="block"):
        santa_flash_two_pass(q, kv, 8, tile=TILE, gather="compact", block=48)
    with pytest.raises(InputError, match="count_splits"):
        santa_flash_two_pass(q, kv, 8, tile=TILE, count_splits=0)
    with pytest.raises(InputError, match="gather_splits"):  # lists: pass 1's split
        santa_flash_two_pass(q, kv, 8, tile=TILE, gather="compact", gather_splits=2)
    with pytest.raises(InputError, match="count_splits"):
        santa_flash_two_pass(q, kv, 8, tile=TILE, count_splits=10**6)


def test_default_workspace_holds_the_gather_split(monkeypatch):
    import santa_kernels.triton_santa_flash2 as tf2

    n = TILE * (3 * tf2.GATHER_TILES + 1)
    q, kv = make_cache(batch=1, hq=2, hkv=1, n=n, lengths=(n,))
    monkeypatch.setattr(tf2, "num_splits_for", lambda *args: 1)  # one count program a head
    ws = tf2.two_pass_workspace(q, kv, 8, TILE)
    assert ws.num_splits == 4 and ws.counts is not None  # ceil(tiles / GATHER_TILES)
    check_against_fused(q, kv, S=8)  # the default workspace: 1 count, 4 gather programs
