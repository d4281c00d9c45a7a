"""santa_kernels: stochastic sparse attention for LLM decoding (references and kernels).

Depends on torch (and triton for the fast kernels) only, never on the santa_bench harness.
"""

from santa_kernels.kv import KVCache
from santa_kernels.reads import ReadCounts
from santa_kernels.reference import (
    AttentionOutput,
    attention,
    dense_attention,
    make_generator,
    santa_flash,
    santa_iid,
    santa_prop,
    santa_strat,
    santa_sys,
)
from santa_kernels.validate import InputError

__all__ = [
    "AttentionOutput",
    "InputError",
    "KVCache",
    "ReadCounts",
    "attention",
    "dense_attention",
    "make_generator",
    "santa_flash",
    "santa_iid",
    "santa_prop",
    "santa_strat",
    "santa_sys",
]
