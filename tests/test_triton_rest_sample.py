"""triton_rest_sample: the rest's systematic samples where the top set takes every token,
and the step's estimate against dense attention where it takes most of a split (runs under
TRITON_INTERPRET=1 on CPU; the same tests run the compiled kernels on a GPU)."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported anywhere

import pytest
import torch

import santa_kernels as sk
from santa_kernels import selection as sel

ti = pytest.importorskip("santa_kernels.triton_indexed")
ts = pytest.importorskip("santa_kernels.triton_selection")
_OK, _WHY = ti.indexed_available()
if not _OK:
    pytest.skip(f"triton-indexed unavailable: {_WHY}", allow_module_level=True)

DEVICE = "cuda" if _WHY == "cuda" else "cpu"


def _problem(n=700, lengths=(700, 260), seed=0, group=2, hkv=2, d=16):
    """Gaussian queries and keys of two sequences (the second one shorter)."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(2, hkv * group, d, generator=gen) * 2.0
    k = torch.randn(2, n, hkv, d, generator=gen)
    v = torch.randn(2, n, hkv, d, generator=gen)
    kv = sk.KVCache.contiguous(k.to(DEVICE), v.to(DEVICE), torch.tensor(lengths, device=DEVICE))
    return q.to(DEVICE), kv


def _plans(q, kv, calls=3, **options):
    """``calls`` plans of one step (each a fresh draw): rows, log-weights, rest masses
    and the step counter each drew with."""
    step = ts.TopKSantaStep(q, kv, seed=7, **options)
    assert step.top.splits > 1
    out = []
    for _ in range(calls):
        rows = step.plan(q, kv).cpu().clone()
        out.append((rows, step.log_weights.cpu().clone(), step.sampler.rest.cpu().clone(),
                    step.rng.clone()))
    return step, out


def _whole_split_problem():
    """Sequences whose first split's tokens score well above the others (a top set of
    its size takes it whole), the rest keeping some mass."""
    q, kv = _problem(n=640, lengths=(640, 500), seed=3)
    span = ts.TopKSantaStep(q, kv, k=8, S=4).top.tiles_per_split * ti.SCORE_BLOCK_N[16]
    k = kv.k.clone()
    for g in range(kv.num_kv_heads):
        k[:, :span, g] = k[:, :span, g] * 0.1 + q[:, 2 * g:2 * g + 2].mean(1)[:, None] * 1.5
    return q, sk.KVCache.contiguous(k, kv.v, kv.lengths), span


def test_a_top_set_of_every_token_leaves_no_rest():
    q, kv = _problem(n=640, lengths=(640, 41))
    _, plans = _plans(q, kv, calls=1, k=640, S=4)
    rows, lw, rest, _ = plans[0]
    assert (rest == 0).all() and (rows[:, :, 640:] == -1).all()
    assert lw[:, :, 640:].isneginf().all()


def test_the_plans_are_unbiased_where_the_top_set_takes_most_of_a_split():
    """The mean of many draws' estimates (the rows and log-weights of each, attended in
    float64) against dense attention, within 5 standard errors."""
    q, kv, span = _whole_split_problem()
    cpu = sk.KVCache.contiguous(kv.k.cpu(), kv.v.cpu(), kv.lengths.cpu())
    dense = sk.dense_attention(q.cpu(), cpu, compute_dtype=torch.float64).out
    step = ts.TopKSantaStep(q, kv, k=span - 40, S=8, seed=1)
    step.plan(q, kv)  # the scores and the top set, then many draws of the rest
    draws, outs = 30, []
    for _ in range(draws):
        step.rng += 1
        step.sampler.run(kv, step.rows, step.log_weights, step.rng, 12345)
        outs.append(sel.indexed_reference(q.cpu(), cpu, step.rows.cpu(),
                                          step.log_weights.cpu()))
    outs = torch.stack(outs)
    mean, se = outs.mean(0), outs.std(0) / draws**0.5
    assert ((mean - dense).abs() <= 5 * se + 1e-6).all()
    assert not torch.equal(outs[0], outs[1])
