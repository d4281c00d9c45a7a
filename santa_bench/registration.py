"""The ``@register`` decorator both registries share (methods, tasks): a leaf."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any


def registering(kind: type, default: Any, error: type[Exception],
                target: Callable[[], Any] | None, registry: Any | None) -> Any:
    """Decorator body: calls the builder, which returns one ``kind`` or several, and
    registers each in ``registry`` (default: ``default``) with ``module`` set to the
    builder's module (``error`` for anything else it returns). Returns the builder
    unchanged, so it can register into another registry too."""

    def apply(build: Callable[[], Any]) -> Any:
        made = build()
        items = [made] if isinstance(made, kind) else list(made)
        into = default if registry is None else registry
        for item in items:
            if not isinstance(item, kind):
                raise error(f"{build.__qualname__}: returned {item!r}, not a {kind.__name__}")
            into.register(item if item.module else replace(item, module=build.__module__))
        return build

    return apply(target) if target is not None else apply
