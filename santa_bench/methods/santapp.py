"""Family ``santapp``: SANTA++, teams of keys sampled through representative keys,
attended exactly inside, combined with a Horvitz-Thompson ratio.

Reference: ``santa_kernels.santapp.santapp``. Kernel: ``santa_kernels.triton_santapp``
(the team index built and packed outside the timed region). End-to-end decode:
:class:`TritonSantaPPDecode` (this module) on a GPU; on a CPU the reference,
with each layer's prompt indexed once after the prefill (:func:`team_index`).
"""

from __future__ import annotations

import importlib
from typing import Any

import torch

import santa_kernels as sk
from santa_bench.baselines import TRITON_SPLITKV, Prepared, Unsupported
from santa_bench.decode.base import DecodeAttention
from santa_bench.decode.dense import TritonSplitKVDecode
from santa_bench.e2e.cache import StaticKVCache
from santa_bench.methods._core import Method, Param, PlotStyle, register
from santa_bench.timing import nbytes_of
from santa_kernels.kv import KVCache
from santa_kernels.santapp import (
    DEFAULT_M,
    DEFAULT_SINK,
    DEFAULT_WINDOW,
    DRAWS,
    KERNEL_DRAWS,
)
from santa_kernels.santapp import santapp as santapp_reference


# ------------------------------------------------------------------ kernel adapter
def _triton_santapp():
    return importlib.import_module("santa_kernels.triton_santapp")


# pooled: 2.14x over cuDNN at 32/8/128, 32k, B=8 (head: 0.68x) and non-inferior to dense on the
# nine RULER tasks of Qwen2.5-Coder-1.5B at 32k where head's M=512 reads 3x the bytes
# (results/h100: 2026-12-07-h100-kernels-floor-32k-three-shapes and
# 2026-12-07-h100-accuracy-ruler-qwen2.5-coder-1.5b-santapp-pooled); rows stored before it was
# the default drew per head
DRAW = Param(
    "draw",
    "pooled",
    str,
    "how a GQA group's query heads draw teams: pooled = one draw of M per KV head from the "
    "heads' mean probabilities, shared weights (M teams read a KV head); head = each its own "
    "M, weighted by its own inclusion probabilities (up to G x M teams read); union = each "
    "its own, every head weighting the group's union by the union's inclusion probability "
    "(head's reads; reference only)",
    choices=DRAWS,
    omit_default=True,
    absent="head",  # left out of a case at head: stored head cases keep their hashes
)


def santapp_kernel_available() -> tuple[bool, str]:
    """Returns whether the Triton SANTA++ kernels can run here, with the reason if not."""
    try:
        return _triton_santapp().santapp_triton_available()
    except Exception as exc:  # triton missing or broken
        return False, f"santa_kernels.triton_santapp not importable: {exc}"


def _santapp_packed(module, kv: KVCache, params: dict[str, Any]):
    """Returns ``(packed, index_build_ms)``: the team index built and packed on the cache's
    device (prefill-time work), timed apart from decode."""
    return module.time_index_build(kv, **params)


def require_kernel_draw(draw: str) -> None:
    """Unsupported unless the Triton kernel implements ``draw`` (``KERNEL_DRAWS``)."""
    if draw not in KERNEL_DRAWS:
        raise Unsupported(f"santapp: the Triton kernel implements draw="
                          f"{' and draw='.join(KERNEL_DRAWS)}, not draw={draw} "
                          "(use --reference)")


def merge_atomic_of(merge: str) -> bool | None:
    """The kernel's ``merge_atomic`` for the method's ``merge`` (None: its own choice)."""
    return {"auto": None, "atomic": True, "kernel": False}[merge]


def _every_team_read(q: torch.Tensor, kv: KVCache, scale: float | None, teams: int) -> Prepared:
    """The call where ``M`` covers every team of every (sequence, KV head): it reads every
    token, so it is dense attention, run by the split-KV decode kernel (its rows count a
    dense read)."""
    prepared = TRITON_SPLITKV.prepare(q, kv, scale=scale)
    prepared.notes["every_team_read"] = teams  # the tables' team count, at most M
    return prepared


