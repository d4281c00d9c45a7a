"""Family ``oracle``: the selection methods users compare against (``oracle-topk``,
``quest``, ``vattention``, ``topk-santa``; docs/algorithms.md section 10).

Reference: ``santa_kernels.selection``. Kernel: ``santa_kernels.triton_selection`` (the
selection as tensor ops on the GPU, the attention through ``santa_kernels.triton_indexed``);
the timed call does both. End-to-end decode: :class:`SelectionDecode` (this module; one
fast-path step serves every layer, Quest's page bounds built after the prefill, then
extended by each decode step).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import torch

from santa_bench.baselines import Prepared, Unsupported, trial_run
from santa_bench.decode.base import DecodeAttention
from santa_bench.e2e.cache import StaticKVCache
from santa_bench.methods._common import S
from santa_bench.methods._core import Method, Param, PlotStyle, Promise, register
from santa_bench.timing import nbytes_of
from santa_kernels import selection as references
from santa_kernels.build_timing import median_build_ms
from santa_kernels.kv import KVCache

SHARED = Param(
    "shared",
    "group",
    str,
    "one selection per KV head (group: the G query heads' summed probabilities, or "
    "largest Quest bound; what a KV read can exploit) or per query head (head)",
    choices=("group", "head"),
)


def _triton_selection():
    return importlib.import_module("santa_kernels.triton_selection")


def selection_kernel_available() -> tuple[bool, str]:
    """Returns whether the indexed Triton kernel can run here, with the reason if not."""
    try:
        return importlib.import_module("santa_kernels.triton_indexed").indexed_available()
    except Exception as exc:  # triton missing or broken
        return False, f"santa_kernels.triton_indexed not importable: {exc}"


# ------------------------------------------------------------------ fast paths
def _oracle_step(q, kv, params, scale, seed, num_layers=1):
    return _triton_selection().OracleTopKStep(q, kv, k=params["k"], shared=params["shared"],
                                              scale=scale, seed=seed)


def _quest_step(q, kv, params, scale, seed, num_layers=1):
    return _triton_selection().QuestStep(q, kv, page=params["page"], pages=params["pages"],
                                         shared=params["shared"], scale=scale, seed=seed,
                                         num_layers=num_layers)


def _vattention_step(q, kv, params, scale, seed, num_layers=1):
    keys = ("sink", "window", "topk", "epsilon", "delta", "base_rate", "mode")
    return _triton_selection().VAttentionStep(q, kv, **{k: params[k] for k in keys},
                                              scale=scale, seed=seed)


def _topk_santa_step(q, kv, params, scale, seed, num_layers=1):
    return _triton_selection().TopKSantaStep(q, kv, k=params["k"], S=params["S"],
                                             scale=scale, seed=seed)


StepBuilder = Callable[..., Any]


def selection_prepare(name: str, build: StepBuilder) -> Callable[..., Prepared]:
    """The kernel adapter of a selection method: builds its step (Quest: its page bounds;
    ``index_build_ms`` is the median of three builds after an untimed one,
    :func:`~santa_kernels.build_timing.median_build_ms`), runs it once; the timed call
    selects and attends."""

    def prepare(q: torch.Tensor, kv: KVCache, *, seed: int = 0, scale: float | None = None,
                **params: Any) -> Prepared:
        try:
            step = build(q, kv, params, scale, seed)
        except ValueError as exc:
            raise Unsupported(f"{name}: {exc}") from exc
        metrics: dict[str, tuple[float, str]] = {}
        if hasattr(step, "build"):
            _, ms = median_build_ms(lambda: step.build(kv), q.device)
            metrics["index_build_ms"] = (ms, "ms")
        tables = getattr(step, "table_bytes", lambda: 0)()  # a copy of the scores it writes
        if tables:
            metrics["bytes_read_tables"] = (float(tables), "B")

        def run() -> torch.Tensor:
            return step(q, kv)

        trial_run(run, q, name)
        prepared = Prepared(run, nbytes_of(q, kv), {"num_splits": step.workspace.num_splits})
        prepared.reads = lambda: step.read_counts(q, kv)  # type: ignore[attr-defined]
        prepared.reset_rng = step.reset_rng  # type: ignore[attr-defined]
        prepared.metrics = metrics  # type: ignore[attr-defined]
        return prepared

    prepare.__doc__ = f"Prepares the fast path of {name} (santa_kernels.triton_selection)."
    return prepare


class SelectionDecode(DecodeAttention):
    """A selection method's fast path in every layer (CUDA-graph capturable)."""

    def __init__(self, method: str, build: Callable[..., Any], params: dict[str, Any],
                 scale: float, seed: int) -> None:
        self.method, self.build, self.params = method, build, dict(params)
        self.scale, self.seed = scale, seed
        self.name = "triton"

    def setup(self, cache: StaticKVCache, q: torch.Tensor) -> None:
        super().setup(cache, q)
        ok, why = selection_kernel_available()
        if not ok:
            raise Unsupported(why)
        try:
            self.step = self.build(q, cache.layers[0], self.params, self.scale, self.seed,
                                   num_layers=cache.num_layers)
        except ValueError as exc:
            raise Unsupported(f"{self.method}: {exc}") from exc

    def after_prefill(self, cache: StaticKVCache) -> None:
        if hasattr(self.step, "build"):
            for layer, kv in enumerate(cache.layers):
                self.step.build(kv, layer)

    def reset(self) -> None:
        self.step.reset_rng(0)

    def __call__(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        return self.step(q, self.cache.layers[layer], layer=layer)

    def read_fraction(self, layer: int, q: torch.Tensor) -> float:
        """The KV read fraction of one more call on ``q`` (off the hot path)."""
        kv = self.cache.layers[layer]
        reads = (self.step.read_counts(q, kv, layer) if hasattr(self.step, "build")
                 else self.step.read_counts(q, kv))
        return float(reads.kv_read_fraction)


def selection_backend(build: StepBuilder) -> Callable[..., Any]:
    """The end-to-end decode backend factory of a selection method."""

    def e2e(method: Method, params: dict[str, Any], scale: float, seed: int):
        return SelectionDecode(method.name, build, params, scale, seed)

    return e2e


def score_stash(params: dict[str, Any]) -> str:
    """The stash of a method whose selection reads every token's score: the score pass
    writes fp32 scores ``[B, Hq, n]`` and the selection reads them back."""
    return "fp32"


def _method(name: str, description: str, params: tuple[Param, ...], reference,
            build: StepBuilder, plot: PlotStyle, promise=None,
            deterministic: bool = False, stash: bool = True) -> Method:
    return Method(
        name,
        "oracle",
        description,
        params,
        reference=reference,
        deterministic=deterministic,
        prepare=selection_prepare(name, build),
        kernel_kind="triton",
        kernel_availability=selection_kernel_available,
        stash_of=score_stash if stash else None,
        e2e_backend=selection_backend(build),
        plot=plot,
        promise=promise,
    )


def _vattention_promise(params: dict[str, Any]) -> Promise:
    return Promise(float(params["epsilon"]), float(params["delta"]), str(params["mode"]))


# ------------------------------------------------------------------ the methods
@register
def selection_methods() -> tuple[Method, ...]:
    return (
        _method(
            "oracle-topk",
            "exact top-k tokens by score, softmax renormalised over them (reads all of K)",
            (
                Param("k", 1024, int, "tokens attended exactly (per KV head; per query head "
                      "with shared=head)", minimum=1),
                SHARED,
            ),
            references.oracle_topk,
            _oracle_step,
            PlotStyle(colour="#4d4d4d", marker="x", linestyle=":"),
            deterministic=True,
        ),
        _method(
            "quest",
            "Quest: pages of keys bounded by per-channel min/max, the top pages exact",
            (
                Param("page", 16, int, "tokens per Quest page (bounds and selection unit)",
                      minimum=1),
                Param("pages", 64, int, "pages attended per KV head (per query head with "
                      "shared=head), the sequence's last page among them", minimum=1),
                SHARED,
            ),
            references.quest,
            _quest_step,
            PlotStyle(colour="#17becf", marker="P", linestyle="-."),
            deterministic=True,
            stash=False,  # scores its pages' bounds, not the tokens
        ),
        _method(
            "vattention",
            "vAttention: sink, window and top-k exact, a CLT-sized uniform sample of the "
            "rest (epsilon, delta promise)",
            (
                Param("sink", 128, int, "first tokens attended exactly", minimum=0),
                Param("window", 128, int, "recent tokens attended exactly", minimum=0),
                Param("topk", 256, int, "tokens of the middle attended exactly (per KV "
                      "head, by the group's summed probability)", minimum=0),
                Param("epsilon", 0.05, float, "relative error allowed (of the denominator, "
                      "or of the output with mode=output)", within=(0.0, 1.0)),
                Param("delta", 0.05, float, "probability that the error may exceed epsilon",
                      within=(0.0, 1.0)),
                Param("base_rate", 0.01, float, "base sample (spread and denominator "
                      "estimate) as a fraction of the sampled range, at least 2 tokens",
                      within=(0.0, 1.0)),
                Param("mode", "denominator", str, "the budget's CLT bound: on the softmax "
                      "denominator (the paper's relaxation) or on the output (reference only)",
                      choices=("denominator", "output")),
            ),
            references.vattention,
            _vattention_step,
            PlotStyle(colour="#bcbd22", marker="*", linestyle="-"),
            promise=_vattention_promise,
        ),
        _method(
            "topk-santa",
            "top-k tokens exact plus S2ANTA-sys samples of the rest, weighted by its mass "
            "(unbiased)",
            (
                Param("k", 64, int, "tokens attended exactly per KV head (by the group's "
                      "summed probability)", minimum=0),
                S,
            ),
            references.topk_santa,
            _topk_santa_step,
            PlotStyle(colour="#8c2d04", marker="v", linestyle="-"),
        ),
    )
