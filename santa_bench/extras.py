"""The packages of an extra that a command needs, checked before it starts (a leaf but for
the console)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
from collections.abc import Iterable

from rich.console import Console

from santa_bench.console import fail

ACCURACY_INSTALL = "pip install -e '.[accuracy]'"


def _installed(module: str, minimum: tuple[int, ...] = ()) -> bool:
    if importlib.util.find_spec(module) is None:
        return False
    if not minimum:
        return True
    try:
        version = importlib.metadata.version(module)
    except importlib.metadata.PackageNotFoundError:
        return True  # importable but not installed as a distribution: trust it
    numbers = tuple(int(p) for p in version.split(".")[: len(minimum)] if p.isdigit())
    return numbers >= minimum


def _needs_gguf(model: str) -> bool:
    from santa_bench.accuracy.models import CATALOG

    return model in CATALOG or model.endswith(".gguf")


def missing_model_packages(models: Iterable[str]) -> list[str]:
    """The packages of the ``accuracy`` extra that loading ``models`` needs and that are
    not importable here (transformers always; gguf >= 0.10 for catalog/GGUF models)."""
    models = list(models)
    missing = [name for name in ("torch", "transformers") if not _installed(name)]
    if any(_needs_gguf(m) for m in models) and not _installed("gguf", (0, 10)):
        missing.append("gguf>=0.10")
    return missing


def require_model_packages(console: Console, models: Iterable[str]) -> None:
    """Exits (code 2) with the install line when a model of ``models`` could not load."""
    models = list(models)
    if models and (missing := missing_model_packages(models)):
        fail(console, f"loading a model needs {', '.join(missing)}: {ACCURACY_INSTALL}")
