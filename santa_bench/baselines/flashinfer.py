"""FlashInfer paged batch decode (``BatchDecodeWithPagedKVCacheWrapper``), three paths.

``flashinfer-tc`` builds the wrapper with ``use_tensor_cores=True`` (the prefill-style
FlashAttention-2 kernel, faster for large GQA groups), ``flashinfer-cuda`` with ``False``
(the CUDA-core decode kernel), ``flashinfer-fa3`` with ``use_tensor_cores=True,
backend="fa3"``: FlashInfer's FlashAttention-3 kernel (sm90 only), run with one query
row per sequence. Its sm90 scheduler (``PrefillSM90Plan`` in FlashInfer 0.6.6) splits
work by (sequence, query head, query tile) only: no split over the context and no
packing of a GQA group into one tile, so each query head of a decode step reads its
whole context in one CTA. All use ``kv_layout="NHD"``: K and V pages are
``[num_pages, page_size, Hkv, d]``, passed to ``run`` as a ``(k_pages, v_pages)`` tuple.
A contiguous cache, or a paged one of another page size, is re-paged once outside the
timed region (``notes["kv_conversion"]``). ``plan()`` runs in ``prepare``; the wrapper
is built with ``use_cuda_graph=False``: its plan buffers stay fixed after the single
``plan()``, so ``run`` can be captured in a CUDA graph as is. One 128 MB zeroed float
workspace per device is allocated once per process and shared by every wrapper (calls
run one after another on one stream, so their split-KV scratch never overlaps).
"""

from __future__ import annotations

from typing import Any

import torch

from santa_bench.baselines import (
    Prepared,
    Unsupported,
    check_half_precision_backend,
    trial_run,
)
from santa_bench.timing import nbytes_of
from santa_kernels.kv import KVCache
from santa_kernels.validate import check_scale

try:
    import flashinfer

    HAS_FLASHINFER = True
    REASON = ""
    VERSION: str | None = getattr(flashinfer, "__version__", None)
except Exception as exc:  # not installed, or a broken install
    flashinfer = None
    HAS_FLASHINFER = False
    REASON = f"flashinfer not installed ({type(exc).__name__}: {exc})"
    VERSION = None

WORKSPACE_BYTES = 128 * 1024 * 1024
_WORKSPACES: dict[torch.device, torch.Tensor] = {}


def workspace(device: torch.device) -> torch.Tensor:
    """Returns this process's zeroed 128 MB float workspace on ``device``."""
    key = torch.device(device.type, device.index if device.index is not None else 0)
    if key not in _WORKSPACES:
        _WORKSPACES[key] = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=key)
    return _WORKSPACES[key]


