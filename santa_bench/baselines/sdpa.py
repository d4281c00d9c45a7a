"""PyTorch ``scaled_dot_product_attention`` baselines: math, flash (FA2) and cuDNN.

The query is ``[B, Hq, 1, d]`` and K/V ``[B, Hkv, N, d]`` (contiguous, made once in
``prepare``), with ``enable_gqa=True`` so no backend is handed expanded K/V. A paged
cache is gathered to that contiguous layout once, outside the timed region
(``notes["kv_conversion"]``). Sequences of different lengths need a boolean mask
``[B, 1, 1, Nmax]``: it costs ``B * Nmax`` bytes more to read plus the work on the
padding up to ``Nmax``, and the flash backend refuses masks, so ``sdpa-flash`` is then
unsupported. Equal lengths use no mask (K/V cut to the common length).
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from santa_bench.baselines import Prepared, Unsupported, check_decode_inputs
from santa_bench.timing import nbytes_of
from santa_kernels.kv import KVCache
from santa_kernels.validate import check_scale


def _min_sm80(device: torch.device) -> tuple[bool, str]:
    major, minor = torch.cuda.get_device_capability(device)
    if major < 8:
        return False, f"needs compute capability >= 8.0, got {major}.{minor}"
    return True, ""


class SdpaBackend:
    """One SDPA backend forced with ``torch.nn.attention.sdpa_kernel``."""

    def __init__(self, backend: SDPBackend, label: str, cuda_only: bool) -> None:
        self.backend = backend
        self.label = label
        self.cuda_only = cuda_only

    def available(self, device: torch.device) -> tuple[bool, str]:
        """Returns whether this backend can run on ``device`` (shapes are checked in prepare)."""
        if not self.cuda_only:
            return True, ""
        if device.type != "cuda" or not torch.cuda.is_available():
            return False, f"sdpa-{self.label}: needs CUDA"
        if self.backend == SDPBackend.FLASH_ATTENTION and not (
            torch.backends.cuda.is_flash_attention_available()
        ):
            return False, "sdpa-flash: this torch build has no flash attention"
        if self.backend == SDPBackend.CUDNN_ATTENTION and not torch.backends.cudnn.is_available():
            return False, "sdpa-cudnn: cuDNN is not available in this torch build"
        ok, why = _min_sm80(device)
        return (ok, f"sdpa-{self.label}: {why}" if why else "")

    def prepare(self, q: torch.Tensor, kv: KVCache, *, scale: float | None = None) -> Prepared:
        """Returns the SDPA call on contiguous ``[B, Hkv, N, d]`` K/V built here."""
        check_decode_inputs(q, kv)
        tau = check_scale(scale, kv.head_dim)
        notes: dict[str, object] = {"resolved_backend": f"sdpa-{self.label}"}
        equal_lengths = bool((kv.lengths == kv.max_len).all())
        if kv.layout == "contiguous" and equal_lengths:
            keys, values = kv.k[:, : kv.max_len], kv.v[:, : kv.max_len]
            mask = None
        else:
            keys, values, valid = kv.padded()
            mask = None if equal_lengths else valid[:, None, None, :]
            if kv.layout == "paged":
                notes["kv_conversion"] = "paged -> contiguous [B, Hkv, N, d] (outside timing)"
        keys = keys.transpose(1, 2).contiguous()
        values = values.transpose(1, 2).contiguous()
        query = q.unsqueeze(2)
        notes["mask"] = mask is not None
        backend = self.backend

        def run() -> torch.Tensor:
            with sdpa_kernel(backend):
                out = F.scaled_dot_product_attention(
                    query, keys, values, attn_mask=mask, scale=tau, enable_gqa=True
                )
            return out.squeeze(2)

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                run()
                if q.is_cuda:
                    torch.cuda.synchronize(q.device)
            except RuntimeError as exc:
                hints = "; ".join(str(w.message) for w in caught)[:500]
                detail = f" ({hints})" if hints else ""
                raise Unsupported(
                    f"sdpa-{self.label}: backend rejected these inputs "
                    f"(dtype {q.dtype}, mask {mask is not None}): {exc}{detail}"
                ) from exc
        return Prepared(run, nbytes_of(query, keys, values, mask), notes)


MATH = SdpaBackend(SDPBackend.MATH, "math", cuda_only=False)
FLASH = SdpaBackend(SDPBackend.FLASH_ATTENTION, "flash", cuda_only=True)
CUDNN = SdpaBackend(SDPBackend.CUDNN_ATTENTION, "cudnn", cuda_only=True)
