"""vAttention's uniform tail under the indexed attend's launch options: the rows a step
(``chunk``) and the split count change how the draws are gathered, never which tokens
are drawn or what they estimate (runs under TRITON_INTERPRET=1 on CPU)."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported anywhere

import math

import pytest
import torch

import santa_kernels as sk
from conftest import decode_problem
from santa_kernels import selection as sel
from santa_kernels.scores import exact_scores

ti = pytest.importorskip("santa_kernels.triton_indexed")
ts = pytest.importorskip("santa_kernels.triton_selection")
_OK, _WHY = ti.indexed_available()
if not _OK:
    pytest.skip(f"triton-indexed unavailable: {_WHY}", allow_module_level=True)

DEVICE = "cuda" if _WHY == "cuda" else "cpu"
STRIDE = 256  # draws kept apart per (sequence, KV head)


def _problem(batch=2, hkv=2, group=3, n=150, lengths=(150, 77), q_scale=1.0, seed=0):
    q, kv = decode_problem(batch=batch, heads=hkv * group, kv_heads=hkv, n=n, d=16,
                           q_scale=q_scale, seed=seed, lengths=list(lengths),
                           dtype=torch.float32)
    return q.to(DEVICE), sk.KVCache.contiguous(kv.k.to(DEVICE), kv.v.to(DEVICE),
                                               kv.lengths.to(DEVICE))


def _tail(count, lo, hi, exclude=None, seed=3):
    """A tail of ``count [B, Hkv]`` draws over ``[lo, hi)`` weighted ``n_s / count``."""
    count = torch.tensor(count, dtype=torch.int32)
    lo, hi = torch.tensor(lo, dtype=torch.int32), torch.tensor(hi, dtype=torch.int32)
    log_w = torch.log((hi - lo).clamp_min(1)[:, None].float() / count.clamp_min(1).float())
    rng = torch.zeros(1, dtype=torch.int64, device=DEVICE)
    return ti.UniformTail(count.to(DEVICE), lo.to(DEVICE), hi.to(DEVICE), log_w.to(DEVICE),
                          None if exclude is None else exclude.to(DEVICE), rng, seed=seed,
                          stride=STRIDE)


def _drawn(q, kv, tail, idx=None, **launch):
    """``(out, samples [B·Hkv, STRIDE])`` of one call."""
    samples = torch.full((tail.count.numel(), STRIDE), -1, dtype=torch.int32, device=DEVICE)
    out = ti.indexed_attention(q, kv, idx, tail=tail, samples=samples, **launch)
    return out.cpu(), samples.cpu()


# 5 draws over 13 splits: most splits empty; 150 >= the range: each token once; 0: none
COUNTS = [[5, 37], [150, 0]]
LAUNCHES = [dict(chunk=16, num_splits=1), dict(chunk=16, num_splits=13),
            dict(chunk=32, num_splits=3), dict(chunk=128, num_splits=2),
            dict(chunk=256, num_splits=5)]


@pytest.mark.parametrize("launch", LAUNCHES, ids=lambda x: f"{x['chunk']}x{x['num_splits']}")
def test_the_draws_and_the_output_do_not_depend_on_the_rows_a_step_or_the_splits(launch):
    """The same tokens drawn as by the default launch (keyed by draw, not by tile or
    split), the whole range read once where the count reaches it, exclusions and short
    rows alike; the output the reference's over the listed and drawn rows."""
    q, kv = _problem()
    exclude = torch.zeros(2, 2, 150, dtype=torch.uint8)
    exclude[:, :, 10:40] = 1
    tail = _tail(COUNTS, [4, 4], [140, 70], exclude)
    idx = torch.tensor([[[0, 1, 2], [149, -1, 3]], [[76, 75, -1], [0, 1, 2]]],
                       dtype=torch.int32, device=DEVICE)
    base_out, base = _drawn(q, kv, tail, idx)
    out, samples = _drawn(q, kv, tail, idx, **launch)
    assert torch.equal(samples, base)
    drawn = samples.view(2, 2, STRIDE).long()
    assert ((drawn >= 0).sum(-1) == torch.tensor([[5, 37], [66, 0]])).all()
    assert drawn[1, 0, :66].tolist() == list(range(4, 70))
    assert torch.allclose(out, base_out, atol=1e-5)
    lw = tail.log_weight.cpu()[..., None].expand(2, 2, STRIDE).clone()
    lw[exclude.long().gather(2, drawn.clamp_min(0)) > 0] = float("-inf")
    tokens = torch.cat([idx.cpu().long(), drawn], -1)
    weights = torch.cat([torch.zeros(2, 2, 3), lw], -1)
    ref = sel.indexed_reference(q.cpu(), sk.KVCache.contiguous(kv.k.cpu(), kv.v.cpu(),
                                                               kv.lengths.cpu()),
                                tokens, weights)
    assert float((out.double() - ref).norm() / ref.norm()) < 1e-4


