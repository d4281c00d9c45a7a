"""Decode-attention backends for the end-to-end loop, behind one small interface.

A backend is set up once per decode run (:meth:`DecodeAttention.setup`: workspaces,
plans, compilation by one trial call), may build per-cache state after the prefill
(:meth:`after_prefill`, e.g. a SANTA++ team index), may do host-side work before a
step (:meth:`before_step`: FlashInfer's ``plan()``, never a device sync) and is then
called as ``backend(layer, q)`` inside the step (CUDA-graph capturable when
``graph_safe``): ``q [B, Hq, d]`` -> ``[B, Hq, d]`` over the layer's cache, whose
lengths already count the new token. Outputs may be views of a buffer shared by all
layers: the caller consumes each one before the next call.

Dense (exact) backends: ``sdpa`` (torch SDPA over the whole static cache with a length
mask, the GQA group as query rows: what a plain PyTorch decoder does), ``triton-splitkv``
(the suite's FlashDecoding), ``flashinfer-tc`` / ``flashinfer-cuda`` /
``flashinfer-fa3`` (paged decode, ``plan()`` before each step, as serving engines do;
fa3: FlashInfer's FlashAttention-3 kernel, Hopper only) and ``flash-attn``
(``flash_attn_with_kvcache``). Sampled methods run the Triton kernels of
``santa_kernels.triton_santa`` on a GPU (one workspace shared by all layers; its device
step counter gives fresh numbers per step and layer, graph replays included), SANTA++
the kernel of ``santa_kernels.triton_santapp`` (teams indexed after the prefill), and
Bernoulli qK^T its Triton stage and value kernel, and on a CPU the PyTorch references
of the method registry (a fresh seed per call).
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from santa_bench import baselines
from santa_bench.baselines import Unsupported
from santa_bench.e2e.cache import StaticKVCache
from santa_bench.methods import REGISTRY, Method

# the dense backends are the baselines with a decode backend (santa_bench.baselines'
# registry, which also lists the kernels `santa-bench kernel` times): their names here
# are the registry's, as of import (a plugin's come later: see baselines.decode_names)
DENSE_BACKENDS = tuple(baselines.decode_names())
GPU_AUTO_DENSE = DENSE_BACKENDS
CPU_AUTO_DENSE = ("sdpa",)
SANTAPP_KERNEL_MODULE = "santa_kernels.triton_santapp"
# every registered method with a Triton decode backend (its ``e2e_backend``; see
# :func:`method_backend`)
KERNEL_METHODS = frozenset(m.name for m in REGISTRY if m.has_e2e_kernel)


class DecodeAttention:
    """Base class: a decode-attention backend over a :class:`StaticKVCache`."""

    name = "attention"
    graph_safe = True  # no host sync or host-side state in __call__
    # the kernels around each call launch as programmatic dependents (the gemm rest on a
    # GPU with PDL): a Triton backend may then launch its first kernel as one too and let
    # the next launch early (set by the loop through :meth:`set_pdl_chain`)
    pdl_chain = False

    def set_pdl_chain(self, on: bool) -> None:
        """Tells the backend whether the step's kernels around it form a PDL chain."""
        self.pdl_chain = on

    def setup(self, cache: StaticKVCache, q: torch.Tensor) -> None:
        """Allocates and compiles for ``cache`` and queries shaped like ``q``."""
        self.cache = cache

    def after_prefill(self, cache: StaticKVCache) -> None:
        """Builds per-cache state once the prompt is in the cache (default: nothing)."""

    def reset(self) -> None:
        """Returns random state to its start (a decode run replays exactly)."""

    def before_step(self, lengths: Sequence[int]) -> None:
        """Host-side work before a step whose sequences attend to ``lengths`` tokens."""

    def __call__(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


# ------------------------------------------------------------------ dense
class SdpaDecode(DecodeAttention):
    """torch SDPA over the whole cache capacity with a ``[B, 1, 1, N]`` length mask.

    GQA without expanding K/V: the ``G`` query heads of a KV head are ``G`` query rows.
    A paged cache is gathered to ``[B, N, Hkv, d]`` on every call (SDPA reads no pages).
    """

    name = "sdpa"

    def __init__(self, scale: float) -> None:
        self.scale = scale

    def setup(self, cache: StaticKVCache, q: torch.Tensor) -> None:
        super().setup(cache, q)
        self.positions = torch.arange(cache.capacity, device=cache.device)

    def __call__(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        cache = self.cache
        batch, hq, d = q.shape
        hkv = cache.num_kv_heads
        view = cache.contiguous_view(layer)
        k, v = view if view is not None else cache.gather(layer, cache.capacity)
        valid = self.positions[None, :] < cache.lengths[:, None]
        out = F.scaled_dot_product_attention(
            q.view(batch, hkv, hq // hkv, d),
            k.transpose(1, 2),
            v.transpose(1, 2),
            attn_mask=valid[:, None, None, :],
            scale=self.scale,
        )
        return out.reshape(batch, hq, d)


class TritonSplitKVDecode(DecodeAttention):
    """``santa_kernels.triton_splitkv.splitkv_decode`` (reads each sequence's length)."""

    name = "triton-splitkv"

    def __init__(self, scale: float) -> None:
        self.scale = scale

    def setup(self, cache: StaticKVCache, q: torch.Tensor) -> None:
        super().setup(cache, q)
        try:
            module = importlib.import_module("santa_kernels.triton_splitkv")
        except Exception as exc:
            raise Unsupported(f"triton-splitkv: not importable: {exc}") from exc
        ok, how = module.splitkv_available()
        if not ok or (how == "cuda" and q.device.type != "cuda"):
            raise Unsupported(f"triton-splitkv: {how if not ok else 'runs on CUDA tensors'}")
        self.decode = module.splitkv_decode
        self.workspace = module.SplitKVWorkspace.for_inputs(q, cache.layers[0])
        self.out = torch.empty_like(q)

    def __call__(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        return self.decode(q, self.cache.layers[layer], scale=self.scale, out=self.out,
                           workspace=self.workspace, pdl_chain=self.pdl_chain)


class FlashInferDecode(DecodeAttention):
    """FlashInfer ``BatchDecodeWithPagedKVCacheWrapper`` in CUDA-graph mode.

    The wrapper owns fixed page-index buffers; :meth:`before_step` calls ``plan()`` with
    host tensors (the lengths the step attends to), which copies into them, and the
    captured ``run`` reads them. A contiguous cache is viewed as pages of 16 rows
    (no copy).
    """

    def __init__(self, scale: float, use_tensor_cores: bool, backend: str = "auto") -> None:
        self.scale = scale
        self.backend = backend
        self.use_tensor_cores = use_tensor_cores or backend == "fa3"
        self.name = ("flashinfer-fa3" if backend == "fa3"
                     else "flashinfer-tc" if use_tensor_cores else "flashinfer-cuda")

    def setup(self, cache: StaticKVCache, q: torch.Tensor) -> None:
        super().setup(cache, q)
        from santa_bench.baselines import flashinfer as fi

        ok, why = fi.gpu_available(self.name, q.device, self.backend)
        if not ok:
            raise Unsupported(why)
        if q.dtype not in (torch.float16, torch.bfloat16) or cache.dtype != q.dtype:
            raise Unsupported(f"{self.name}: needs fp16/bf16 q and K/V of one dtype")
        batch, hq, d = q.shape
        if cache.layout == "paged":
            assert cache.page_table is not None
            self.page_size = cache.page_size
            table = cache.page_table
            self.k_pages, self.v_pages = cache.k, cache.v
        else:
            self.page_size = 16
            per_seq = cache.capacity // self.page_size
            table = torch.arange(batch * per_seq, dtype=torch.int32).view(batch, per_seq)
            shape = (batch * per_seq, self.page_size, cache.num_kv_heads, cache.head_dim)
            self.k_pages = [k.view(shape) for k in cache.k]
            self.v_pages = [v.view(shape) for v in cache.v]
        self.table = table.cpu()
        device = q.device
        self.indptr = torch.zeros(batch + 1, dtype=torch.int32, device=device)
        self.indices = torch.zeros(self.table.numel(), dtype=torch.int32, device=device)
        self.last_page_len = torch.zeros(batch, dtype=torch.int32, device=device)
        try:
            self.wrapper = fi.flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                fi.workspace(device), "NHD", use_cuda_graph=True,
                use_tensor_cores=self.use_tensor_cores, backend=self.backend,
                paged_kv_indptr_buffer=self.indptr, paged_kv_indices_buffer=self.indices,
                paged_kv_last_page_len_buffer=self.last_page_len,
            )
        except Exception as exc:
            raise Unsupported(f"{self.name}: {type(exc).__name__}: {exc}") from exc
        self.shape = (hq, cache.num_kv_heads, d, q.dtype)
        self.out = torch.empty_like(q)

    def before_step(self, lengths: Sequence[int]) -> None:
        lengths_t = torch.tensor(list(lengths), dtype=torch.int64)
        pages = (lengths_t + self.page_size - 1) // self.page_size
        indptr = torch.zeros(len(lengths) + 1, dtype=torch.int32)
        indptr[1:] = torch.cumsum(pages, 0).to(torch.int32)
        used = torch.arange(self.table.shape[1])[None, :] < pages[:, None]
        indices = self.table[used].to(torch.int32)
        last = (lengths_t - (pages - 1) * self.page_size).to(torch.int32)
        hq, hkv, d, dtype = self.shape
        self.wrapper.plan(indptr, indices, last, hq, hkv, d, self.page_size,
                          pos_encoding_mode="NONE", q_data_type=dtype, kv_data_type=dtype,
                          sm_scale=self.scale)

    def __call__(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        return self.wrapper.run(q, (self.k_pages[layer], self.v_pages[layer]), out=self.out)


class FlashAttnDecode(DecodeAttention):
    """``flash_attn_with_kvcache`` with ``cache_seqlens`` = the cache's device lengths."""

    name = "flash-attn"

    def __init__(self, scale: float) -> None:
        self.scale = scale

    def setup(self, cache: StaticKVCache, q: torch.Tensor) -> None:
        super().setup(cache, q)
        from santa_bench.baselines import flash_attn as fa

        if not fa.HAS_FLASH_ATTN:
            raise Unsupported(f"flash-attn: {fa.REASON}")
        if q.device.type != "cuda":
            raise Unsupported("flash-attn: needs CUDA")
        if cache.layout == "paged" and cache.page_size % fa.FA2_PAGE_MULTIPLE:
            raise Unsupported(f"flash-attn: pages must be a multiple of "
                              f"{fa.FA2_PAGE_MULTIPLE} rows, got {cache.page_size}")
        self.attend = fa.flash_attn_with_kvcache

    def __call__(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        cache = self.cache
        out = self.attend(q[:, None], cache.k[layer], cache.v[layer],
                          cache_seqlens=cache.lengths, block_table=cache.page_table,
                          softmax_scale=self.scale, causal=False, num_splits=0)
        return out[:, 0]


def dense_backend(name: str, scale: float) -> DecodeAttention:
    """Returns the dense backend ``name``: the decode backend of that baseline of
    :data:`santa_bench.baselines.BASELINES`."""
    entry = baselines.BASELINES.get(name)
    if entry is None or entry.decode is None:
        known = ", ".join(baselines.decode_names())
        raise ValueError(f"unknown dense backend {name!r}; known: {known}")
    return entry.decode_backend(scale)


# ------------------------------------------------------------------ sampled
def _require_santa_kernels(params: dict[str, Any]) -> None:
    """Unsupported unless the Triton SANTA kernels run here and ``params`` ask nothing
    they lack (``min_ctx``)."""
    from santa_bench.methods.santa import santa_kernel_available

    ok, why = santa_kernel_available()
    if not ok:
        raise Unsupported(why)
    if params.get("min_ctx"):
        raise Unsupported("the Triton kernels do not implement min_ctx")


class TritonSampledDecode(DecodeAttention):
    """A SANTA-family Triton kernel, the one the kernel harness times for the method
    (:func:`santa_bench.methods.santa.santa_kernel` of ``function``, by default the one
    named like the method: santa-prop -> santa_prop); one workspace serves every layer."""

    def __init__(self, method: Method, params: dict[str, Any], scale: float, seed: int,
                 function: str | None = None) -> None:
        self.method, self.params, self.scale, self.seed = method, dict(params), scale, seed
        self.function = function or method.name.replace("-", "_")
        self.name = "triton"

    def setup(self, cache: StaticKVCache, q: torch.Tensor) -> None:
        super().setup(cache, q)
        from santa_bench.methods.santa import STASH_DTYPES, kernel_function, santa_kernel

        _require_santa_kernels(self.params)
        self.S = int(self.params["S"])
        tile = int(self.params.get("tile", 64))
        self.kwargs: dict[str, Any] = {"tile": tile, "scale": self.scale}
        flash = self.function == "santa_flash"
        # the global-CDF samplers join the loop's PDL chain (flash has no entry wait)
        self.chains = not flash
        stash = STASH_DTYPES[self.params.get("stash", "fp32")]
        if not flash:
            self.kwargs["stash_dtype"] = stash
        if "alloc" in self.params:
            self.kwargs["alloc"] = self.params["alloc"]
        try:
            self.kernel, self.workspace = santa_kernel(self.function, q, cache.layers[0],
                                                       self.S, tile, seed=self.seed,
                                                       stash_dtype=stash)
        except ValueError as exc:
            raise Unsupported(f"{self.method.name}: {exc}") from exc
        self.kwargs["workspace"] = self.workspace
        # the kernel that runs, named as the kernel harness's rows name it
        self.kernel_function = kernel_function(self.kernel)

    def reset(self) -> None:
        self.workspace.reset_rng(0)

    def __call__(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        chain = {"pdl_chain": self.pdl_chain} if self.chains else {}
        return self.kernel(q, self.cache.layers[layer], self.S, **self.kwargs, **chain)[0]


class ReferenceDecode(DecodeAttention):
    """The method's exact PyTorch reference (CPU runs).

    Without ``row_seeds`` the batch is one call with a fresh seed per call. With
    ``row_seeds`` each sequence is its own call: call ``c`` (one per layer and step) of
    sequence ``b`` uses ``seed + row_seeds[b] + 1_000_003 * c``, so a sequence decodes
    alike in any batch. A method with a ``prefill_index`` (SANTA++: its teams) indexes
    each layer's prompt once after the prefill and runs its ``indexed_reference``;
    decode tokens stay exact. Where the method also has ``stack_indexes`` (its randomness
    is all in the per-sequence indexes), one call per layer and step serves the whole
    batch. ``reads`` collects every call's KV read fraction, one per sequence.
    """

    graph_safe = False

    def __init__(self, method: Method, params: dict[str, Any], scale: float, seed: int,
                 row_seeds: Sequence[int] | None = None) -> None:
        self.method, self.params, self.scale, self.seed = method, dict(params), scale, seed
        self.row_seeds = None if row_seeds is None else list(row_seeds)
        self.name = "reference"
        self.calls = 0
        self.indexes: list[Any] = []  # per layer: one index, or one per sequence
        self.stacked = False  # one index per layer over the batch's sequences
        self.reads: list[float] = []

    def _rows(self, layer: int) -> list[tuple[Any, int]]:
        """``(kv, seed offset)`` per call unit: the batch, or each sequence."""
        if self.row_seeds is None:
            return [(self.cache.layers[layer], 0)]
        from santa_kernels import KVCache

        k, v = self.cache.k[layer], self.cache.v[layer]
        return [(KVCache.contiguous(k[b : b + 1, :n], v[b : b + 1, :n]), self.row_seeds[b])
                for b, n in enumerate(self.cache.lengths.tolist())]

    def after_prefill(self, cache: StaticKVCache) -> None:
        build = self.method.prefill_index
        if build is None:
            return
        stack = self.method.stack_indexes if self.row_seeds is not None else None
        self.stacked = stack is not None
        self.indexes = []
        for layer in range(cache.num_layers):
            indexes = [build(kv, self.params, self.seed + offset)
                       for kv, offset in self._rows(layer)]
            self.indexes.append([stack(indexes)] if stack is not None else indexes)

    def reset(self) -> None:
        self.calls = 0
        self.reads = []

    def __call__(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        call = self.calls
        self.calls += 1
        if self.stacked:
            assert self.method.indexed_reference is not None
            result = self.method.indexed_reference(q, self.cache.layers[layer],
                                                   self.indexes[layer][0], self.params,
                                                   scale=self.scale, seed=self.seed + call)
            self.reads.extend(_per_sequence_fractions(result.reads))
            return result.out.to(q.dtype)
        units = self._rows(layer)
        queries = [q] if self.row_seeds is None else list(q.split(1))
        outs = []
        for unit, ((kv, offset), qu) in enumerate(zip(units, queries, strict=True)):
            seed = (self.seed + call if self.row_seeds is None
                    else self.seed + offset + 1_000_003 * call)
            if self.method.prefill_index is not None:
                assert self.method.indexed_reference is not None
                result = self.method.indexed_reference(qu, kv, self.indexes[layer][unit],
                                                       self.params, scale=self.scale,
                                                       seed=seed)
            else:
                result = self.method.run_reference(qu, kv, self.params, seed=seed,
                                                   scale=self.scale)
            if getattr(result, "reads", None) is not None:
                self.reads.append(float(result.reads.kv_read_fraction))
            outs.append(result.out.to(q.dtype))
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=0)


def _per_sequence_fractions(reads: Any) -> list[float]:
    """Each sequence's KV read fraction of a batched call's read counts."""
    d, hkv = reads.head_dim, reads.k_rows.shape[1]
    read = reads.k_features.sum(dim=1) + reads.v_rows.sum(dim=1) * d
    return (read / (2 * reads.context * hkv * d)).tolist()


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
        super().setup(cache, q)
        from santa_bench.methods.santapp import santapp_kernel_available

        ok, why = santapp_kernel_available()
        if not ok:
            raise Unsupported(why)
        self.module = importlib.import_module(SANTAPP_KERNEL_MODULE)
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
        from santa_bench.methods.santapp import merge_atomic_of

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
                                        merge_atomic=merge_atomic_of(p.get("merge", "auto")))
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


class TritonBernoulliDecode(DecodeAttention):
    """Bernoulli qK^T with its value stage (``santa_kernels.triton_bernoulli``); one
    prepared call (its workspaces, its device step counters) serves every layer."""

    def __init__(self, params: dict[str, Any], scale: float, seed: int) -> None:
        self.params, self.scale, self.seed = dict(params), scale, seed
        self.name = "triton"

    def setup(self, cache: StaticKVCache, q: torch.Tensor) -> None:
        super().setup(cache, q)
        from santa_bench.methods.bernoulli import STASH_DTYPES

        _require_santa_kernels(self.params)
        module = importlib.import_module("santa_kernels.triton_bernoulli")
        p = self.params
        try:
            self.call = module.BernoulliDecode(
                q, cache.layers[0], draws=p["draws"], grouping=p["grouping"],
                value_stage=p["value_stage"], S=p["S"], tile=p["tile"], alloc=p["alloc"],
                scale=self.scale, seed=self.seed,
                stash_dtype=STASH_DTYPES[p.get("stash") or "fp16"])
        except ValueError as exc:
            raise Unsupported(f"bernoulli: {exc}") from exc

    def reset(self) -> None:
        self.call.reset_rng(0)

    def __call__(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        return self.call(q, self.cache.layers[layer])


def method_backend(
    method: Method, params: dict[str, Any], *, device: str, scale: float, seed: int
) -> DecodeAttention:
    """Returns the backend of a sampled method: its kernel on a GPU (the method's
    ``e2e_backend``), its reference on a CPU."""
    if device != "cuda":
        return ReferenceDecode(method, params, scale, seed)
    backend = method.e2e_backend(method, params, scale, seed) if method.e2e_backend else None
    if backend is None:
        raise Unsupported(f"{method.name}: no GPU kernel for end-to-end decode (reference only)")
    return backend


def backend_label(method: Method, device: str) -> str:
    """Returns the ``backend`` recorded for a sampled method on ``device``: its Triton
    kernel on a GPU, else its PyTorch reference (a GPU run of that is skipped)."""
    return "triton" if device == "cuda" and method.has_e2e_kernel else "reference"


class LayerRouting(DecodeAttention):
    """Routes each layer to the method's backend, or to an exact one for ``exempt`` layers."""

    def __init__(
        self, main: DecodeAttention, exempt: DecodeAttention | None = None,
        exempt_layers: Sequence[int] = (),
    ) -> None:
        self.main, self.exempt = main, exempt
        self.exempt_layers = frozenset(exempt_layers)
        if self.exempt_layers and exempt is None:
            raise ValueError("exempt layers need an exact backend")
        self.backends = [main] + ([exempt] if exempt is not None and self.exempt_layers else [])
        self.graph_safe = all(b.graph_safe for b in self.backends)
        self.name = main.name

    def setup(self, cache: StaticKVCache, q: torch.Tensor) -> None:
        for backend in self.backends:
            backend.setup(cache, q)

    def after_prefill(self, cache: StaticKVCache) -> None:
        for backend in self.backends:
            backend.after_prefill(cache)

    def reset(self) -> None:
        for backend in self.backends:
            backend.reset()

    def before_step(self, lengths: Sequence[int]) -> None:
        for backend in self.backends:
            backend.before_step(lengths)

    def set_pdl_chain(self, on: bool) -> None:
        super().set_pdl_chain(on)
        for backend in self.backends:
            backend.set_pdl_chain(on)

    def __call__(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        if layer in self.exempt_layers:
            assert self.exempt is not None
            return self.exempt(layer, q)
        return self.main(layer, q)
