"""The one rule for ``--device auto|cpu|cuda`` (a leaf: imports nothing of santa_bench)."""

from __future__ import annotations

from santa_kernels.validate import InputError

DEVICES = ("auto", "cpu", "cuda")
DEVICE_HELP = "auto (GPU when present), cpu or cuda."


def resolve_device(requested: str | None = "auto", *, option: str = "--device",
                   visible: bool = True) -> str:
    """Returns ``cuda`` or ``cpu`` for ``auto|cpu|cuda`` (any case; None = auto): auto is
    CUDA when a device is visible. ``visible``: ``cuda`` needs a visible device (else, as
    for an unknown name, an :class:`InputError`, a ValueError, naming ``option``)."""
    import torch

    choice = (requested or "auto").lower()
    if choice not in DEVICES:
        raise InputError(f"{option}: expected auto, cpu or cuda, got {requested!r}")
    if choice == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if choice == "cuda" and visible and not torch.cuda.is_available():
        raise InputError(f"{option} cuda: no CUDA device is visible (use {option} cpu)")
    return choice
