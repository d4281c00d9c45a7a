"""triton-topk's select on inputs like a model's (Gaussian, peaked, tied, near-equal
scores), seed by seed, against a stable torch sort: the same tokens (ties in token order),
threshold and last tie, with either select (runs under TRITON_INTERPRET=1 on CPU)."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported anywhere

import pytest
import torch

import santa_kernels as sk

ti = pytest.importorskip("santa_kernels.triton_indexed")
tk = pytest.importorskip("santa_kernels.triton_topk")
_OK, _WHY = ti.indexed_available()
if not _OK:
    pytest.skip(f"triton-indexed unavailable: {_WHY}", allow_module_level=True)

DEVICE = "cuda" if _WHY == "cuda" else "cpu"
HKV, GROUP, D = 2, 2, 16


def _problem(kind: str, seed: int, n: int, lengths: tuple[int, int]):
    """Queries and a cache whose scores are ``kind``: ``gauss`` (spread), ``peaked`` (a
    few tokens far above the rest, whose probabilities underflow to ties at 0), ``tied``
    (keys from a pool of 6 rows) or ``narrow`` (keys equal but for tiny noise: every
    token in the k-th key's bucket)."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(2, HKV * GROUP, D, generator=gen)
    k = torch.randn(2, n, HKV, D, generator=gen)
    if kind == "peaked":
        q = q * 3.0
        for b in range(2):
            hot = torch.randperm(n, generator=gen)[:5]
            k[b, hot] = q[b].view(HKV, GROUP, D).sum(1) * torch.rand(5, 1, 1, generator=gen) * 4
    elif kind == "tied":
        pool = torch.randint(-1, 2, (6, D), generator=gen).float()
        k = pool[torch.randint(0, 6, (2, n, HKV), generator=gen)]
    elif kind == "narrow":
        k = k[:, :1].expand(2, n, HKV, D) + 1e-4 * torch.randn(2, n, HKV, D, generator=gen)
    v = torch.randn(2, n, HKV, D, generator=gen)
    kv = sk.KVCache.contiguous(k.to(DEVICE), v.to(DEVICE), torch.tensor(lengths, device=DEVICE))
    return q.to(DEVICE), kv


def _order_keys(x: torch.Tensor) -> torch.Tensor:
    """``_order_key`` in torch: int64 keys in the order of the fp32 values ``x``."""
    u = x.contiguous().view(torch.int32).long() & 0xFFFFFFFF
    return torch.where(u >> 31 == 1, u ^ 0xFFFFFFFF, u | 0x80000000)


def _check_row(chosen, values, allowed, k, thr_key, thr_tok):
    """``chosen [k]`` is the first ``min(k, allowed)`` tokens of a stable sort of
    ``values`` over ``allowed`` (descending: ties in token order), ``-1`` after; every
    allowed token is chosen exactly when ``key > T`` or ``key = T`` up to the last tie."""
    keys = _order_keys(values)
    order = torch.sort(keys.masked_fill(~allowed, -1), descending=True, stable=True).indices
    want = order[:min(k, int(allowed.sum()))]
    got = chosen[chosen >= 0].long()
    assert (chosen[len(got):] == -1).all()
    assert torch.equal(got.sort().values, want.sort().values)
    if int(allowed.sum()) < k:
        return  # every allowed token: no k-th key
    thr = int(thr_key) & 0xFFFFFFFF
    assert thr == int(keys[want[-1]])
    assert int(thr_tok) == int(want[keys[want] == thr].max())
    tok = torch.arange(len(values))
    mark = allowed & ((keys > thr) | ((keys == thr) & (tok <= int(thr_tok))))
    assert torch.equal(mark.nonzero().flatten(), want.sort().values)


def _run(q, kv, k, per_head, sink, window, spread=tk.SPREAD_SELECT):
    top = tk.TopKSelect(q, kv, k, per_head=per_head, scale=D ** -0.5, spread=spread)
    out = torch.full((2, HKV, k * (GROUP if per_head else 1)), 7, dtype=torch.int32,
                     device=DEVICE)
    top.run_scores(q, kv)
    top.run_select(kv, out, sink, window)
    assert top.splits > 1
    return top, out.cpu()


CASES = [  # (kind, n, lengths, k, sink, window)
    ("gauss", 1024, (1024, 700), 100, 0, 0),
    ("gauss", 768, (768, 40), 64, 0, 0),  # fewer allowed than k in one sequence
    ("peaked", 1024, (1024, 513), 64, 0, 0),  # k past the few large masses: ties at 0
    ("peaked", 640, (640, 300), 3, 16, 32),
    ("tied", 1024, (1024, 900), 150, 0, 0),
    ("tied", 512, (512, 120), 90, 8, 24),  # 88 allowed in the second sequence
    ("narrow", 768, (768, 600), 200, 4, 4),
]


@pytest.mark.parametrize("spread", [True, False])
@pytest.mark.parametrize("per_head", [False, True])
@pytest.mark.parametrize(("kind", "n", "lengths", "k", "sink", "window"), CASES)
def test_select_is_a_stable_sort_of_the_values(spread, per_head, kind, n, lengths, k,
                                               sink, window):
    for seed in range(3):
        q, kv = _problem(kind, seed, n, lengths)
        top, out = _run(q, kv, k, per_head, sink, window, spread)
        values = (top.scores if per_head else top.mass).cpu()
        for b in range(2):
            length = lengths[b]
            lo = min(length, sink)
            tok = torch.arange(n)
            allowed = (tok >= lo) & (tok < max(length - window, lo))
            for sel in range(values.shape[1]):
                row = b * values.shape[1] + sel
                g, j = divmod(sel, GROUP) if per_head else (sel, 0)
                _check_row(out[b, g, j * k:(j + 1) * k], values[b, sel], allowed, k,
                           top.thr_key[row], top.thr_tok[row])
        assert int(top.hist.abs().sum()) == 0 and int(top.arrivals.abs().sum()) == 0


