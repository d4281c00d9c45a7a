"""Launch helpers every Triton kernel of the library shares: programmatic dependent launch
(Hopper's ``griddepcontrol``, :func:`pdl_available`), a paged or contiguous cache's row
offsets, and the device's SM count for the launch planners.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

try:  # programmatic dependent launch (Hopper+; Triton >= 3.4)
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # pragma: no cover - older Triton: launches stay serial
    gdc_launch_dependents = gdc_wait = None

H200_SM_COUNT = 132  # the planners' SM count where there is no CUDA device


@functools.cache
def _sm_count(device: torch.device) -> int:
    """The device's SM count (cached: the launch planners call it on every call)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return H200_SM_COUNT


@functools.cache
def pdl_available(device: torch.device) -> bool:
    """True where programmatic dependent launch works: a CUDA device of compute
    capability >= 9.0 (not the interpreter) and a Triton with grid dependency control.
    Cached per device: the launchers ask on every call."""
    return (gdc_wait is not None and device.type == "cuda"
            and os.environ.get("TRITON_INTERPRET", "0") != "1"
            and torch.cuda.get_device_capability(device)[0] >= 9)


@triton.jit
def _pdl_enter(PDL: tl.constexpr, WAIT: tl.constexpr):
    """Programmatic dependent launch (Hopper): with WAIT (a kernel launched with
    ``launch_pdl``), wait until the previous kernel has finished and its writes are
    visible; then let the next kernel launch once every program of this one has started.
    Nothing without PDL."""
    if PDL:
        if WAIT:
            gdc_wait()
        gdc_launch_dependents()


@triton.jit
def _pdl_wait(ON: tl.constexpr):
    """With ON (a kernel launched with ``launch_pdl``): wait until the previous kernel has
    finished and its writes are visible. Nothing without it."""
    if ON:
        gdc_wait()


@triton.jit
def _pdl_trigger(ON: tl.constexpr):
    """With ON: let the next kernel (launched with ``launch_pdl``) launch once every
    program of this one has started. Nothing without it."""
    if ON:
        gdc_launch_dependents()


@triton.jit
def _row_offsets(page_table_ptr, b, offs_n, stride_x, stride_y, stride_pt, page_size,
                 PAGED: tl.constexpr):
    """Element offsets of sequence ``b``'s rows ``offs_n`` in a [X, Y, Hkv, d] cache."""
    if PAGED:
        # paged: token i lives in page page_table[b, i // page_size], slot i % page_size
        page = tl.load(page_table_ptr + b * stride_pt + offs_n // page_size)
        return page.to(tl.int64) * stride_x + (offs_n % page_size).to(tl.int64) * stride_y
    return b.to(tl.int64) * stride_x + offs_n.to(tl.int64) * stride_y
