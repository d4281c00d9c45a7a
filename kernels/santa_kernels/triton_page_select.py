"""triton-page-select: the ``k`` largest entries of each row of an fp32 score matrix, in
one Triton kernel (Quest's page choice, docs/algorithms.md section 10).

One program owns a row. It finds the row's ``k``-th largest value by a radix select on
the scores' order-preserving integer keys (``triton_topk``'s), then writes, in ascending
position order, every position above that threshold and the first positions equal to
it, until ``k`` are taken; ``-inf`` is never taken. The rest of the row's ``k`` slots get
``-1`` and ``counts`` the number taken. ``SELECT`` names one of three selects, which
find the same threshold and so list the same pages:

- **byte-wise** (``"bytes"``, the default): a byte a pass from the top (4 passes),
  each one ``tl.histogram`` of the next byte of the keys under the bytes found, over the
  row in blocks of ``HIST_BLOCK`` (a row of up to ``HIST_BLOCK`` scores is one block:
  5 dependent steps in all, the write included);
- **four bits a pass** (8 passes, each counting, for the 16 values of the next digit,
  the keys at or above it, ``MAX_BLOCK`` scores a step: 8 x ⌈P / MAX_BLOCK⌉ dependent
  steps of 16 x ``MAX_BLOCK`` compares, then ⌈P / MAX_BLOCK⌉ to write: 8 x 4 + 4 = 36
  for 2048 pages; 72 in Quest's fused select, ``QUEST_SELECT_BLOCK`` = 256 scores a step,
  in ``triton_selection``);
- **spread** (``"spread"``, Quest's fused group select only: the per-head launch of
  :func:`row_topk` runs byte-wise with it): the bound kernel's programs, as they score
  their pages, each add them to the row's histogram of the keys' top 12 bits (4096
  bins, an atomic a live page: ``-inf`` is not counted); the row's last program loads
  it once and finds the bucket ``b1`` of the ``k``-th key and the count above it,
  compacts the keys of the row's pages in ``b1`` (the candidates) in one pass, ranks
  them by a ``[C, C]`` compare when they fit ``CAND_BLOCK`` (else three histograms of
  their other 20 bits: 8, 8, 4, ⌈C / ``HIST_BLOCK``⌉ steps each) for the exact threshold
  and its ties, then writes as the others do and zeroes the histogram: 1 + ⌈P / ``HIST_BLOCK``⌉
  + 1 + ⌈P / ``HIST_BLOCK``⌉ dependent steps, 4 for 2048 pages (6 with more candidates
  than ``CAND_BLOCK``).

- **resident** (``"resident"``): byte-wise as above, over the row loaded once and held in
  registers (``RESIDENT_KEYS`` a thread at most: 2048 scores in 4 warps; a wider row
  runs byte-wise): the four histograms read no memory (each bucket found by one scan and
  one sum), and the write takes its slots from one cumulative sum of the held keys: 1
  load, 4 histograms, 1 write.

A row holds any number of scores (re-read from L1/L2 each pass; held once by resident).
No host-device sync, static shapes: a decode step can capture it in a CUDA graph.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from santa_kernels.triton_topk import _bucket_of, _masked_histogram, _order_key
from santa_kernels.validate import InputError, check_positive_int

MAX_BLOCK = 512  # scores a program counts at a time (four bits a pass)
RADIX_BITS = tl.constexpr(4)  # key bits a pass resolves (8 passes)
RADIX = tl.constexpr(16)
HIST_BLOCK = 2048  # scores a histogram pass reads at a time (byte-wise: a row of pages)
HIST_BITS = tl.constexpr(8)  # key bits a histogram pass resolves (4 passes)
HIST_BINS = tl.constexpr(256)
# byte-wise, four bits a pass, spread (Quest's), byte-wise over the row held in registers
SELECTS = ("bytes", "nibbles", "spread", "resident")
# QuestStep's default select (its select= option): resident, whose step took 59.6 us in
# its own launch against 62.0 byte-wise (67.5 / 71.7 fused) at 32/8/128, 32k, B=8 on an
# H100 (results/h100/2026-12-07-h100-kernels-floor-32k-every-method-c373426)
SELECT = "resident"
# the scores a thread of the resident select holds at most (a wider row runs byte-wise):
# 2048 in Quest's 4-warp bound kernel (compiled for sm_90 at 4096 pages it took 210
# registers a thread against 133 at 2048, fewer bound programs an SM), 4096 in a row launch
RESIDENT_KEYS = 16
CAND_BLOCK = tl.constexpr(64)  # candidates the spread select ranks by [C, C] compares
KEY_BITS = 12  # the spread histogram's buckets: the order key's top bits (_bucket_key)
KEY_BUCKETS = tl.constexpr(1 << KEY_BITS)
NUM_WARPS = 8


@triton.jit
def _bucket_key(key):
    """The spread histogram's bucket of an order key: its top ``KEY_BITS`` (12) bits."""
    return (key >> 20).to(tl.int32)


