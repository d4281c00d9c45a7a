"""S²ANTA-flash's kernel (``triton_santa_flash``) vs float64 torch, path by path.

Run on the CPU through Triton's interpreter (docs/algorithms.md section 9): given the same
uniforms the kernel draws exactly the float64 expectation's counts (the reference's
formulas) and gives its output, on every path its launch takes by shape: the lagged loop
drawing one tile or a pair at a time (columns by compares or the closed form, V loaded
once or twice), the loop of sequences that draw more than ``P`` samples a tile, the
unpacked columns of ``P > 8``, V in words or elements. Unbiasedness and the reference's
error over many Philox streams: tests/test_triton_santa.py.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")


import pytest
import torch
from test_triton_santa import (
    TILE,
    check_exact,
    make_cache,
    pytestmark,  # noqa: F401 (Triton present; CPU tensors: the interpreter)
    )

from santa_kernels import InputError, KVCache
from santa_kernels.triton_santa import SantaWorkspace
from santa_kernels.triton_santa_flash import (
    CLOSED_MIN_SAMPLES,
    FLASH_CONFIG,
    LARGE_GROUP_MAX_HEADS,
    default_draw_tiles,
    flash_config,
    flash_splits,
    flash_workspace,
    lag_samples,
    pair_draws,
    santa_flash,
    v_words,
)


def check_draw(q, kv, S, *, out_tol=1e-5, num_splits=None, **kw):
    """Same uniforms: the float64 expectation's counts, its output within ``out_tol``
    (``num_splits``: a workspace split so)."""
    if num_splits is not None:
        kw["workspace"] = SantaWorkspace.for_inputs(q, kv, S, TILE, num_splits=num_splits)
    return check_exact("flash", q, kv, S, out_tol=out_tol, **kw)


CASES = [  # (batch, hq, hkv, d, n, lengths)
    (2, 4, 2, 64, 75, (75, 41)),  # G=2, N not a multiple of the tile
    (2, 2, 2, 64, 40, (40, 1)),  # G=1, a length-1 sequence
    (1, 8, 1, 128, 50, (50,)),  # G=8
    (2, 6, 2, 256, 33, (33, 17)),  # G=3 (padded rows)
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"B{c[0]}-Hq{c[1]}-Hkv{c[2]}-d{c[3]}")
@pytest.mark.parametrize("layout", ["contiguous", "paged"])
def test_matches_float64_given_same_uniforms(case, layout):
    batch, hq, hkv, d, n, lengths = case
    q, kv = make_cache(batch=batch, hq=hq, hkv=hkv, d=d, n=n, lengths=lengths)
    if layout == "paged":
        kv = kv.to_paged(8, torch.Generator().manual_seed(1))
    check_draw(q, kv, S=24)


# (hq, hkv, S, P, tiles drawn at once) on 100 rows (7 tiles of 16), lengths 100 and 7:
# the 7-row sequence draws S a tile, more than P, in the loop without the lag
PATHS = [
    (4, 2, 7, 1, 2),  # pairs, one sample a tile: compares, V loaded twice
    (4, 2, 16, 2, 2),  # pairs, compares, V twice
    (4, 2, 32, 4, 2),  # pairs, the closed form, V once
    (4, 2, 56, 8, 2),  # pairs, the closed form in 64-bit fields
    (8, 1, 32, 4, 1),  # one tile a draw (a pair would gather 64 rows), closed form
    (16, 1, 16, 2, 1),  # one tile a draw (16 heads fill the dot), compares
    (4, 2, 200, 32, 1),  # P > 8: the [ROWS, P, TILE] columns
]


@pytest.mark.parametrize("path", PATHS, ids=lambda p: f"G{p[0] // p[1]}-S{p[2]}")
def test_every_path_draws_the_float64_counts(path):
    """Each path the launch takes by shape gives the float64 counts and output: programs
    of even and odd tile counts (a lone last tile pairs with an empty one), one tile a
    program, the unlagged loop's chunks of a short sequence, paged."""
    hq, hkv, S, samples, tiles = path
    assert lag_samples(S, 100, TILE) == samples
    if samples <= 8:
        assert default_draw_tiles(hq // hkv, samples, TILE) == tiles
    assert (samples >= CLOSED_MIN_SAMPLES) == (S in (32, 56, 200))
    q, kv = make_cache(batch=2, hq=hq, hkv=hkv, n=100, lengths=(100, 7))
    for splits in (1, 2, 3, 7):
        check_draw(q, kv, S=S, num_splits=splits)
    check_draw(q, kv.to_paged(8, torch.Generator().manual_seed(1)), S=S)


def test_large_budgets_and_16_bit_inputs():
    """S >= N (several samples a row), a short sequence drawing every budget in the
    unlagged loop, 16-bit inputs (V in words of two elements); a padded group (G=3)."""
    q, kv = make_cache(batch=2, hq=4, hkv=2, n=100, lengths=(100, 7))
    check_draw(q, kv, S=200, num_splits=3)
    q, kv = make_cache(dtype=torch.bfloat16)
    check_draw(q, kv, S=16, out_tol=2e-2)
    q, kv = make_cache(batch=2, hq=6, hkv=2, d=64, n=75, lengths=(75, 41),
                       dtype=torch.bfloat16)
    check_draw(q, kv, S=24, out_tol=2e-2)
    check_draw(q, kv, S=200, out_tol=2e-2)  # P = 64: unpacked
    q, kv = make_cache(batch=2, hq=2, hkv=1, d=64, n=20, lengths=(20, 1), dtype=torch.float16)
    check_draw(q, kv, S=4096, out_tol=2e-2)


def test_v_in_words_and_in_elements():
    """16-bit V is read in 32-bit words of two elements where its strides and base allow
    (the words' two halves summed apart, stored interleaved), else element by element:
    both draw the float64 counts and give its output."""
    q, kv = make_cache(batch=2, hq=4, hkv=2, d=64, n=75, lengths=(75, 41),
                       dtype=torch.bfloat16)
    assert v_words(kv.v) and not v_words(kv.v.float())
    check_draw(q, kv, S=24, out_tol=2e-2)
    # the same values one element into a buffer: base and strides odd, no words
    buf = torch.empty(kv.v.numel() + 1, dtype=kv.v.dtype)
    shifted = buf[1:].view(kv.v.shape)
    shifted.copy_(kv.v)
    odd = torch.as_strided(buf, (2, 75, 2, 63), (75 * 2 * 63, 2 * 63, 63, 1), 1)
    odd.copy_(kv.v[..., :63])
    assert not v_words(shifted) and not v_words(odd)
    check_draw(q, KVCache.contiguous(kv.k, shifted), S=24, out_tol=2e-2)


def test_seeded_draws_do_not_depend_on_the_split():
    """Given a seed and step (no uniforms), the counts are those of one (step, sequence,
    head, tile) offset each, whatever the split (which moves the pairs' boundaries); one
    step a call, and a reset replays a call exactly. Where pairs may not be drawn (a group
    that fills the dot's 16 rows, P > 8) the launch draws one tile at a time."""
    q, kv = make_cache(batch=2, hq=6, hkv=2, n=100, lengths=(100, 60))
    assert default_draw_tiles(3, lag_samples(16, 100, TILE)) == 2
    draws = []
    for splits in (1, 2, 3, 7):
        ws = SantaWorkspace.for_inputs(q, kv, 16, TILE, num_splits=splits)
        out, info = santa_flash(q, kv, 16, tile=TILE, seed=9, workspace=ws, return_counts=True)
        draws.append((info.row_counts().clone(), out.clone()))
        assert int(ws.rng[0]) == 1  # one step per call
    for counts, out in draws[1:]:
        assert torch.equal(counts, draws[0][0])
        torch.testing.assert_close(out, draws[0][1], rtol=1e-5, atol=1e-5)
    ws.reset_rng(0)  # replays the last call exactly
    out, info = santa_flash(q, kv, 16, tile=TILE, seed=9, workspace=ws, return_counts=True)
    assert torch.equal(info.row_counts(), draws[-1][0])
    torch.testing.assert_close(out, draws[-1][1], rtol=0, atol=0)
    second = santa_flash(q, kv, 16, tile=TILE, seed=9, workspace=ws, return_counts=True)[1]
    assert not torch.equal(second.row_counts(), draws[-1][0])  # the step moved the stream
    assert not pair_draws(16, 1) and not pair_draws(4, 16) and pair_draws(8, 4)
    assert not pair_draws(4, 4, tile=256)
    assert default_draw_tiles(4, 4) == 2 and default_draw_tiles(8, 4) == 1  # 64 rows a pair


def test_default_split_fills_the_sms_in_one_wave():
    """Llama shape (8 KV heads, d=128, 512 tiles of 32k): the programs of the default
    split fit the H200's 132 SMs at once: 4 an SM of the 4-warp launch (every group count
    drawing pairs), 5 of the 2-warp launch of 32 groups and more one tile at a time;
    short sequences keep 4 tiles a program."""
    for batch, expected, one_tile in [(1, 64, 64), (2, 32, 32), (4, 16, 20), (8, 8, 10),
                                      (16, 4, 5), (32, 2, 2)]:
        groups = batch * 8
        splits = flash_splits(groups, 512)  # pairs: four 4-warp programs an SM
        assert splits == expected, batch
        assert groups * splits <= 4 * 132
        # one tile at a time: five 2-warp programs an SM
        assert flash_splits(groups, 512, pairs=False) == one_tile, batch
        assert groups * one_tile <= (5 if groups >= 32 else 4) * 132
    assert flash_splits(8, 8) == 2  # 8 tiles: 4 a program
    q, kv = make_cache(batch=2, hq=4, hkv=2, n=100, lengths=(100, 7))
    assert flash_workspace(q, kv, 16, TILE).num_splits == flash_splits(4, -(-100 // TILE))


class _Launches:
    """Stands in for a Triton kernel: records each ``kernel[grid](*args, **kw)``'s kw."""

    def __init__(self):
        self.calls = []

    def __getitem__(self, grid):
        return lambda *args, **kw: self.calls.append(kw)


def test_launch_follows_the_samples_and_the_groups(monkeypatch):
    """The launch (no kernel runs): closed-form columns and V loaded once from
    CLOSED_MIN_SAMPLES samples a tile on (compares and V twice below); packed columns and
    pairs up to 8 samples; the merge on MERGE_WARPS warps, a programmatic dependent below
    LARGE_GROUPS sequences x KV heads where PDL is available (never where it is not);
    pairs on the 4-warp launch at every group count, one tile at a time on 2 warps from
    LARGE_GROUPS on (d=128)."""
    import santa_kernels.triton_santa_flash as tsf

    stream, merge = _Launches(), _Launches()
    monkeypatch.setattr(tsf, "_flash_kernel", stream)
    monkeypatch.setattr(tsf, "_merge_kernel", merge)
    q, kv = make_cache(batch=2, hq=4, hkv=2, n=128, lengths=(128, 128))  # 8 tiles of 16
    for S, samples in ((32, 4), (8, 1), (16, 2), (64, 8)):
        santa_flash(q, kv, S, tile=TILE)
        closed = samples >= CLOSED_MIN_SAMPLES
        launch = stream.calls[-1]
        assert launch["P"] == samples and launch["CLOSED_COLUMNS"] is closed, S
        assert launch["V_TWICE"] is (not closed) and launch["PACKED"], S
        assert launch["DRAW_TILES"] == 2 and launch["num_warps"] == 4, S
        assert merge.calls[-1]["num_warps"] == tsf.MERGE_WARPS
        assert not merge.calls[-1]["PDL"] and "launch_pdl" not in merge.calls[-1]  # CPU
    santa_flash(q, kv, 128, tile=TILE)  # P = 16: unpacked, one tile a draw
    assert not stream.calls[-1]["PACKED"] and stream.calls[-1]["DRAW_TILES"] == 1
    monkeypatch.setattr(tsf, "pdl_available", lambda device: True)
    santa_flash(q, kv, 32, tile=TILE)  # 4 groups
    assert merge.calls[-1]["PDL"] and merge.calls[-1]["launch_pdl"]
    assert stream.calls[-1]["LET_MERGE"]
    groups = tsf.LARGE_GROUPS
    qb, kvb = make_cache(batch=groups, hq=4, hkv=1, d=128, n=32, lengths=(32,) * groups)
    santa_flash(qb, kvb, 8, tile=TILE)  # 32 groups, pairs: no PDL, still 4 warps
    assert not merge.calls[-1]["PDL"] and not stream.calls[-1]["LET_MERGE"]
    assert stream.calls[-1]["DRAW_TILES"] == 2 and stream.calls[-1]["num_warps"] == 4
    santa_flash(qb, kvb, 16, tile=TILE)  # P = 8, 4 heads a group: one tile a draw, 2 warps
    assert stream.calls[-1]["DRAW_TILES"] == 1 and stream.calls[-1]["num_warps"] == 2
    qb, kvb = make_cache(batch=groups, hq=16, hkv=1, d=128, n=32, lengths=(32,) * groups)
    santa_flash(qb, kvb, 8, tile=TILE)  # 16 heads a group: one tile a draw, 4 warps
    assert stream.calls[-1]["DRAW_TILES"] == 1 and stream.calls[-1]["num_warps"] == 4


def test_groups_of_more_than_four_heads_keep_four_warps(monkeypatch):
    """Qwen's 28/4 at B=8 (32 groups of 7 heads, P = 4 at S=2048 and 32k: one tile a
    draw) takes the 4-warp launch and its split (four programs an SM, one wave), not the
    2-warp launch measured on groups of 4 heads, which those keep."""
    import santa_kernels.triton_santa_flash as tsf

    large = tsf.FLASH_CONFIG_LARGE[128]
    assert default_draw_tiles(7, lag_samples(2048, 32768, 64), 64) == 1
    assert flash_config(128, groups=32, heads=7) == FLASH_CONFIG[128]
    assert flash_config(128, groups=32, heads=LARGE_GROUP_MAX_HEADS) == large
    assert flash_config(128, groups=32) == large  # the default: the measured launch
    assert flash_splits(32, 512, pairs=False, heads=7) == 16  # 512 programs: 4 an SM
    assert flash_splits(32, 512, pairs=False, heads=4) == 20  # 640: 5 an SM
    stream = _Launches()
    monkeypatch.setattr(tsf, "_flash_kernel", stream)
    monkeypatch.setattr(tsf, "_merge_kernel", _Launches())
    q, kv = make_cache(batch=8, hq=28, hkv=4, d=128, n=32, lengths=(32,) * 8)
    santa_flash(q, kv, 8, tile=TILE)  # 2 tiles of 16, 4 samples a tile
    launch = stream.calls[-1]
    assert launch["P"] == 4 and launch["DRAW_TILES"] == 1 and launch["ROWS"] == 8
    assert (launch["num_warps"], launch["num_stages"]) == FLASH_CONFIG[128]


def test_groups_of_seven_heads_draw_the_same_samples_at_any_split():
    """G=7 (8 rows a draw, one of them padding; one tile a draw at P = 4), 32- and 16-bit:
    the float64 counts and output given uniforms at every split, and seeded draws the
    same counts and output (to rounding) at the split of either launch."""
    q, kv = make_cache(batch=2, hq=14, hkv=2, d=64, n=100, lengths=(100, 60))
    assert lag_samples(28, 100, TILE) == 4 and default_draw_tiles(7, 4, TILE) == 1
    for splits in (1, 2, 7):
        check_draw(q, kv, S=28, num_splits=splits)
    check_draw(q.bfloat16(), KVCache.contiguous(kv.k.bfloat16(), kv.v.bfloat16(), kv.lengths),
               S=28, out_tol=2e-2, num_splits=3)
    draws = []
    for splits in (2, 3):  # the splits of 16 and 20 programs a group, scaled down
        ws = SantaWorkspace.for_inputs(q, kv, 28, TILE, num_splits=splits)
        out, info = santa_flash(q, kv, 28, tile=TILE, seed=5, workspace=ws, return_counts=True)
        draws.append((info.row_counts(), out))
    assert torch.equal(draws[0][0], draws[1][0])
    torch.testing.assert_close(draws[0][1], draws[1][1], rtol=1e-5, atol=1e-5)


def test_input_errors():
    q, kv = make_cache()
    with pytest.raises(InputError):
        santa_flash(q[0], kv, 8, tile=TILE)  # q not [B, Hq, d]
    with pytest.raises(InputError):
        santa_flash(q[:, :3], kv, 8, tile=TILE)  # Hq not a multiple of Hkv
    with pytest.raises(InputError):
        santa_flash(q, kv.k, 8, tile=TILE)  # not a KVCache
    for bad_s in (0, -3):
        with pytest.raises(InputError):
            santa_flash(q, kv, bad_s, tile=TILE)
    with pytest.raises(InputError, match="uniforms"):
        santa_flash(q, kv, 8, tile=TILE, uniforms=torch.rand(2, 4, 3))
    ws = SantaWorkspace.for_inputs(q, kv, 8, TILE)
    with pytest.raises(InputError, match="workspace"):
        santa_flash(q, kv, 16, tile=TILE, workspace=ws)  # sized for S <= 8


def test_default_launch_by_groups_and_tile():
    assert flash_config(128) == FLASH_CONFIG[128]
    assert flash_config(128, groups=64) != flash_config(128, groups=8)  # measured apart
    assert flash_config(128, groups=64, pairs=True) == FLASH_CONFIG[128]  # pairs: 4 warps
    assert flash_config(128, groups=8, tile=128)[1] == 2  # 2 stages for wide tiles
    assert flash_config(112) == FLASH_CONFIG[128]  # the nearest swept head dim
