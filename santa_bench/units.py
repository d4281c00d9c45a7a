"""Parsing of CLI and suite values: sizes like ``32k`` and comma lists."""

from __future__ import annotations

import re

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmM]?)\s*$")
_MULTIPLIER = {"": 1, "k": 1024, "m": 1024 * 1024}


def parse_size(text: str | int) -> int:
    """Returns the integer for ``4k`` (4096), ``1m`` (1048576) or a plain integer."""
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        match = _SIZE.match(str(text))
        if not match:
            raise ValueError(f"not a size: {text!r} (use e.g. 4096, 4k, 32k, 1m)")
        number, suffix = match.groups()
        scaled = float(number) * _MULTIPLIER[suffix.lower()]
        if scaled != int(scaled):
            raise ValueError(f"not a whole number of tokens: {text!r}")
        value = int(scaled)
    if value <= 0:
        raise ValueError(f"size must be > 0, got {text!r}")
    return value


def parse_list(text: str | None, parse=str) -> list:
    """Splits a comma list (``"1,8"``) and parses each item; empty or None gives []."""
    if text is None:
        return []
    return [parse(item.strip()) for item in str(text).split(",") if item.strip()]


def parse_size_list(text: str) -> list[int]:
    """Returns the sizes of a comma list such as ``"8k,32k"``."""
    return parse_list(text, parse_size)


def format_size(tokens: int) -> str:
    """Returns ``32k`` for 32768, the plain number otherwise."""
    for suffix, mult in (("m", 1024 * 1024), ("k", 1024)):
        if tokens % mult == 0:
            return f"{tokens // mult}{suffix}"
    return str(tokens)


def parse_shapes(text: str) -> list[tuple[int, int]]:
    """Returns ``[(batch, ctx), ...]`` for a comma list such as ``"1x32k,8x32k"``."""
    shapes = []
    for item in parse_list(text):
        batch, sep, ctx = item.partition("x")
        if not sep or not batch.isdigit() or int(batch) < 1:
            raise ValueError(f"expected BATCHxCTX (e.g. 1x32k), got {item!r}")
        shapes.append((int(batch), parse_size(ctx)))
    if not shapes:
        raise ValueError("no shape given (e.g. 1x32k,8x32k)")
    return shapes
