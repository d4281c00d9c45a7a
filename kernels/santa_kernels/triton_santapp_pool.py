"""SANTA++ Triton kernels, stage 1 with ``draw=pooled``: the pool kernel draws one set of
``M`` teams per (sequence, KV head) from its query heads' mean team probabilities.

Grid ``(B * Hkv,)``, after the select kernel wrote every head's ``phi [G, T]`` (with the
fused finish the group's last select program runs the same steps instead:
``triton_santapp_select._pool_group``, here with the other finishers). A program
takes each head's log-softmax over its teams (``phi - lse_h``), pools them by a
log-sum-exp over the heads (``log p_g = log mean_h softmax(phi_h)_g``), adds Gumbel noise
(Philox keyed by ``(seed, step)``, counter ``(b, KV head, team)``; ``gumbels=`` overrides
it), finds ``kappa`` = the ``(M+1)``-th largest ``z`` by the finishers' k-ary search
(``-inf`` where the group has at most ``M`` teams: every one is taken, ``pi = 1``) and
writes the chosen teams in team order to the group's ``M`` list slots with their shared
``1/pi`` (``pi = 1 - exp(-exp(log p_g - kappa))``) and their count. The attend programs
read each listed team once for the whole group. Each head's merge reference
(``kappa_ptr``: ``lse_h + kappa``, or ``lse_h`` where kappa is ``-inf``) keeps a team's
weighted term near ``p_{h,g} / p_g <= G`` in the atomic merge's sums. The design is in
:mod:`santa_kernels.triton_santapp`.
"""

from __future__ import annotations

import triton
import triton.language as tl

from santa_kernels.triton_launch import _pdl_enter
from santa_kernels.triton_santapp_select import _pool_group


@triton.jit
def _pool_kernel(
    phi_ptr, gumbel_ptr, rng_ptr, seed, kappa_ptr, pool_kappa_ptr, union_ptr, count_ptr,
    pool_w_ptr, M, t_cap, union_cap,
    NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr, G_ROWS: tl.constexpr,
    C_PAD: tl.constexpr, HAS_GUMBELS: tl.constexpr, WAYS: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """Grid ``(B * Hkv)``: one (sequence, KV head)'s pooled draw (the module's steps);
    ``gumbels [B, Hkv, T]`` with HAS_GUMBELS, else Philox."""
    _pdl_enter(PDL, True)  # launched early: wait for the select kernel
    _pool_group(phi_ptr, gumbel_ptr, rng_ptr, seed, kappa_ptr, pool_kappa_ptr, union_ptr,
                count_ptr, pool_w_ptr, tl.program_id(0), M, t_cap, union_cap, NUM_KV_HEADS,
                GROUP, G_ROWS, C_PAD, HAS_GUMBELS, WAYS)