@triton.jit
def _select_row(base, out_row, count_at, width, K: tl.constexpr, BLOCK: tl.constexpr,
                BLOCK_K: tl.constexpr, HOW: tl.constexpr):
    """The top ``K`` of the ``width`` scores at ``base`` into ``out_row`` (ascending, -1
    after them) and their number into ``count_at`` (see the module docstring): four bits a
    pass with ``HOW == "nibbles"``, the row held in registers with ``HOW == "resident"``
    (``BLOCK >= width``), else byte-wise."""
    if HOW == "resident":
        _select_resident(base, out_row, count_at, width, K, BLOCK, BLOCK_K)
    else:
        if HOW == "nibbles":
            prefix, greater = _threshold_by_nibbles(base, width, K, BLOCK)
        else:
            prefix, greater = _threshold_by_bytes(base, width, K, BLOCK)
        _write_taken(base, out_row, count_at, width, prefix, tl.minimum(width, K) - greater,
                     K, BLOCK, BLOCK_K)


@triton.jit
def _threshold_by_bytes(base, width, K: tl.constexpr, BLOCK: tl.constexpr):
    """The ``K``-th largest key of the row (of ``min(width, K)``) and the number of keys
    above it: a ``tl.histogram`` of the next byte a pass, over the keys under the bytes
    found."""
    offs = tl.arange(0, BLOCK)
    want = tl.minimum(width, K)
    prefix = tl.cast(0, tl.int64)
    greater = 0
    for shift in tl.static_range(32 - HIST_BITS, -HIST_BITS, -HIST_BITS):
        hist = tl.zeros([HIST_BINS], tl.int32)
        for p0 in range(0, width, BLOCK):
            inside = p0 + offs < width
            key = _order_key(tl.load(base + p0 + offs, mask=inside, other=float("-inf")))
            key = key.to(tl.int64)  # shifts by up to 32 bits below
            match = inside & ((key >> (shift + HIST_BITS)) == (prefix >> (shift + HIST_BITS)))
            digit = ((key >> shift) & (HIST_BINS - 1)).to(tl.int32)
            hist += _masked_histogram(digit, match, HIST_BINS)
        pick, above = _bucket_of(hist, want - greater, HIST_BINS)
        greater += above
        prefix = prefix | (pick.to(tl.int64) << shift)
    return prefix, greater


@triton.jit
def _threshold_by_nibbles(base, width, K: tl.constexpr, BLOCK: tl.constexpr):
    """As :func:`_threshold_by_bytes`, four bits a pass by ``[16, BLOCK]`` compares."""
    offs = tl.arange(0, BLOCK)
    digits = tl.arange(0, RADIX)
    want = tl.minimum(width, K)
    # the K-th largest key, RADIX_BITS bits a pass from the top: `prefix` holds the digits
    # found, `greater` counts the keys above the prefix in the bits found so far
    prefix = tl.cast(0, tl.int64)
    greater = 0
    for shift in tl.static_range(32 - RADIX_BITS, -RADIX_BITS, -RADIX_BITS):
        counts = tl.zeros([RADIX, BLOCK], tl.int32)
        for p0 in range(0, width, BLOCK):
            inside = p0 + offs < width
            key = _order_key(tl.load(base + p0 + offs, mask=inside, other=float("-inf")))
            key = key.to(tl.int64)  # shifts by up to 32 bits below
            match = inside & ((key >> (shift + RADIX_BITS)) == (prefix >> (shift + RADIX_BITS)))
            digit = ((key >> shift) & (RADIX - 1)).to(tl.int32)
            counts += (match[None, :] & (digit[None, :] >= digits[:, None])).to(tl.int32)
        at_least = greater + tl.sum(counts, axis=1)  # [RADIX]: keys >= (prefix, digit)
        pick = tl.max(tl.where(at_least >= want, digits, 0), axis=0)
        greater = tl.max(tl.where(digits == pick + 1, at_least, greater), axis=0)
        prefix = prefix | (pick.to(tl.int64) << shift)
    return prefix, greater


