"""Input checks shared by every method; each error names the offending argument."""

from __future__ import annotations

import torch

STORAGE_DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float64)


class InputError(ValueError):
    """Raised for invalid method input; the message starts with the argument's name."""


def check_storage_dtype(t: torch.Tensor, name: str) -> None:
    """Raises unless ``t`` is stored in a supported floating dtype."""
    if t.dtype not in STORAGE_DTYPES:
        allowed = ", ".join(str(d).removeprefix("torch.") for d in STORAGE_DTYPES)
        raise InputError(f"{name}: unsupported dtype {t.dtype}; expected one of {allowed}")


def check_finite(t: torch.Tensor, name: str) -> None:
    """Raises if ``t`` holds NaN or +-inf."""
    if not bool(torch.isfinite(t).all()):
        raise InputError(f"{name}: contains NaN or inf")


def check_query(q: torch.Tensor, batch: int, num_kv_heads: int, head_dim: int) -> int:
    """Checks ``q`` is ``[B, Hq, d]`` against the cache; returns the GQA group size."""
    if not isinstance(q, torch.Tensor):
        raise InputError(f"q: expected a torch.Tensor, got {type(q).__name__}")
    if q.dim() != 3:
        raise InputError(f"q: expected shape [B, Hq, d], got {tuple(q.shape)}")
    check_storage_dtype(q, "q")
    b, hq, d = q.shape
    if b != batch:
        raise InputError(f"q: batch {b} does not match the KV cache batch {batch}")
    if d != head_dim:
        raise InputError(f"q: head dim {d} does not match the KV cache head dim {head_dim}")
    if hq % num_kv_heads != 0:
        raise InputError(f"q: {hq} query heads is not a multiple of the {num_kv_heads} KV heads")
    check_finite(q, "q")
    return hq // num_kv_heads


def check_positive_int(value: int, name: str) -> int:
    """Returns ``value`` if it is an int > 0, else raises naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(f"{name}: expected an integer, got {value!r}")
    if value <= 0:
        raise InputError(f"{name}: must be > 0, got {value}")
    return value


def check_scale(scale: float | None, head_dim: int) -> float:
    """Returns the softmax scale (``1/sqrt(d)`` by default)."""
    if scale is None:
        return head_dim**-0.5
    if not (isinstance(scale, (int, float)) and scale > 0 and scale == scale):
        raise InputError(f"scale: must be a positive number, got {scale!r}")
    return float(scale)
