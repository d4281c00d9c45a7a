"""S²ANTA-flash on prop's score pass (``triton_santa_flash_stash``) vs the fused kernel.

Run on the CPU through Triton's interpreter (ALGORITHMS.md section 9): with an fp32
stash, given the same uniforms (or seed and step), the tile draws from the stash are
exactly the masked fused kernel's counts, for every block size and split count and for
rows that draw more samples than a block holds; with the default fp16 stash the kernel
is unbiased over many Philox streams with the reference's MSE.
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
    replicated_cache,
    )

from santa_kernels import InputError, KVCache
from santa_kernels.triton_santa import SantaWorkspace, santa_flash
from santa_kernels.triton_santa_flash_stash import (
    draw_block,
    santa_flash_stash,
    stash_workspace,
)


def exact_stash(q, kv, S, **kw):
    return santa_flash_stash(q, kv, S, stash_dtype=torch.float32, **kw)


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
    check_flash_draw(exact_stash, q, kv, S=24)


def test_blocks_splits_and_large_budgets():
    """Blocks of one tile to all of them, one program a group or one a block, S >= N
    (several samples a row, in steps of P), 16-bit inputs."""
    q, kv = make_cache(batch=2, hq=4, hkv=2, n=100, lengths=(100, 7))
    for rows in (2, 8, 64):
        for per_sm in (1, 64):
            check_flash_draw(exact_stash, q, kv, 16, rows=rows, programs_per_sm=per_sm)
    check_flash_draw(exact_stash, q, kv, 200, rows=4)  # 100 a tile of the short sequence
    q, kv = make_cache(dtype=torch.bfloat16)
    check_flash_draw(exact_stash, q, kv, 16, out_tol=2e-2)
    q, kv = make_cache(batch=2, hq=2, hkv=1, d=64, n=20, lengths=(20, 1), dtype=torch.float16)
    check_flash_draw(exact_stash, q, kv, 4096, out_tol=2e-2)


def test_draw_block_shapes():
    assert draw_block(4, 4) == (32, 4)  # 32k, S=2048: 128 gathered rows a block
    assert draw_block(4, 1) == (64, 1)
    assert draw_block(4, 1000) == (4, 32)  # P capped, the rest in steps
    assert draw_block(2, 1, rows=2) == (16, 1)  # the dot's 16 rows at least
    with pytest.raises(InputError, match="rows"):
        draw_block(4, 1, rows=3)


def test_single_token_and_one_hot():
    q, kv = make_cache(batch=1, n=1, lengths=(1,))
    out, _ = santa_flash_stash(q, kv, 4, tile=TILE, seed=0)
    torch.testing.assert_close(out[0], kv.v[0, 0].repeat_interleave(2, dim=0), rtol=0, atol=1e-6)
    q, kv = make_cache(batch=1, hq=2, hkv=1, n=40, lengths=(40,))
    q = torch.zeros_like(q)
    q[..., 0] = 100.0
    k = kv.k.clone()
    k[..., 0] = 0.0
    k[0, 27, 0, 0] = 10.0  # score 125 against 0: row 27 carries its tile (and the output)
    kv = KVCache.contiguous(k, kv.v)
    out, _ = santa_flash_stash(q, kv, 8, tile=TILE, seed=3)
    torch.testing.assert_close(out, kv.v[0, 27, 0].expand_as(out), rtol=0, atol=1e-6)


def test_same_philox_stream_as_fused_and_step_advances_once():
    q, kv = make_cache(hq=6, hkv=2, n=75, lengths=(75, 41))
    ws_fused = SantaWorkspace.for_inputs(q, kv, 16, TILE, store_counts=True)
    ws = stash_workspace(q, kv, 16, TILE, stash_dtype=torch.float32)
    draws = []
    for call in range(2):
        fused = santa_flash(q, kv, 16, tile=TILE, seed=5, workspace=ws_fused,
                            return_counts=True)[1].row_counts().clone()
        out, info = santa_flash_stash(q, kv, 16, tile=TILE, seed=5, workspace=ws,
                                      return_counts=True)
        assert torch.equal(info.row_counts(), fused)
        assert int(ws.rng[0]) == call + 1  # one step per call
        assert int(ws.sample_ticket.abs().sum()) == 0  # the tickets reset for the next call
        draws.append((out.clone(), fused))
    assert not torch.equal(draws[0][1], draws[1][1])  # the step changed the stream
    ws.reset_rng(0)  # replays the first call exactly
    out, info = santa_flash_stash(q, kv, 16, tile=TILE, seed=5, workspace=ws,
                                  return_counts=True)
    assert torch.equal(info.row_counts(), draws[0][1])
    torch.testing.assert_close(out, draws[0][0], rtol=0, atol=0)
    group = exact_stash(q, kv, 16, tile=TILE, seed=3, return_counts=True,
                        group_offsets=True)[1].row_counts()
    fused_group = santa_flash(q, kv, 16, tile=TILE, seed=3, return_counts=True,
                              group_offsets=True)[1].row_counts()
    assert torch.equal(group, fused_group)


@pytest.mark.parametrize("stash", [torch.float16, torch.float32])
def test_unbiased_and_reference_mse(stash):
    workspaces = {}

    def draw(q, kv, S):
        if "ws" not in workspaces:
            workspaces["ws"] = SantaWorkspace.for_inputs(q, kv, S, TILE, num_splits=2,
                                                         stash_dtype=stash)
        return santa_flash_stash(q, kv, S, tile=TILE, workspace=workspaces["ws"], seed=11)[0]

    check_flash_unbiased(draw)


def test_fp16_stash_draws_close_to_exact_counts():
    """The fp16 stash rounds local logits by <= 2^-11 relative: the same uniforms move
    few samples (a sample moves only where a threshold falls within the rounding)."""
    q, kv = replicated_cache(kind="gaussian")
    uniforms = torch.rand(q.shape[0], q.shape[1], -(-kv.k.shape[1] // TILE),
                          generator=torch.Generator().manual_seed(2))
    exact = exact_stash(q, kv, 16, tile=TILE, uniforms=uniforms, return_counts=True)[1]
    half = santa_flash_stash(q, kv, 16, tile=TILE, uniforms=uniforms, return_counts=True)[1]
    moved = (exact.row_counts() - half.row_counts()).abs().sum() / 2
    assert float(moved) <= 0.01 * float(exact.row_counts().sum())


def test_input_errors():
    q, kv = make_cache()
    with pytest.raises(InputError):
        santa_flash_stash(q[0], kv, 8, tile=TILE)  # q not [B, Hq, d]
    with pytest.raises(InputError):
        santa_flash_stash(q[:, :3], kv, 8, tile=TILE)  # Hq not a multiple of Hkv
    with pytest.raises(InputError):
        santa_flash_stash(q, kv.k, 8, tile=TILE)  # not a KVCache
    for bad_s in (0, -3):
        with pytest.raises(InputError):
            santa_flash_stash(q, kv, bad_s, tile=TILE)
    with pytest.raises(InputError, match="uniforms"):
        santa_flash_stash(q, kv, 8, tile=TILE, uniforms=torch.rand(2, 4, 3))
    with pytest.raises(InputError, match="rows"):
        santa_flash_stash(q, kv, 8, tile=TILE, rows=6)
    with pytest.raises(InputError, match="programs_per_sm"):
        santa_flash_stash(q, kv, 8, tile=TILE, programs_per_sm=0)
    with pytest.raises(InputError, match="config"):
        santa_flash_stash(q, kv, 8, tile=TILE, config=(4,))
