"""How a configuration is named, in one place: the parameters a row's configuration names
(:func:`config_params`), its method spec (:func:`config_key`, :func:`layered_key`) and its
label in tables, summaries and figures (:func:`config_label`). Imports only the registry.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable, Mapping
from typing import Any

import pandas as pd

from santa_bench.methods import REGISTRY, MethodError

# santa-flash's retired kernel options, which rows stored before its one kernel carry:
# they label a kernel, not the estimator (kept out of the key)
NOT_CONFIG = {"gather", "passes", "pairs"}
# budgets: named in the key even at their defaults (santa-prop:S=128, quest:pages=64)
BUDGETS = {"S", "M", "k", "pages"}
DENSE_LAYERS = " dense_layers="  # joins a configuration key and the layers it kept dense
# string parameters stored only away from their defaults (merge: relabelled where its
# default changed; gather: santa-flash's kernel in rows stored before it had one): named
# from the row's own text in a table label so that variants of one method stay apart
TEXT_PARAMS = ("reps", "merge", "gather")
# a table label's head: (parameter, short name, named even at its default)
TABLE_HEAD = (("S", "S", True), ("M", "M", True), ("team_size", "P", True),
              ("passes", "passes", True), ("tile", "tile", False))

Row = Mapping[str, Any]


def present(value: Any) -> bool:
    """True for a stored value (not None, NaN, NA or the empty string)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return False
    return not (pd.api.types.is_scalar(value) and pd.isna(value)) and value != ""


def param_text(value: Any) -> str:
    """``32`` for 32.0; other values as ``str``."""
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def config_params(row: Row) -> list[tuple[str, str]] | None:
    """``[("M", "32"), ("policy", "kmeans")]``: the parameters a row's configuration names,
    in the method's order (budgets always, the rest away from their defaults, so a row
    that omits one and a row that records its default name the same ones). None for a
    method the registry does not hold."""
    try:
        method = REGISTRY.get(str(row["method"]))
    except MethodError:
        return None
    named = []
    for param in method.params:
        if param.name in NOT_CONFIG:
            continue
        value = row.get(param.name)
        if not present(value):
            if param.absent is None:
                continue
            value = param.absent  # stored before the default changed
        with contextlib.suppress(MethodError, ValueError, TypeError):
            value = param.validate(value, method.name)
        if param.name in BUDGETS or value != param.default:
            named.append((param.name, param_text(value)))
    return named


def config_key(row: Row) -> str | None:
    """The configuration a row measured, as a method spec: ``santa-prop:S=128``,
    ``santapp:M=32,sink=4,window=64``, ``dense`` (:func:`config_params`). None for a
    method the registry does not hold."""
    named = config_params(row)
    if named is None:
        return None
    parts = ",".join(f"{name}={text}" for name, text in named)
    return REGISTRY.get(str(row["method"])).name + (":" + parts if parts else "")


def dense_layers_of(row: Row) -> tuple[int, ...]:
    """The layers an accuracy row kept exact (``--dense-layers``, parsed by the runner
    before the row was written), sorted; () for none."""
    value = row.get("dense_layers")
    if not present(value):
        return ()
    return tuple(sorted({int(x) for x in str(value).split(",") if x.strip()}))


def layered_key(row: Row) -> str | None:
    """:func:`config_key`, with ``dense_layers=0,1`` appended where the row kept layers
    exact: such a run's decode step mixes dense and sampled layers."""
    key = config_key(row)
    layers = dense_layers_of(row)
    if key is None or not layers or key == "dense":  # dense with dense layers is dense
        return key
    return key + DENSE_LAYERS + ",".join(map(str, layers))


def config_label(
    row: Row,
    *,
    head: Iterable[tuple[str, str, bool]] = (),
    skip: Iterable[str] = (),
    text_params: Iterable[str] = (),
    method: bool = True,
    rest: bool = True,
    sep: str = " ",
) -> str:
    """A configuration's label: ``santapp M=32 P=16 policy=kmeans``.

    The method's name (unless ``method`` is False), then ``head``'s parameters in that
    order under their short names (those marked True whenever the row holds them, the
    others away from their defaults), then (unless ``rest`` is False) the rest of
    :func:`config_params` that neither ``head`` nor ``skip`` names, then the
    ``text_params`` the row holds as text; joined by ``sep``. The tables use
    ``TABLE_HEAD`` and ``TEXT_PARAMS``, a figure's series its varying parameters alone;
    a key is :func:`config_key`.
    """
    head = tuple(head)
    named = dict(config_params(row) or []) if rest or any(not a for _, _, a in head) else {}
    parts = [str(row["method"])] if method else []
    for key, short, always in head:
        value = row.get(key)
        if present(value) and (always or key in named):
            parts.append(f"{short}={param_text(value)}")
    text_params = tuple(text_params)
    left_out = {key for key, _, _ in head} | set(skip) | set(text_params)
    if rest:
        parts += [f"{key}={text}" for key, text in named.items() if key not in left_out]
    parts += [f"{key}={row[key]}" for key in text_params
              if isinstance(row.get(key), str) and row[key]]
    return sep.join(parts)
