"""The method registry: every attention method, one entry each, used by every runner.

An entry carries its name, family, parameters (defaults and validation), the exact
PyTorch reference, an optional fast path (``prepare``: a Triton kernel or a dense
baseline, set up outside the timed region), availability with a reason, its byte
model, its end-to-end decode backend (``e2e_backend``), its plot style and the module
that registered it. Method specs on the command line read
``name`` or ``name:key=value,key=value`` (e.g. ``santa-prop:S=128,tile=64``).

Each family has its module here, which registers its methods with :func:`register`
when the package is imported: :mod:`.dense`, :mod:`.santa`, :mod:`.bernoulli`,
:mod:`.santapp`, :mod:`.selection` (the selection methods users compare against:
oracle top-k, Quest, vAttention, top-k + S²ANTA), :mod:`.lsh` (MagicPIG),
:mod:`.baseline` (the vendor dense kernels). A new method is a new module, imported
below (``docs/adding-a-method.md``).
"""

from __future__ import annotations

from santa_bench.methods._common import (
    DEFAULT_TILE,
    KERNEL_ONLY_PARAMS,
    STASH_DTYPES,
    PrepareFn,
)
from santa_bench.methods._core import (
    FAMILIES,
    REGISTRY,
    E2EBackend,
    Method,
    MethodError,
    Param,
    PlotStyle,
    Promise,
    Registry,
    parse_method_specs,
    register,
)

# The family modules, in registration order (the order of `santa-bench list`).
# isort: off
from santa_bench.methods import dense
from santa_bench.methods import santa
from santa_bench.methods import bernoulli
from santa_bench.methods import santapp
from santa_bench.methods import lsh
from santa_bench.methods import selection
from santa_bench.methods import baseline
# isort: on
from santa_bench.methods.baseline import register_baseline

__all__ = [
    "DEFAULT_TILE",
    "FAMILIES",
    "KERNEL_ONLY_PARAMS",
    "REGISTRY",
    "STASH_DTYPES",
    "E2EBackend",
    "Method",
    "MethodError",
    "Param",
    "PlotStyle",
    "PrepareFn",
    "Promise",
    "Registry",
    "baseline",
    "bernoulli",
    "dense",
    "lsh",
    "parse_method_specs",
    "register",
    "register_baseline",
    "santa",
    "santapp",
    "selection",
]