def santapp_prepare(
    q: torch.Tensor,
    kv: KVCache,
    *,
    seed: int = 0,
    M: int,
    team_size: int = 16,
    leaders: int = 4,
    policy: str = "contiguous",
    scheme: str = "gumbel-topk",
    representative: str = "mean",
    mix: float = 0.0,
    sink: int = DEFAULT_SINK,
    window: int = DEFAULT_WINDOW,
    reps: str = "model",
    merge: str = "auto",
    draw: str = DRAW.omitted,
    scale: float | None = None,
) -> Prepared:
    """Prepares the Triton SANTA++ kernel: builds and packs the team index outside the timed
    region (its time goes to the ``index_build_ms`` metric), plans the workspace, runs once.
    Where ``M`` covers every team the call is dense attention and runs the split-KV kernel.
    Extra metrics: ``index_build_ms`` and, after ``reads()``, ``read_equivalent`` and
    ``bytes_read_tables`` (the representatives' bytes, counted in the bandwidth)."""
    require_kernel_draw(draw)
    module = _triton_santapp()
    try:
        module.check_scheme(scheme, mix)
    except ValueError as exc:
        raise Unsupported(str(exc)) from exc
    params = {
        "policy": policy,
        "team_size": team_size,
        "leaders": leaders,
        "representative": representative,
        "sink": sink,
        "exact_recent": window,
        "reps": reps,
    }
    try:
        packed, build_ms = _santapp_packed(module, kv, params)
        if module.reads_every_team(M, packed):
            return _every_team_read(q, kv, scale, packed.max_teams)
        workspace = module.SantaPPWorkspace.for_inputs(q, kv, packed, M, seed=seed,
                                                       merge_atomic=merge_atomic_of(merge),
                                                       draw=draw)

        def run() -> torch.Tensor:
            return module.santapp_decode(q, kv, packed, M, scale=scale, workspace=workspace)[0]

        module.santapp_decode(q, kv, packed, M, scale=scale, workspace=workspace)
    except Exception as exc:
        raise Unsupported(f"santapp: {type(exc).__name__}: {exc}") from exc
    metrics: dict[str, tuple[float, str]] = {"index_build_ms": (build_ms, "ms")}

    def reads():
        _, info = module.santapp_decode(q, kv, packed, M, scale=scale, workspace=workspace)
        metrics["read_equivalent"] = (info.read_equivalent(), "ratio")
        counts = info.read_counts()
        # representatives (and log n, int8 scales): read every call besides the K/V rows
        metrics["bytes_read_tables"] = (
            info.bytes_moved(q) - counts.kv_bytes(packed.kv_itemsize)
            - 2 * q.numel() * q.element_size(), "B")
        return counts

    def rebind(q: torch.Tensor, kv: KVCache) -> Prepared:
        """The call over another cache: its own team index, this workspace where the plan
        is the same (as the decode loop's layers share one)."""
        own, _ = _santapp_packed(module, kv, params)
        merge_atomic = merge_atomic_of(merge)
        same = module._plan_for(q, kv, own, M, merge_atomic=merge_atomic,
                                draw=draw) == workspace.plan
        ws = workspace if same else module.SantaPPWorkspace.for_inputs(
            q, kv, own, M, seed=seed, merge_atomic=merge_atomic, draw=draw)
        return Prepared(
            lambda: module.santapp_decode(q, kv, own, M, scale=scale, workspace=ws)[0],
            nbytes_of(q, kv), notes, rebind=rebind)

    notes = {"plan": workspace.plan, "teams_read_from": packed.what_is_read()}
    prepared = Prepared(run, nbytes_of(q, kv), notes, rebind=rebind)
    prepared.reads = reads  # type: ignore[attr-defined]
    prepared.reset_rng = workspace.reset_rng  # type: ignore[attr-defined]
    prepared.metrics = metrics  # type: ignore[attr-defined]
    return prepared