@triton.jit
def _write_taken(base, out_row, count_at, width, prefix, ties, K: tl.constexpr,
                 BLOCK: tl.constexpr, BLOCK_K: tl.constexpr):
    """Writes, ascending, the positions whose key is above ``prefix`` and the first
    ``ties`` equal to it (never ``-inf``), ``-1`` after them, and their number."""
    offs = tl.arange(0, BLOCK)
    taken = 0
    seen = 0
    for p0 in range(0, width, BLOCK):
        inside = p0 + offs < width
        s = tl.load(base + p0 + offs, mask=inside, other=float("-inf"))
        key = _order_key(s).to(tl.int64)
        live = inside & (s > float("-inf"))
        equal = live & (key == prefix)
        rank = seen + tl.cumsum(equal.to(tl.int32), axis=0) - 1
        take = live & ((key > prefix) | (equal & (rank < ties)))
        slot = taken + tl.cumsum(take.to(tl.int32), axis=0) - 1
        tl.store(out_row + slot, p0 + offs, mask=take)
        taken += tl.sum(take.to(tl.int32), axis=0)
        seen += tl.sum(equal.to(tl.int32), axis=0)
    offs_k = tl.arange(0, BLOCK_K)
    for j0 in range(0, K, BLOCK_K):
        j = j0 + offs_k
        tl.store(out_row + j, tl.full([BLOCK_K], -1, tl.int32), mask=(j >= taken) & (j < K))
    tl.store(count_at, taken)


@triton.jit
def _select_resident(base, out_row, count_at, width, K: tl.constexpr, BLOCK: tl.constexpr,
                     BLOCK_K: tl.constexpr):
    """:func:`_select_row` over the ``width <= BLOCK`` scores loaded once: the ``K``-th
    largest key by a ``tl.histogram`` of the next byte a pass over the held keys, then
    the positions above it and the first ties, ascending, from one cumulative sum of
    both counts (``BLOCK < 2^16``)."""
    offs = tl.arange(0, BLOCK)
    inside = offs < width
    s = tl.load(base + offs, mask=inside, other=float("-inf"))
    key = _order_key(s).to(tl.int64)  # shifts by up to 32 bits below
    want = tl.minimum(width, K)
    prefix = tl.cast(0, tl.int64)
    greater = 0
    for shift in tl.static_range(32 - HIST_BITS, -HIST_BITS, -HIST_BITS):
        match = inside & ((key >> (shift + HIST_BITS)) == (prefix >> (shift + HIST_BITS)))
        digit = ((key >> shift) & (HIST_BINS - 1)).to(tl.int32)
        pick, above = _held_bucket_of(_masked_histogram(digit, match, HIST_BINS),
                                      want - greater)
        greater += above
        prefix = prefix | (pick.to(tl.int64) << shift)
    live = inside & (s > float("-inf"))
    above = live & (key > prefix)
    equal = live & (key == prefix)
    # one scan of both counts: the keys above the threshold and its ties up to here
    seen = tl.cumsum(above.to(tl.int32) + (equal.to(tl.int32) << 16), axis=0)
    ties = tl.minimum(seen >> 16, want - greater)  # the ties taken up to here
    take = above | (equal & ((seen >> 16) <= want - greater))
    tl.store(out_row + (seen & 0xFFFF) + ties - 1, offs, mask=take)
    taken = tl.sum(take.to(tl.int32), axis=0)
    offs_k = tl.arange(0, BLOCK_K)
    for j0 in range(0, K, BLOCK_K):
        j = j0 + offs_k
        tl.store(out_row + j, tl.full([BLOCK_K], -1, tl.int32), mask=(j >= taken) & (j < K))
    tl.store(count_at, taken)


@triton.jit
def _held_bucket_of(h, need):
    """:func:`_bucket_of` of a ``HIST_BINS`` histogram by one scan and one sum: each bin
    with at least ``need`` keys at or above it adds ``2^20``, each other its count, so the
    sum holds the bucket + 1 above bit 20 and the keys in higher buckets below it
    (``1 <= need <=`` the histogram's total, fewer than ``2^20`` keys)."""
    at_least = tl.cumsum(h, axis=0, reverse=True)  # keys in buckets >= the bin's
    packed = tl.sum(tl.where(at_least >= need, 1 << 20, h), axis=0)
    return (packed >> 20) - 1, packed & ((1 << 20) - 1)