def page_metadata(
    kv: KVCache,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Returns FlashInfer's ``(indptr [B+1], indices [total_pages], last_page_len [B])``.

    All int32 on the cache's device: sequence ``b`` uses pages
    ``indices[indptr[b]:indptr[b+1]]`` and ``last_page_len[b]`` (1..page_size) slots of
    its last page.
    """
    if kv.layout != "paged" or kv.page_table is None:
        raise ValueError("kv: page_metadata needs a paged cache")
    page_size = kv.page_size
    lengths = kv.lengths.to(torch.int64)
    pages = (lengths + page_size - 1) // page_size
    indptr = torch.zeros(kv.batch + 1, dtype=torch.int32, device=kv.device)
    indptr[1:] = torch.cumsum(pages, dim=0).to(torch.int32)
    table = kv.page_table.to(kv.device)
    used = torch.arange(table.shape[1], device=kv.device)[None, :] < pages[:, None]
    indices = table[used].to(torch.int32).contiguous()  # row-major: sequence by sequence
    last_page_len = (lengths - (pages - 1) * page_size).to(torch.int32)
    return indptr, indices, last_page_len


FA3_MIN_CUDA = (12, 3)  # FlashInfer's sm90a kernels need CUDA >= 12.3


def fa3_support(capability: tuple[int, int], cuda_version: str | None) -> tuple[bool, str]:
    """Returns whether FlashInfer's FA3 kernels run on a GPU of compute ``capability``
    under torch's CUDA ``cuda_version``, with the reason if not (FlashInfer's own test)."""
    major, minor = capability
    if major != 9:
        return False, f"needs a Hopper GPU (sm90), this one is sm{major}{minor}"
    try:
        found = tuple(int(part) for part in (cuda_version or "").split(".")[:2])
    except ValueError:
        found = ()
    if len(found) < 2 or found < FA3_MIN_CUDA:
        return False, f"needs CUDA >= 12.3 for sm90a kernels, torch has {cuda_version}"
    return True, ""


def gpu_available(name: str, device: torch.device, backend: str) -> tuple[bool, str]:
    """Returns whether the FlashInfer path ``backend`` (auto or fa3) runs on ``device``."""
    if not HAS_FLASHINFER:
        return False, f"{name}: {REASON}"
    if device.type != "cuda" or not torch.cuda.is_available():
        return False, f"{name}: needs CUDA"
    if backend == "fa3":
        ok, why = fa3_support(torch.cuda.get_device_capability(device), torch.version.cuda)
        if not ok:
            return False, f"{name}: {why}"
    return True, ""


class FlashInferDecode:
    """One path of ``BatchDecodeWithPagedKVCacheWrapper``: its ``use_tensor_cores`` and
    ``backend`` (``auto``: FA2 for bf16/fp16; ``fa3``: tensor cores on sm90)."""

    def __init__(self, use_tensor_cores: bool, backend: str = "auto") -> None:
        self.backend = backend
        self.use_tensor_cores = use_tensor_cores or backend == "fa3"
        self.name = (
            "flashinfer-fa3" if backend == "fa3"
            else "flashinfer-tc" if use_tensor_cores else "flashinfer-cuda"
        )

    def available(self, device: torch.device) -> tuple[bool, str]:
        """Returns whether FlashInfer is installed and ``device`` a CUDA GPU (fa3: sm90)."""
        return gpu_available(self.name, device, self.backend)

    def prepare(
        self, q: torch.Tensor, kv: KVCache, *, scale: float | None = None, page_size: int = 16
    ) -> Prepared:
        """Returns ``wrapper.run(q, (k_pages, v_pages), out=out)`` after ``plan()``."""
        check_half_precision_backend(self, self.name, q, kv)
        if page_size < 1:
            raise ValueError(f"page_size: must be >= 1, got {page_size}")
        tau = check_scale(scale, kv.head_dim)
        notes: dict[str, Any] = {"page_size": page_size, "flashinfer_version": VERSION,
                                 "flashinfer_backend": self.backend}
        if kv.layout != "paged" or kv.page_size != page_size:
            notes["kv_conversion"] = (
                f"{kv.layout}{f'({kv.page_size})' if kv.layout == 'paged' else ''} -> "
                f"paged({page_size}) NHD (outside timing)"
            )
            kv = kv.to_paged(page_size)
        indptr, indices, last_page_len = page_metadata(kv)
        batch, num_qo_heads, head_dim = q.shape
        try:  # plan() JIT-compiles the kernels on first use of a variant
            wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                workspace(q.device), "NHD", use_tensor_cores=self.use_tensor_cores,
                backend=self.backend,
            )
            wrapper.plan(
                indptr,
                indices,
                last_page_len,
                num_qo_heads,
                kv.num_kv_heads,
                head_dim,
                page_size,
                pos_encoding_mode="NONE",
                q_data_type=q.dtype,
                kv_data_type=kv.dtype,
                sm_scale=tau,
            )
        except Exception as exc:
            raise Unsupported(f"{self.name}: {type(exc).__name__}: {exc}") from exc
        k_pages, v_pages = kv.k, kv.v
        out = torch.empty(batch, num_qo_heads, head_dim, dtype=q.dtype, device=q.device)

        def run() -> torch.Tensor:
            return wrapper.run(q, (k_pages, v_pages), out=out)

        trial_run(run, q, self.name)  # surfaces unsupported shapes
        # bytes a call reads: the pages it uses (not the pool's unused pages), q, metadata
        pages_read = int(indices.numel())
        page_bytes = 2 * page_size * kv.num_kv_heads * head_dim * kv.k.element_size()
        inputs_bytes = pages_read * page_bytes + nbytes_of(q, indptr, indices, last_page_len)
        return Prepared(run, inputs_bytes, notes)


TENSOR_CORE = FlashInferDecode(use_tensor_cores=True)
CUDA_CORE = FlashInferDecode(use_tensor_cores=False)
FA3 = FlashInferDecode(use_tensor_cores=True, backend="fa3")