# ------------------------------------------------------------------ end-to-end decode
class TritonSantaPPDecode(DecodeAttention):
    """The SANTA++ Triton kernel (``santa_kernels.triton_santapp``).

    After the prefill every layer's prompt is indexed into teams and packed (prefill-time
    work, untimed); decode tokens join the exact tail, which the kernel reads up to the
    device lengths. A layer whose prompt has at most ``M`` teams reads every token: it
    runs the split-KV dense kernel. Layers whose packs plan alike share one workspace,
    whose device step counter advances per call; a workspace of another plan gets another
    seed.
    """

    def __init__(self, params: dict[str, Any], scale: float, seed: int) -> None:
        self.params, self.scale, self.seed = dict(params), scale, seed
        self.name = "triton"

    def setup(self, cache: StaticKVCache, q: torch.Tensor) -> None:
        require_kernel_draw(self.params.get("draw", DRAW.omitted))
        super().setup(cache, q)
        ok, why = santapp_kernel_available()
        if not ok:
            raise Unsupported(why)
        self.module = _triton_santapp()
        try:
            self.module.check_scheme(self.params["scheme"], self.params["mix"])
        except ValueError as exc:
            raise Unsupported(str(exc)) from exc
        self.query = q
        self.packed: list[Any] = []
        self.workspaces: list[Any] = []
        # the layers whose prompt has at most M teams read every token: dense attention
        self.dense: TritonSplitKVDecode | None = None

    def set_pdl_chain(self, on: bool) -> None:
        super().set_pdl_chain(on)
        if self.dense is not None:
            self.dense.set_pdl_chain(on)

    def after_prefill(self, cache: StaticKVCache) -> None:
        p, module = self.params, self.module
        by_plan: dict[Any, Any] = {}
        self.packed, self.workspaces = [], []
        try:
            for kv in cache.layers:
                packed = module.build_packed(
                    kv, policy=p["policy"], team_size=p["team_size"], leaders=p["leaders"],
                    representative=p["representative"], seed=self.seed, sink=p["sink"],
                    exact_recent=p["window"], reps=p.get("reps", "model"))
                if module.reads_every_team(p["M"], packed):  # dense attention there
                    if self.dense is None:
                        self.dense = TritonSplitKVDecode(self.scale)
                        self.dense.setup(cache, self.query)
                        self.dense.set_pdl_chain(self.pdl_chain)
                    self.packed.append(None)
                    self.workspaces.append(None)
                    continue
                plan = module._plan_for(self.query, kv, packed, p["M"],
                                        merge_atomic=merge_atomic_of(p.get("merge", "auto")),
                                        draw=p.get("draw", DRAW.omitted))
                if plan not in by_plan:
                    by_plan[plan] = module.SantaPPWorkspace(
                        plan, device=self.query.device, seed=self.seed + len(by_plan))
                self.packed.append(packed)
                self.workspaces.append(by_plan[plan])
        except ValueError as exc:
            raise Unsupported(f"santapp: {exc}") from exc

    def reset(self) -> None:
        for workspace in {id(w): w for w in self.workspaces if w is not None}.values():
            workspace.reset_rng(0)

    def __call__(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        if self.packed[layer] is None:
            return self.dense(layer, q)
        return self.module.santapp_decode(
            q, self.cache.layers[layer], self.packed[layer], self.params["M"],
            scale=self.scale, workspace=self.workspaces[layer], pdl_chain=self.pdl_chain)[0]

    def read_fraction(self, layer: int, q: torch.Tensor) -> float:
        """The KV read fraction of one more call of the kernel on ``q`` (off the hot path)."""
        if self.packed[layer] is None:
            return 1.0
        _, info = self.module.santapp_decode(
            q, self.cache.layers[layer], self.packed[layer], self.params["M"],
            scale=self.scale, workspace=self.workspaces[layer])
        return float(info.read_counts().kv_read_fraction)



def _e2e_backend(method: Method, params: dict[str, Any], scale: float, seed: int):
    return TritonSantaPPDecode(params, scale, seed)


def team_index(kv: KVCache, params: dict[str, Any], seed: int) -> Any:
    """The reference decode's team index of one prompt's cache (built after the prefill)."""
    from santa_kernels.santapp import build_team_index

    p = params
    return build_team_index(kv, policy=p["policy"], team_size=p["team_size"],
                            leaders=p["leaders"], representative=p["representative"],
                            seed=seed, exact_recent=p["window"], sink=p["sink"])


def indexed_reference(q: torch.Tensor, kv: KVCache, index: Any, params: dict[str, Any], *,
                      scale: float | None, seed: int) -> sk.AttentionOutput:
    """The reference over a prompt indexed by :func:`team_index` (decode tokens exact)."""
    from santa_kernels.santapp import santapp_attention

    p = params
    return santapp_attention(q, kv, index, p["M"], scheme=p["scheme"], mix=p["mix"],
                             sink=p["sink"], window=p["window"], scale=scale, seed=seed,
                             draw=p.get("draw", DRAW.omitted))


# ------------------------------------------------------------------ the method
@register
def santapp() -> Method:
    return Method(
        "santapp",
        "santapp",
        "SANTA++: M teams sampled through representative keys, exact inside, HT ratio",
        (
            # the fewest teams measured within 1 point of dense on RULER NIAH at 32k (of 2048
            # teams of 16; accuracy-2026-12-06-h100-niah-teams)
            Param("M", DEFAULT_M, int,
                  "teams selected per query head (every team, exact, where there are fewer)",
                  minimum=1),
            Param("team_size", 16, int, "tokens per team (P; k-means: per parent)", minimum=1),
            Param("leaders", 4, int, "k-means: leaders (teams) per parent (R)", minimum=1),
            Param("policy", "contiguous", str, "team index", choices=("contiguous", "kmeans")),
            Param(
                "scheme",
                "gumbel-topk",
                str,
                "team selection, without or with replacement",
                choices=("gumbel-topk", "multinomial"),
            ),
            # the mean: more of RULER NIAH kept at the same M and kernel time than the
            # leader (accuracy-2026-12-06-h100-niah-mean)
            Param("representative", "mean", str,
                  "team key: the mean of its members, or the member nearest it (leader)",
                  choices=("mean", "leader")),
            Param("mix", 0.0, float, "defensive mixing with the uniform, in [0, 1)"),
            # defaults from the GPU RULER runs at 32k (accuracy-2026-12-04-h200-ruler*):
            # better on NIAH than none, at no measured kernel cost
            # (the kernel library's defaults, santa_kernels.santapp.DEFAULT_*)
            Param("sink", DEFAULT_SINK, int, "first tokens attended exactly", minimum=0),
            Param("window", DEFAULT_WINDOW, int, "recent tokens attended exactly", minimum=0),
            Param(
                "reps",
                "model",
                str,
                "representatives stored in the cache dtype, or as int8 codes with a "
                "per-team scale (half the scoring bytes; phi from the rounded keys, "
                "still unbiased)",
                choices=("model", "int8"),
                omit_default=True,
            ),
            Param(
                "merge",
                "auto",
                str,
                "kernel only: atomic = the attend programs add their partials into "
                "per-head sums and the group's last one divides (the sums' order, so "
                "the output's last bits, vary between GPU runs); kernel = the "
                "partials merged by their maxima in a merge kernel "
                "(bitwise reproducible); auto = atomic up to 16 (sequence, KV "
                "head) groups, where it measured faster",
                choices=("auto", "atomic", "kernel"),
                omit_default=True,
            ),
            DRAW,
        ),
        reference=santapp_reference,
        prepare=santapp_prepare,  # gumbel-topk, mix=0 (else skipped)
        kernel_kind="triton",
        kernel_availability=santapp_kernel_available,
        e2e_backend=_e2e_backend,
        prefill_index=team_index,
        indexed_reference=indexed_reference,
        plot=PlotStyle(),  # its family's green
        # results/h100/santapp-top-2026-12-06-h100
        retired=(("top", "takes no teams exactly besides the M drawn since 2026-12-06 (no "
                  "gain on RULER NIAH at 32k, a slower kernel)"),),
    )
