"""Family ``lsh``: MagicPIG (Chen et al. 2024), keys sampled by SimHash collisions with the
query and importance-weighted by their collision probability.

Reference only (no GPU kernel): ``santa_kernels.lsh``. A sampler a serving system can run
(its hash tables are built once, after the prefill), so not an oracle; hence its own
family. Decoding (``accuracy`` runs, ``e2e`` on a CPU) indexes each layer's prompt once
after the prefill with hyperplanes fixed for the whole generation (drawn from the
prompt's seed), as MagicPIG does; decode tokens, like the sink and the window, are
attended exactly. The sequences' indexes are stacked, so one reference call per layer and
step serves a whole batch (the attention itself draws no random numbers). Other runners
(``kernel``, ``accuracy fidelity``) hash the cache afresh on every call, with hyperplanes
drawn from the call's seed.
"""

from __future__ import annotations

from typing import Any

import torch

import santa_kernels as sk
from santa_bench.methods._core import Method, Param, PlotStyle, register
from santa_kernels.kv import KVCache
from santa_kernels.lsh import (
    CENTERS,
    LSHIndex,
    build_lsh_index,
    lsh_attention,
    magicpig,
    stack_lsh_indexes,
)

REFERENCE_ONLY = "reference only: no GPU kernel"


def prompt_index(kv: KVCache, params: dict[str, Any], seed: int) -> LSHIndex:
    """The decode's hash tables of one prompt's cache (built after the prefill)."""
    p = params
    return build_lsh_index(kv, K=p["K"], L=p["L"], sink=p["sink"], window=p["window"],
                           center=p["center"], seed=seed)


def indexed_reference(q: torch.Tensor, kv: KVCache, index: LSHIndex, params: dict[str, Any],
                      *, scale: float | None, seed: int) -> sk.AttentionOutput:
    """The reference over a prompt hashed by :func:`prompt_index` (``seed`` unused: the
    randomness is the index's hyperplanes)."""
    return lsh_attention(q, kv, index, min_hits=params["min_hits"], scale=scale)


@register
def magicpig_method() -> Method:
    return Method(
        "magicpig",
        "lsh",
        "MagicPIG: keys whose SimHash codes match the query's in >= min_hits of L tables "
        f"(K bits each), weighted by 1/P(collision), sink and window exact ({REFERENCE_ONLY})",
        (
            # defaults: MagicPIG's (K, L) = (10, 150), >= 2 hits, 4 sink and 64 local tokens
            Param("K", 10, int, "SimHash bits per table (hyperplanes)", minimum=1),
            Param("L", 150, int, "hash tables", minimum=1),
            Param("min_hits", 2, int, "tables a key must share with the query to be sampled",
                  minimum=1),
            Param("sink", 4, int, "first tokens attended exactly", minimum=0),
            Param("window", 64, int, "recent tokens attended exactly", minimum=0),
            Param("center", "mean", str, "keys centred on their mean before hashing, or not",
                  choices=CENTERS),
        ),
        reference=magicpig,  # no prepare: kernel_available() says "reference only"
        prefill_index=prompt_index,
        indexed_reference=indexed_reference,
        stack_indexes=stack_lsh_indexes,  # one call per layer and step for the batch
        plot=PlotStyle(colour="#8c564b", marker="P", linestyle="-."),
    )
