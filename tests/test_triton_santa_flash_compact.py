"""One-pass compact S²ANTA-flash (``triton_santa_flash_compact``) vs the fused kernel.

Run on the CPU through Triton's interpreter (docs/algorithms.md section 9): given the same
uniforms (or seed and step) the compact kernel draws exactly the masked fused kernel's
counts, in its lagged loop and in the loop for sequences that draw more than ``P``
samples a tile; over many Philox streams it is unbiased with the reference's MSE.
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
from santa_kernels.triton_santa_flash_compact import (
    compact_splits,
    compact_workspace,
    default_draw_tiles,
    lag_samples,
    pair_draws,
    santa_flash_compact,
    v_words,
)


def check_against_fused(q, kv, S, *, out_tol=1e-5, num_splits=None, **kw):
    """Same uniforms: the masked fused kernel's counts and the float64 expectation's,
    outputs close to both."""
    if num_splits is not None:
        kw["workspace"] = SantaWorkspace.for_inputs(q, kv, S, TILE, num_splits=num_splits)
    return check_flash_draw(santa_flash_compact, q, kv, S, out_tol=out_tol, **kw)


CASES = [  # (batch, hq, hkv, d, n, lengths)
    (2, 4, 2, 64, 75, (75, 41)),  # G=2, N not a multiple of the tile
    (2, 2, 2, 64, 40, (40, 1)),  # G=1, a length-1 sequence
    (1, 8, 1, 128, 50, (50,)),  # G=8
    (2, 6, 2, 256, 33, (33, 17)),  # G=3 (padded rows)
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"B{c[0]}-Hq{c[1]}-Hkv{c[2]}-d{c[3]}")
@pytest.mark.parametrize("layout", ["contiguous", "paged"])
def test_matches_fused_flash_given_same_uniforms(case, layout):
    batch, hq, hkv, d, n, lengths = case
    q, kv = make_cache(batch=batch, hq=hq, hkv=hkv, d=d, n=n, lengths=lengths)
    if layout == "paged":
        kv = kv.to_paged(8, torch.Generator().manual_seed(1))
    check_against_fused(q, kv, S=24)


def test_lagged_and_unlagged_loops_splits_and_large_budgets():
    """Sequences of one batch in both loops (the short one draws more than P a tile),
    several splits, P forced small (the unlagged loop's chunks), S >= N, 16-bit inputs."""
    q, kv = make_cache(batch=2, hq=4, hkv=2, n=100, lengths=(100, 7))
    assert lag_samples(16, 100, TILE) == 2  # 16 // 7 tiles; the 7-row sequence draws 16
    for splits in (1, 2, 6):
        check_against_fused(q, kv, S=16, num_splits=splits)
    check_against_fused(q, kv, S=16, num_splits=1, samples=1)  # P=1: one row a head
    check_against_fused(q, kv, S=200, num_splits=3)  # several samples a row
    check_against_fused(q, kv, S=200, samples=4)  # 28 a tile in 4-sample chunks
    check_against_fused(q, kv, S=16, samples=1)
    q, kv = make_cache(dtype=torch.bfloat16)
    check_against_fused(q, kv, S=16, out_tol=2e-2)
    q, kv = make_cache(batch=2, hq=2, hkv=1, d=64, n=20, lengths=(20, 1), dtype=torch.float16)
    check_against_fused(q, kv, S=4096, out_tol=2e-2)


def test_v_in_words_and_in_elements():
    """16-bit V is read in 32-bit words of two elements where its strides and base allow
    (the words' two halves summed apart, stored interleaved), else element by element:
    both draw the fused kernel's counts and give its output."""
    q, kv = make_cache(batch=2, hq=4, hkv=2, d=64, n=75, lengths=(75, 41),
                       dtype=torch.bfloat16)
    assert v_words(kv.v) and not v_words(kv.v.float())
    check_against_fused(q, kv, S=24, out_tol=2e-2)
    # the same values one element into a buffer: base and strides odd, no words
    buf = torch.empty(kv.v.numel() + 1, dtype=kv.v.dtype)
    shifted = buf[1:].view(kv.v.shape)
    shifted.copy_(kv.v)
    odd = torch.as_strided(buf, (2, 75, 2, 63), (75 * 2 * 63, 2 * 63, 63, 1), 1)
    odd.copy_(kv.v[..., :63])
    assert not v_words(shifted) and not v_words(odd)
    check_against_fused(q, KVCache.contiguous(kv.k, shifted), S=24, out_tol=2e-2)


def test_unpacked_columns():
    """The sampled columns through the [ROWS, P, TILE] block (``packed_columns=False``,
    the path of P > 8 and tiles over 128 rows): the fused kernel's counts and output in
    both loops, over splits, with P=8, paged, 16-bit words."""
    kw = {"packed_columns": False}
    q, kv = make_cache(batch=2, hq=4, hkv=2, n=100, lengths=(100, 7))
    check_against_fused(q, kv, S=16, num_splits=2, **kw)  # the 7-row sequence: no lag
    check_against_fused(q, kv, S=16, num_splits=1, samples=1, **kw)
    check_against_fused(q, kv, S=200, samples=8, num_splits=3, **kw)
    check_against_fused(q, kv.to_paged(8, torch.Generator().manual_seed(1)), S=24, **kw)
    q, kv = make_cache(batch=2, hq=6, hkv=2, d=64, n=75, lengths=(75, 41),
                       dtype=torch.bfloat16)  # G=3: a padded head
    check_against_fused(q, kv, S=24, out_tol=2e-2, **kw)


@pytest.mark.parametrize("kw", [{"draw_tiles": 1}, {"draw_tiles": 2},
                                {"draw_tiles": 2, "v_twice": False},
                                {"draw_tiles": 2, "v_twice": True, "closed_columns": False},
                                {"draw_tiles": 2, "closed_columns": True}],
                         ids=["one", "pairs", "pairs-v-once", "pairs-v-twice-compares",
                              "pairs-closed-columns"])
def test_tiles_drawn_one_at_a_time_and_in_pairs(kw):
    """Both draws (pairs with V loaded twice or once, columns by compares or the closed
    form; the defaults by P) give the fused kernel's counts and output: programs of even
    and odd tile counts (a lone last tile pairs with an empty one), one tile a program,
    the unlagged loop of a short sequence, P=1, 2 and 4, paged, a padded group (G=3),
    16-bit words."""
    q, kv = make_cache(batch=2, hq=4, hkv=2, n=100, lengths=(100, 7))  # 7 tiles
    for splits in (1, 2, 3, 7):
        check_against_fused(q, kv, S=16, num_splits=splits, **kw)
    check_against_fused(q, kv, S=16, num_splits=1, samples=1, **kw)
    check_against_fused(q, kv.to_paged(8, torch.Generator().manual_seed(1)), S=24, **kw)
    q, kv = make_cache(batch=2, hq=6, hkv=2, d=64, n=75, lengths=(75, 41),
                       dtype=torch.bfloat16)
    check_against_fused(q, kv, S=24, out_tol=2e-2, **kw)


def test_closed_form_columns():
    """The packed columns by the closed form (``closed_columns``): the fused kernel's
    counts in both loops, the unlagged loop's later chunks (j0 > 0) and 8 samples a tile
    (64-bit fields) included."""
    kw = {"closed_columns": True, "draw_tiles": 1}
    q, kv = make_cache(batch=2, hq=4, hkv=2, n=100, lengths=(100, 7))
    check_against_fused(q, kv, S=16, num_splits=2, **kw)
    check_against_fused(q, kv, S=200, samples=4, **kw)  # 28 a tile in 4-sample chunks
    check_against_fused(q, kv, S=200, samples=8, num_splits=3, **kw)
    check_against_fused(q, kv, S=24, samples=2, **kw)


def test_pairs_draw_the_seeded_stream_and_need_room_in_the_dot():
    """Given a seed and step (no uniforms) pairs draw what one tile at a time draws; a
    group that fills the dot's 16 rows cannot pair, nor can the [ROWS, P, TILE] columns;
    the default pairs where it may."""
    q, kv = make_cache(batch=2, hq=6, hkv=2, n=100, lengths=(100, 60))
    counts = []
    for draw_tiles in (1, 2):
        ws = SantaWorkspace.for_inputs(q, kv, 16, TILE, num_splits=3)
        out, info = santa_flash_compact(q, kv, 16, tile=TILE, seed=9, workspace=ws,
                                        return_counts=True, draw_tiles=draw_tiles)
        counts.append((info.row_counts().clone(), out))
    assert torch.equal(counts[0][0], counts[1][0])
    torch.testing.assert_close(counts[0][1], counts[1][1], rtol=1e-5, atol=1e-5)
    q16, kv16 = make_cache(batch=1, hq=16, hkv=1, n=40, lengths=(40,))
    for cache, bad in (((q16, kv16), {"draw_tiles": 2}), ((q, kv), {"draw_tiles": 3}),
                       ((q, kv), {"draw_tiles": 2, "packed_columns": False})):
        with pytest.raises(InputError, match="draw_tiles"):
            santa_flash_compact(*cache, 8, tile=TILE, **bad)
    out, _ = santa_flash_compact(q16, kv16, 8, tile=TILE, seed=1)  # the default: one tile
    assert torch.isfinite(out).all()
    assert not pair_draws(16, 1) and not pair_draws(4, 16) and pair_draws(8, 4)
    assert default_draw_tiles(4, 4) == 2 and default_draw_tiles(8, 4) == 1  # 64 rows a pair
    assert default_draw_tiles(4, 4, tile=256) == 1


def test_default_split_fills_the_sms_in_one_wave():
    """Llama shape (8 KV heads, d=128, 512 tiles of 32k): the programs of the default
    split fit the H200's 132 SMs at once: 4 an SM of the 4-warp launch (every group count
    drawing pairs), 5 of the 2-warp launch of 32 groups and more one tile at a time;
    short sequences keep 4 tiles a program."""
    for batch, expected, one_tile in [(1, 64, 64), (2, 32, 32), (4, 16, 20), (8, 8, 10),
                                      (16, 4, 5), (32, 2, 2)]:
        groups = batch * 8
        splits = compact_splits(groups, 512)  # pairs: four 4-warp programs an SM
        assert splits == expected, batch
        assert groups * splits <= 4 * 132
        # one tile at a time: five 2-warp programs an SM
        assert compact_splits(groups, 512, pairs=False) == one_tile, batch
        assert groups * one_tile <= (5 if groups >= 32 else 4) * 132
    assert compact_splits(8, 8) == 2  # 8 tiles: 4 a program
    q, kv = make_cache(batch=2, hq=4, hkv=2, n=100, lengths=(100, 7))
    assert compact_workspace(q, kv, 16, TILE).num_splits == compact_splits(4, -(-100 // TILE))


def test_single_token_and_one_hot():
    q, kv = make_cache(batch=1, n=1, lengths=(1,))
    out, _ = santa_flash_compact(q, kv, 4, tile=TILE, seed=0)
    torch.testing.assert_close(out[0], kv.v[0, 0].repeat_interleave(2, dim=0), rtol=0, atol=1e-6)
    q, kv = make_cache(batch=1, hq=2, hkv=1, n=40, lengths=(40,))
    q = torch.zeros_like(q)
    q[..., 0] = 100.0
    k = kv.k.clone()
    k[..., 0] = 0.0
    k[0, 27, 0, 0] = 10.0  # score 125 against 0: row 27 carries its tile (and the output)
    kv = KVCache.contiguous(k, kv.v)
    out, _ = santa_flash_compact(q, kv, 8, tile=TILE, seed=3)
    torch.testing.assert_close(out, kv.v[0, 27, 0].expand_as(out), rtol=0, atol=1e-6)


def test_same_philox_stream_as_fused_and_step_advances_once():
    q, kv = make_cache(hq=6, hkv=2, n=75, lengths=(75, 41))
    ws_fused = SantaWorkspace.for_inputs(q, kv, 16, TILE, store_counts=True)
    ws = SantaWorkspace.for_inputs(q, kv, 16, TILE)
    draws = []
    for call in range(2):
        fused = santa_flash(q, kv, 16, tile=TILE, seed=5, workspace=ws_fused,
                            return_counts=True)[1].row_counts().clone()
        out, info = santa_flash_compact(q, kv, 16, tile=TILE, seed=5, workspace=ws,
                                        return_counts=True)
        assert torch.equal(info.row_counts(), fused)
        assert int(ws.rng[0]) == call + 1  # one step per call
        draws.append((out.clone(), fused))
    assert not torch.equal(draws[0][1], draws[1][1])  # the step changed the stream
    ws.reset_rng(0)  # replays the first call exactly
    out, info = santa_flash_compact(q, kv, 16, tile=TILE, seed=5, workspace=ws,
                                    return_counts=True)
    assert torch.equal(info.row_counts(), draws[0][1])
    torch.testing.assert_close(out, draws[0][0], rtol=0, atol=0)
    group = santa_flash_compact(q, kv, 16, tile=TILE, seed=3, return_counts=True,
                                group_offsets=True)[1].row_counts()
    fused_group = santa_flash(q, kv, 16, tile=TILE, seed=3, return_counts=True,
                              group_offsets=True)[1].row_counts()
    assert torch.equal(group, fused_group)


def test_unbiased_and_reference_mse():
    workspaces = {}

    def draw(q, kv, S):
        if "ws" not in workspaces:
            workspaces["ws"] = SantaWorkspace.for_inputs(q, kv, S, TILE, num_splits=2)
        return santa_flash_compact(q, kv, S, tile=TILE, workspace=workspaces["ws"], seed=11)[0]

    check_flash_unbiased(draw)


class _Launches:
    """Stands in for a Triton kernel: records each ``kernel[grid](*args, **kw)``'s kw."""

    def __init__(self):
        self.calls = []

    def __getitem__(self, grid):
        return lambda *args, **kw: self.calls.append(kw)


def test_default_switches_by_samples_and_groups(monkeypatch):
    """The launch defaults (no kernel runs): closed-form columns and V loaded once from
    CLOSED_MIN_SAMPLES samples a tile on (compares and V twice below); the merge on
    MERGE_WARPS warps, a programmatic dependent below LARGE_GROUPS sequences x KV heads
    where PDL is available (never where it is not); pairs on the 4-warp launch."""
    import santa_kernels.triton_santa_flash_compact as tfc

    stream, merge = _Launches(), _Launches()
    monkeypatch.setattr(tfc, "_flash_compact_kernel", stream)
    monkeypatch.setattr(tfc, "_merge_kernel", merge)
    q, kv = make_cache(batch=2, hq=4, hkv=2, n=128, lengths=(128, 128))  # 8 tiles of 16
    for samples, closed in ((4, True), (1, False), (2, False)):
        santa_flash_compact(q, kv, 32, tile=TILE, samples=samples)
        assert stream.calls[-1]["CLOSED_COLUMNS"] is closed, samples
        assert stream.calls[-1]["V_TWICE"] is (not closed), samples
        assert stream.calls[-1]["DRAW_TILES"] == 2 and stream.calls[-1]["num_warps"] == 4
        assert merge.calls[-1]["num_warps"] == tfc.MERGE_WARPS
        assert not merge.calls[-1]["PDL"] and "launch_pdl" not in merge.calls[-1]  # CPU
    monkeypatch.setattr(tfc, "pdl_available", lambda device: True)
    santa_flash_compact(q, kv, 32, tile=TILE)  # 4 groups
    assert merge.calls[-1]["PDL"] and merge.calls[-1]["launch_pdl"]
    assert stream.calls[-1]["LET_MERGE"]
    qb, kvb = make_cache(batch=tfc.LARGE_GROUPS, hq=4, hkv=1, d=128, n=32,
                         lengths=(32,) * tfc.LARGE_GROUPS)  # d=128: a 2-warp launch apart
    santa_flash_compact(qb, kvb, 8, tile=TILE)  # 32 groups: no PDL, still 4 warps
    assert not merge.calls[-1]["PDL"] and not stream.calls[-1]["LET_MERGE"]
    assert stream.calls[-1]["num_warps"] == 4
    santa_flash_compact(q, kv, 32, tile=TILE, pdl=False, merge_warps=1, closed_columns=False,
                        v_twice=True, samples=4)  # explicit switches win
    assert not merge.calls[-1]["PDL"] and merge.calls[-1]["num_warps"] == 1
    assert not stream.calls[-1]["CLOSED_COLUMNS"] and stream.calls[-1]["V_TWICE"]


def test_input_errors():
    q, kv = make_cache()
    with pytest.raises(InputError):
        santa_flash_compact(q[0], kv, 8, tile=TILE)  # q not [B, Hq, d]
    with pytest.raises(InputError):
        santa_flash_compact(q[:, :3], kv, 8, tile=TILE)  # Hq not a multiple of Hkv
    with pytest.raises(InputError):
        santa_flash_compact(q, kv.k, 8, tile=TILE)  # not a KVCache
    for bad_s in (0, -3):
        with pytest.raises(InputError):
            santa_flash_compact(q, kv, bad_s, tile=TILE)
    with pytest.raises(InputError, match="uniforms"):
        santa_flash_compact(q, kv, 8, tile=TILE, uniforms=torch.rand(2, 4, 3))
    with pytest.raises(InputError, match="samples"):
        santa_flash_compact(q, kv, 8, tile=TILE, samples=3)
    with pytest.raises(InputError, match="samples"):
        santa_flash_compact(q, kv, 8, tile=TILE, samples=0)
    with pytest.raises(InputError, match="config"):
        santa_flash_compact(q, kv, 8, tile=TILE, config=(4,))
    with pytest.raises(InputError, match="merge_warps"):
        santa_flash_compact(q, kv, 8, tile=TILE, merge_warps=0)


def test_default_launch_by_groups_and_tile():
    from santa_kernels.triton_santa_flash_compact import COMPACT_CONFIG, compact_config

    assert compact_config(128) == COMPACT_CONFIG[128]
    assert compact_config(128, groups=64) != compact_config(128, groups=8)  # measured apart
    assert compact_config(128, groups=64, pairs=True) == COMPACT_CONFIG[128]  # pairs: 4 warps
    assert compact_config(128, groups=8, tile=128)[1] == 2  # 2 stages for wide tiles
    assert compact_config(112) == COMPACT_CONFIG[128]  # the nearest swept head dim