def test_a_chunk_outside_the_tile_sizes_is_refused():
    q, kv = _problem()
    tail = _tail(COUNTS, [4, 4], [140, 70])
    for chunk in (8, 48, 512, True):
        with pytest.raises(sk.InputError, match=r"^chunk: expected one of 16, 32, 64, 128, "):
            ti.indexed_attention(q, kv, tail=tail, chunk=chunk)


def test_the_tail_sums_are_unbiased_for_any_launch():
    """Hansen-Hurwitz: over 120 steps the tail's weighted sums ``Σ w e^s`` and
    ``Σ w e^s v`` (read from the split partials) average to the range's exact sums less
    the excluded tokens, within 5 standard errors, at two launches that draw alike."""
    q, kv = _problem(batch=1, hkv=1, group=2, lengths=(150,), q_scale=1.5)
    exclude = torch.zeros(1, 1, 150, dtype=torch.uint8)
    exclude[0, 0, [20, 21, 90]] = 1
    lo, hi, count = 10, 130, 30
    tail = _tail([[count]], [lo], [hi], exclude, seed=11)
    keys, values, valid = kv.padded(torch.float64)
    scores, _ = exact_scores(q.double().cpu(), keys.cpu(), valid.cpu(),
                             1.0 / math.sqrt(16), 2)  # [1, 2, 150]
    expo = scores.exp()[0]  # [2, N]
    keep = torch.zeros(150, dtype=torch.bool)
    keep[lo:hi] = True
    keep &= exclude[0, 0] == 0
    want_den = (expo * keep).sum(-1)  # [2]
    want_num = (expo * keep) @ values.cpu()[0, :, 0]  # [2, d]
    for chunk, splits in ((16, 4), (64, 3)):
        ws = ti.IndexedWorkspace(1, 2, 16, splits, device=DEVICE)
        tail.rng.zero_()
        dens, nums = [], []
        for _ in range(120):
            ti.indexed_attention(q, kv, tail=tail, workspace=ws, chunk=chunk)
            rows = 2 * splits
            m = ws.partial_m[:rows].cpu().double().view(2, splits)
            lsum = ws.partial_l[:rows].cpu().double().view(2, splits)
            acc = ws.partial_out[:rows * 16].cpu().double().view(2, splits, 16)
            scale = torch.where(torch.isfinite(m), torch.exp2(m), torch.zeros_like(m))
            dens.append((scale * lsum).sum(-1))
            nums.append((scale[..., None] * acc).sum(1))
            tail.rng.add_(1)
        den, num = torch.stack(dens), torch.stack(nums)
        se_den = den.std(0) / math.sqrt(len(dens))
        se_num = num.std(0) / math.sqrt(len(nums))
        assert ((den.mean(0) - want_den).abs() <= 5 * se_den).all()
        assert ((num.mean(0) - want_num).abs() <= 5 * se_num + 1e-9).all()


def test_vattention_steps_built_with_other_launches_draw_alike():
    """Steps whose attend takes other rows a step and programs an SM (so other splits)
    give the same output and read the same rows as a default step, step after step."""
    q, kv = _problem(batch=1, n=300, lengths=(300,), q_scale=1.5)
    params = dict(sink=4, window=4, topk=8, epsilon=0.3, delta=0.3, base_rate=0.05, seed=7)
    plain = ts.VAttentionStep(q, kv, **params)
    other = ts.VAttentionStep(q, kv, **params, attend_chunk=16, attend_programs_per_sm=40,
                              attend_max_registers=None, attend_stages=2)
    assert other.chunk == 16 and plain.chunk == ti.CHUNK[16]
    assert other.max_registers is None
    assert plain.max_registers == ts.VATTENTION_MAX_REGISTERS
    assert other.workspace.num_splits != plain.workspace.num_splits
    for _ in range(2):
        assert torch.allclose(other(q, kv).cpu(), plain(q, kv).cpu(), atol=1e-5)
    assert torch.equal(other.read_counts(q, kv).v_rows, plain.read_counts(q, kv).v_rows)