@triton.jit
def _row_topk_kernel(
    s_ptr, out_ptr, count_ptr, width, stride_s, stride_o,
    K: tl.constexpr, BLOCK: tl.constexpr, BLOCK_K: tl.constexpr, HOW: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    _select_row(s_ptr + row * stride_s, out_ptr + row * stride_o, count_ptr + row, width, K,
                BLOCK, BLOCK_K, HOW)


@triton.jit
def _spread_count(hist_ptr, row, scores, live):
    """Adds the ``live`` ``scores`` to row ``row``'s histogram of their keys' top 12 bits
    (the spread select's first step, in every bound program; relaxed: the arrival
    counter's release orders them before the last program's read)."""
    hist_row = hist_ptr + row.to(tl.int64) * KEY_BUCKETS
    bucket = _bucket_key(_order_key(scores))
    tl.atomic_add(hist_row + bucket, live.to(tl.int32), mask=live, sem="relaxed")


@triton.jit
def _rank_candidates(cand_row, n_cand, need, CAND: tl.constexpr):
    """The ``need``-th largest of the ``n_cand <= CAND`` candidates' keys (int32 bits at
    ``cand_row``) by ``[CAND, CAND]`` compares, ``T``, and the ``need`` left at ``T``
    (the candidates above it taken first)."""
    offs = tl.arange(0, CAND)
    ok = offs < n_cand
    key = tl.load(cand_row + offs, mask=ok, other=0).to(tl.uint32, bitcast=True)
    above = tl.sum((ok[None, :] & (key[None, :] > key[:, None])).to(tl.int32), axis=1)
    at_least = tl.sum((ok[None, :] & (key[None, :] >= key[:, None])).to(tl.int32), axis=1)
    hit = ok & (above < need) & (at_least >= need)  # the keys equal to T
    thr = tl.max(tl.where(hit, key, tl.zeros_like(key)), axis=0)
    return thr, need - tl.max(tl.where(hit, above, 0), axis=0)


@triton.jit
def _refine_keys(cand_row, n_cand, thr, need, DONE: tl.constexpr, BITS: tl.constexpr,
                 BINS: tl.constexpr, BLOCK: tl.constexpr):
    """A histogram level over the candidates' keys themselves: the ``need``-th
    largest key's top ``DONE + BITS`` bits among those whose top ``DONE`` are ``thr``,
    and the ``need`` left below them."""
    offs = tl.arange(0, BLOCK)
    h = tl.zeros([BINS], tl.int32)
    for c0 in range(0, n_cand, BLOCK):
        at = c0 + offs
        ok = at < n_cand
        key = tl.load(cand_row + at, mask=ok, other=0).to(tl.uint32, bitcast=True)
        ok = ok & ((key >> (32 - DONE)) == thr)
        h += _masked_histogram(((key >> (32 - DONE - BITS)) & (BINS - 1)).to(tl.int32), ok,
                               BINS)
    digit, above = _bucket_of(h, need, BINS)
    return (thr << BITS) | digit.to(tl.uint32), need - above


@triton.jit
def _spread_select_row(base, out_row, count_at, hist_ptr, cand_ptr, row, width,
                       K: tl.constexpr, BLOCK: tl.constexpr, BLOCK_K: tl.constexpr):
    """As :func:`_select_row`, from row ``row``'s histogram that the bound programs filled
    (zeroed here for the next call) and its bucket's candidates, whose keys it lists in
    the row's ``width`` int32 slots at ``cand_ptr`` (see the module docstring)."""
    hist_row = hist_ptr + row.to(tl.int64) * KEY_BUCKETS
    cand_row = cand_ptr + row.to(tl.int64) * width
    bins = tl.arange(0, KEY_BUCKETS)
    h = tl.load(hist_row + bins)
    tl.debug_barrier()  # every thread has read before any zeroes
    tl.store(hist_row + bins, tl.zeros([KEY_BUCKETS], tl.int32))
    want = tl.minimum(tl.sum(h, axis=0), K)  # the live pages counted, at most K
    b1, above = _bucket_of(h, want, KEY_BUCKETS)
    offs = tl.arange(0, BLOCK)
    n_cand = 0
    for p0 in range(0, width, BLOCK):
        inside = p0 + offs < width
        s = tl.load(base + p0 + offs, mask=inside, other=float("-inf"))
        key = _order_key(s)
        cand = inside & (s > float("-inf")) & (_bucket_key(key) == b1)
        cand_i = cand.to(tl.int32)
        # the keys, not the positions: the threshold needs no second (dependent) load
        tl.store(cand_row + n_cand + tl.cumsum(cand_i, axis=0) - 1,
                 key.to(tl.int32, bitcast=True), mask=cand)
        n_cand += tl.sum(cand_i, axis=0)
    tl.debug_barrier()  # the candidates are visible to the loads below
    need = want - above
    if n_cand <= CAND_BLOCK:
        thr, ties = _rank_candidates(cand_row, n_cand, need, CAND_BLOCK)
    else:  # many in one bucket: the key's other 20 bits by histograms of the candidates
        thr, ties = _refine_keys(cand_row, n_cand, b1.to(tl.uint32), need, 12, 8, 256, BLOCK)
        thr, ties = _refine_keys(cand_row, n_cand, thr, ties, 20, 8, 256, BLOCK)
        thr, ties = _refine_keys(cand_row, n_cand, thr, ties, 28, 4, 16, BLOCK)
    _write_taken(base, out_row, count_at, width, thr.to(tl.int64), ties, K, BLOCK, BLOCK_K)


def row_select(select: str | None = None, width: int | None = None,
               warps: int = NUM_WARPS) -> str:
    """The select :func:`row_topk`'s own launch runs for ``select`` (default ``SELECT``)
    over rows of ``width`` in programs of ``warps``: the spread select lives in Quest's
    bound kernel, so a row launch runs byte-wise, as does the resident select over rows
    wider than ``RESIDENT_KEYS`` a thread."""
    select = held_select(SELECT if select is None else select, width, warps)
    return "bytes" if select == "spread" else select


def held_select(select: str, width: int | None = None, warps: int = NUM_WARPS) -> str:
    """``select`` (one of ``SELECTS``), byte-wise where it is resident and rows of
    ``width`` (padded to a power of two) need more than ``RESIDENT_KEYS`` a thread of
    ``warps`` warps."""
    if select not in SELECTS:
        raise InputError(f"select: expected one of {', '.join(SELECTS)}, got {select!r}")
    wide = (width is not None
            and triton.next_power_of_2(max(width, 16)) > RESIDENT_KEYS * 32 * warps)
    return "bytes" if select == "resident" and wide else select


def check_hist_block(hist_block: int | None) -> None:
    """Raises InputError unless ``hist_block`` is None or a power of two >= 16."""
    if hist_block is not None:
        check_positive_int(hist_block, "hist_block")
        if hist_block & (hist_block - 1) or hist_block < 16:
            raise InputError(f"hist_block: expected a power of two >= 16, got {hist_block}")


def select_block(width: int, select: str | None = None, hist_block: int | None = None,
                 warps: int = NUM_WARPS) -> int:
    """Scores a step of the select reads for rows of ``width`` in programs of ``warps``
    (``select``: default ``SELECT``; ``hist_block``, by default ``HIST_BLOCK``, but four
    bits a pass and the whole row for the resident select)."""
    check_hist_block(hist_block)
    how = row_select(select, width, warps)
    row = triton.next_power_of_2(max(width, 16))
    if how == "resident":
        return row
    return min(MAX_BLOCK if how == "nibbles" else (hist_block or HIST_BLOCK), row)


def row_topk(scores: torch.Tensor, k: int, out: torch.Tensor | None = None,
             counts: torch.Tensor | None = None, select: str | None = None,
             hist_block: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns ``(index [R, k] int32, counts [R] int32)``: each row's positions of its
    ``k`` largest finite-or-``+inf`` scores of ``scores [R, P]`` (fp32, unit stride in
    P) in ascending order, ``-1`` after the ``counts`` taken (see the module
    docstring). Ties at the threshold go to the lowest positions. ``select``: as
    :func:`row_select` (default ``SELECT``); ``hist_block``: as :func:`select_block`."""
    check_positive_int(k, "k")
    if scores.dim() != 2 or scores.dtype != torch.float32 or scores.stride(1) != 1:
        raise InputError(f"scores: expected an fp32 [R, P] tensor with unit stride in P, got "
                         f"{tuple(scores.shape)} {scores.dtype}")
    rows, width = scores.shape
    if out is None:
        out = torch.empty(rows, k, dtype=torch.int32, device=scores.device)
    if counts is None:
        counts = torch.empty(rows, dtype=torch.int32, device=scores.device)
    if (out.shape != (rows, k) or out.dtype != torch.int32 or out.stride(1) != 1
            or counts.shape != (rows,) or counts.dtype != torch.int32):
        raise InputError(f"out, counts: expected int32 [{rows}, {k}] and [{rows}]")
    if rows == 0:
        return out, counts
    _row_topk_kernel[(rows,)](
        scores, out, counts, width, scores.stride(0), out.stride(0),
        K=k, BLOCK=select_block(width, select, hist_block),
        BLOCK_K=min(1024, triton.next_power_of_2(k)),
        HOW=row_select(select, width), num_warps=NUM_WARPS,
    )  # fmt: skip
    return out, counts
