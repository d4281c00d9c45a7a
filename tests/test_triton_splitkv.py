"""triton-splitkv against the float64 dense reference (runs under TRITON_INTERPRET=1 on CPU)."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported anywhere

import pytest
import torch

from santa_kernels import InputError, KVCache, dense_attention

splitkv = pytest.importorskip("santa_kernels.triton_splitkv")
_OK, _WHY = splitkv.splitkv_available()
if not _OK:
    pytest.skip(f"triton-splitkv unavailable: {_WHY}", allow_module_level=True)

DEVICE = "cuda" if _WHY == "cuda" else "cpu"
TOL = {torch.float32: 1e-4, torch.float16: 3e-3, torch.bfloat16: 1e-2}


def _make(batch, hkv, group, n, d, dtype, lengths=None, seed=0, q_scale=1.0):
    gen = torch.Generator().manual_seed(seed)
    q = (torch.randn(batch, hkv * group, d, generator=gen) * q_scale).to(dtype)
    k = torch.randn(batch, n, hkv, d, generator=gen).to(dtype)
    v = torch.randn(batch, n, hkv, d, generator=gen).to(dtype)
    lens = None if lengths is None else torch.tensor(lengths)
    kv = KVCache.contiguous(k.to(DEVICE), v.to(DEVICE), None if lens is None else lens.to(DEVICE))
    return q.to(DEVICE), kv


def _check(q, kv, out_dtype=None, **kw):
    """Runs the kernel into a NaN-poisoned output and returns its relative L2 error."""
    out = torch.full(q.shape, float("nan"), dtype=out_dtype or q.dtype, device=q.device)
    res = splitkv.splitkv_decode(q, kv, out=out, **kw)
    assert res is out
    assert torch.isfinite(out).all(), "some output element was not written"
    ref = dense_attention(q.cpu(), _cpu(kv), compute_dtype=torch.float64, scale=kw.get("scale"))
    ref = ref.out
    return float((out.cpu().double() - ref).norm() / ref.norm())


def _cpu(kv):
    if kv.device.type == "cpu":
        return kv
    if kv.layout == "paged":
        return KVCache.paged(kv.k.cpu(), kv.v.cpu(), kv.page_table.cpu(), kv.lengths.cpu())
    return KVCache.contiguous(kv.k.cpu(), kv.v.cpu(), kv.lengths.cpu())


# (batch, hkv, group, n, d, dtype, lengths, page_size, num_splits); page_size 0 = contiguous.
# Default BLOCK_N: 128 for d=64, 64 for d=128 (halved for fp32), so every n/length below
# leaves a partial last tile.
CASES = [
    (2, 2, 4, 150, 128, torch.bfloat16, [150, 77], 0, 1),
    (2, 2, 4, 150, 128, torch.bfloat16, [150, 77], 0, 3),
    (2, 2, 4, 150, 128, torch.bfloat16, [150, 77], 16, 2),
    (2, 2, 4, 150, 128, torch.bfloat16, [150, 77], 4, 4),
    (2, 1, 7, 200, 64, torch.float16, [200, 131], 0, 2),
    (2, 1, 7, 200, 64, torch.float16, [200, 131], 16, 1),
    (1, 3, 1, 90, 128, torch.float32, None, 0, 2),
    (1, 3, 1, 90, 128, torch.float32, None, 16, 3),
    (3, 2, 3, 100, 64, torch.bfloat16, [100, 1, 37], 4, 2),
    (1, 1, 20, 70, 64, torch.float16, None, 0, 2),  # group > 16: BLOCK_H = 32
    (1, 1, 2, 40, 256, torch.bfloat16, None, 16, 2),  # d=256: BLOCK_N 32
]


@pytest.mark.parametrize("index", range(len(CASES)))
def test_matches_dense_reference(index):
    batch, hkv, group, n, d, dtype, lengths, page_size, num_splits = CASES[index]
    q, kv = _make(batch, hkv, group, n, d, dtype, lengths, seed=100 + index)
    if page_size:
        kv = kv.to_paged(page_size, torch.Generator().manual_seed(7))
    assert _check(q, kv, num_splits=num_splits) < TOL[dtype]


def test_more_splits_than_tiles_and_peaked_scores():
    # 2 tiles of 64 but 9 splits: most splits are empty and must merge with weight 0.
    q, kv = _make(2, 2, 4, 100, 128, torch.float16, [100, 5], seed=3, q_scale=4.0)
    assert _check(q, kv, num_splits=9) < TOL[torch.float16]
    assert _check(q, kv, num_splits=40) < TOL[torch.float16]  # > STAGE2_BLOCK_S: merge loop


def test_single_token():
    q, kv = _make(2, 2, 3, 1, 64, torch.bfloat16, seed=4)
    for splits in (1, 3):
        assert _check(q, kv, num_splits=splits) < TOL[torch.bfloat16]
    paged = kv.to_paged(16, torch.Generator().manual_seed(1))
    assert _check(q, paged, num_splits=2) < TOL[torch.bfloat16]


def test_page_aligned_tiles_use_one_lookup_per_tile():
    # block_n 16 with pages of 16 and 32 takes the one-lookup-per-tile path; 4 the per-row one.
    q, kv = _make(2, 2, 4, 120, 64, torch.float16, [120, 50], seed=5)
    cfg = splitkv.SplitKVConfig(block_n=16, num_warps=4, num_stages=2, paged_num_stages=2)
    for page_size in (16, 32, 4):
        paged = kv.to_paged(page_size, torch.Generator().manual_seed(page_size))
        assert _check(q, paged, num_splits=3, config=cfg) < TOL[torch.float16]


def test_scale_out_dtype_and_default_splits():
    q, kv = _make(1, 2, 4, 700, 64, torch.bfloat16, seed=6)
    # default heuristic: capped by MIN_TILES_PER_SPLIT at 6 tiles -> 3 splits
    assert splitkv._plan_for(q, kv, None, None).splits == 3
    assert _check(q, kv, scale=0.3) < TOL[torch.bfloat16]
    assert _check(q, kv, out_dtype=torch.float32) < 5e-3  # no output rounding


def test_workspace_reuse_allocates_nothing():
    q, kv = _make(2, 2, 4, 150, 128, torch.bfloat16, [150, 60], seed=8)
    ws = splitkv.SplitKVWorkspace.for_inputs(q, kv, num_splits=4)
    buffers = (ws.partial_out.data_ptr(), ws.partial_m.data_ptr(), ws.partial_l.data_ptr())
    assert _check(q, kv, num_splits=4, workspace=ws) < TOL[torch.bfloat16]
    # fewer splits and fresh inputs reuse the same (now stale) buffers
    q2, kv2 = _make(2, 2, 4, 150, 128, torch.bfloat16, [33, 150], seed=9)
    assert _check(q2, kv2, num_splits=3, workspace=ws) < TOL[torch.bfloat16]
    assert buffers == (ws.partial_out.data_ptr(), ws.partial_m.data_ptr(), ws.partial_l.data_ptr())
    with pytest.raises(InputError, match="workspace"):
        splitkv.splitkv_decode(q, kv, num_splits=5, workspace=ws)


def test_choose_num_splits():
    choose = splitkv.choose_num_splits
    # Llama-3.1-8B at 32k on an H200 (132 SMs), BLOCK_N 64: about 2 programs per SM
    # (a little under when evening the tiles out fills the last wave better).
    s1 = choose(1 * 8, 32768, 64, 132)
    s8 = choose(8 * 8, 32768, 64, 132)
    assert 0.9 * 264 <= 8 * s1 <= 2 * 264 and s1 <= splitkv.MAX_SPLITS
    assert 0.9 * 264 <= 64 * s8 <= 2 * 264 and s8 < s1
    assert choose(64 * 8, 32768, 64, 132) == 1  # batch alone fills the GPU
    assert choose(8, 100, 64, 132) == 1  # two tiles: not worth splitting
    assert choose(8, 640, 64, 132) == 5  # capped at MIN_TILES_PER_SPLIT tiles a split


def test_byte_model():
    q, kv = _make(2, 2, 4, 100, 64, torch.bfloat16, [100, 30], seed=11)
    kv_bytes = 130 * 2 * 64 * 2 * 2  # valid rows x Hkv x d x (K and V) x 2 bytes
    q_out = 2 * (2 * 8 * 64 * 2)
    assert splitkv.splitkv_bytes(q, kv, 1) == kv_bytes + q_out
    assert splitkv.splitkv_bytes(q, kv, 3) == kv_bytes + q_out + 2 * 2 * 8 * 3 * 66 * 4


def test_input_errors():
    q, kv = _make(1, 2, 2, 20, 64, torch.float16, seed=10)
    with pytest.raises(InputError, match=r"^q"):
        splitkv.splitkv_decode(q[:, :3], kv)
    with pytest.raises(InputError, match=r"^q"):
        splitkv.splitkv_decode(q.double(), kv)
    with pytest.raises(InputError, match=r"^out"):
        splitkv.splitkv_decode(q, kv, out=torch.empty(1, 4, 32, device=q.device))
    with pytest.raises(InputError, match=r"^num_splits"):
        splitkv.splitkv_decode(q, kv, num_splits=0)
    q48, kv48 = _make(1, 1, 1, 4, 48, torch.float16)
    with pytest.raises(InputError, match="head dim"):
        splitkv.splitkv_decode(q48, kv48)