def test_vattention_splits_its_attend_for_the_whole_range():
    """The attend's splits are chosen for the exact rows and the largest tail (the whole
    sampled range), at VATTENTION_PROGRAMS_PER_SM programs an SM by default."""
    q, kv = _problem(batch=1, hkv=1, group=2, n=4096, lengths=(4096,))
    step = ts.VAttentionStep(q, kv, sink=16, window=16, topk=32)
    rows = 16 + 16 + 32 + (4096 - 32)
    assert step.attend_programs_per_sm == ts.VATTENTION_PROGRAMS_PER_SM
    assert step.workspace.num_splits == ti.choose_splits(q, kv, rows,
                                                         ts.VATTENTION_PROGRAMS_PER_SM)
    # the exact rows and an eighth of the capacity left 4 splits on 132 SMs
    assert step.workspace.num_splits > ti.choose_splits(q, kv, 64 + 4096 // 8)
    with pytest.raises(sk.InputError, match=r"^chunk: "):
        ts.VAttentionStep(q, kv, attend_chunk=24)


def test_vattention_steps_launch_their_attend_with_their_registers_and_stages(monkeypatch):
    """attend_max_registers and attend_stages reach the row programs' launch as maxnreg
    and num_stages (the defaults' constants, other values, or none), for the call and for
    read_counts alike."""
    q, kv = _problem(batch=1, n=200, lengths=(200,))
    launches = []
    kernel_type = type(ti._indexed_stage1)
    launch = kernel_type.__getitem__

    def getitem(self, grid):
        run = launch(self, grid)

        def record(*args, **kwargs):
            if self is ti._indexed_stage1:
                launches.append((kwargs.get("maxnreg", "unset"),
                                 kwargs.get("num_stages", "unset")))
            return run(*args, **kwargs)

        return record

    monkeypatch.setattr(kernel_type, "__getitem__", getitem)
    params = dict(sink=4, window=4, topk=8, seed=2)
    defaults = (ts.VATTENTION_MAX_REGISTERS, ts.VATTENTION_STAGES)
    for cap, stages in (defaults, (96, 2), (None, None)):
        launches.clear()
        step = (ts.VAttentionStep(q, kv, **params) if (cap, stages) == defaults
                else ts.VAttentionStep(q, kv, **params, attend_max_registers=cap,
                                       attend_stages=stages))
        step(q, kv)
        step.read_counts(q, kv)
        assert launches == [(cap, stages)] * 2
    for name in ("attend_max_registers", "attend_stages"):
        for bad in (0, -4, 1.5):
            with pytest.raises(sk.InputError, match=rf"^{name}: "):
                ts.VAttentionStep(q, kv, **params, **{name: bad})
    rows = torch.zeros(1, 2, 4, dtype=torch.int32, device=DEVICE)
    for name in ("max_registers", "stages"):
        with pytest.raises(sk.InputError, match=rf"^{name}: "):
            ti.indexed_attention(q, kv, rows, **{name: 0})


def test_the_exclusions_read_a_word_or_a_byte_at_a_time_alike():
    """An exclude map of whole aligned 4-byte words (the kernel reads its marks a word at
    a time), a row-padded view of one and a map starting off a word (a byte at a time):
    the same draws counted and the same output, marks at every byte of a word."""
    q, kv = _problem()
    marks = torch.zeros(2, 2, 152, dtype=torch.uint8)
    marks[0, 1, 20:24] = 1  # a whole word
    marks[0, 1, [41, 66, 67]] = 1
    marks[1, 0, [5, 6, 60]] = 1
    padded = torch.zeros(2, 2, 153, dtype=torch.uint8)
    padded[..., :152] = marks
    shifted = torch.zeros(2 * 2 * 152 + 1, dtype=torch.uint8)[1:].view(2, 2, 152)
    shifted.copy_(marks)
    idx = torch.tensor([[[0, 1, 2], [149, -1, 3]], [[76, 75, -1], [0, 1, 2]]],
                       dtype=torch.int32, device=DEVICE)
    runs = []
    for exclude in (marks, padded[..., :152], shifted):
        assert ti._word_readable(exclude.to(DEVICE)) == (exclude is marks)
        tail = _tail([[40, 90], [150, 3]], [4, 4], [140, 70], exclude.to(DEVICE), seed=5)
        runs.append(_drawn(q, kv, tail, idx, chunk=32, num_splits=3))
    for out, samples in runs[1:]:
        assert torch.equal(samples, runs[0][1])
        assert torch.allclose(out, runs[0][0], atol=1e-6)
    drawn = runs[0][1].view(2, 2, STRIDE).long()
    lw = _tail([[40, 90], [150, 3]], [4, 4], [140, 70]).log_weight.cpu()
    lw = lw[..., None].expand(2, 2, STRIDE).clone()
    hit = marks.long().gather(2, drawn.clamp_min(0)) > 0
    assert int(hit[0, 1].sum()) > 0 and int(hit[1, 0].sum()) > 0
    lw[hit] = float("-inf")
    tokens = torch.cat([idx.cpu().long(), drawn], -1)
    weights = torch.cat([torch.zeros(2, 2, 3), lw], -1)
    ref = sel.indexed_reference(q.cpu(), sk.KVCache.contiguous(kv.k.cpu(), kv.v.cpu(),
                                                               kv.lengths.cpu()),
                                tokens, weights)
    assert float((runs[0][0].double() - ref).norm() / ref.norm()) < 1e-4
