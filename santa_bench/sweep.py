"""Suite files -> cases: fixed values, grid and zip axes, where constraints.

A suite is a YAML file (see ``suites/``)::

    description: what it reproduces          # optional
    runner: kernel                           # kernel, fidelity, accuracy, e2e
    fixed: {heads: 4, kv_heads: 2, device: cpu}         # one value per key
    grid: {ctx: [256, 512], method: [dense, santa-prop:tile=32]}   # cartesian product
    zip: {S: [16, 32], tile: [16, 32]}       # tied axes of equal length (or a list of them)
    where: ["S <= ctx", "ctx % page_size == 0"]   # every expression must hold
    options: {cpu_budget: 0.01}              # runner settings that are not case keys

Keys are the runner's case keys (for ``kernel``: the ``santa-bench kernel`` options,
``method`` for a registry spec such as ``santa-prop:S=128,tile=32``) and method
parameters (``tile``, ``alloc``, ``draws``, ...). Sizes accept ``32k``; ``S`` also
accepts a ratio of the context (``0.4%`` -> ``round(ctx * 0.004)``, at least 1).
A kernel suite's ``inputs`` is a capture file (a path from the working directory, as
``--inputs``): its cases take the file's attention shape and, without ``ctx``, its
captured length; in ``where`` and ``--only``, ``inputs`` is ``captured:<model>:L<layers>``.
As in ``santa-bench kernel``, ``S`` and other method parameters apply to the methods
that have them (a method's own spec wins) and equal cases are kept once. A
misspelt key, an unknown method, a parameter no method of the suite has, or a bad
value is a :class:`SuiteError` naming the file and key.

``where`` expressions are evaluated by :mod:`santa_bench.expressions` (no ``eval``): names,
numbers, strings, lists, ``and or not``, ``+ - * / // % **``, comparisons, ``in``; a
power or product beyond ``2**64`` is refused. A name missing from a case (``S`` for
``dense``) makes that expression hold. A suite of more than ``MAX_CASES`` combinations
is refused before it is expanded.
Expansion of a ``kernel`` suite gives exactly the case dicts of
``runners.kernel.expand_cases``, so config hashes match the ``kernel`` command's.
"""

from __future__ import annotations

import difflib
import itertools
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from santa_bench.devices import resolve_device
from santa_bench.expressions import Expression
from santa_bench.methods import REGISTRY, Method, MethodError, Param, parse_method_specs
from santa_bench.results import config_hash
from santa_bench.runners import MAX_CASES
from santa_bench.runners.schema import SCHEMAS, RunnerSchema
from santa_bench.units import parse_size

ANNOUNCE_FROM = 10_000
"""Combinations from which :func:`load_suite` announces their count before expanding
them (about a second)."""
DRY_RUN_ROWS = 500
"""The most cases a ``--dry-run`` table lists (the title still counts them all)."""
TOP_LEVEL = ("name", "description", "runner", "fixed", "grid", "zip", "where", "options")


class SuiteError(ValueError):
    """An invalid suite file; the message names the file and the key."""


@dataclass(frozen=True)
class RunnerSpec:
    """The case keys a runner accepts (key -> value kind), its options and defaults."""

    name: str
    keys: dict[str, str]
    options: dict[str, type] = field(default_factory=dict)
    derived: tuple[str, ...] = ("kind", "family")
    defaults: dict[str, Any] = field(default_factory=dict)
    implemented: bool = False


def _runner_spec(schema: RunnerSchema) -> RunnerSpec:
    """A runner's suite keys and defaults, as its case schema declares them."""
    return RunnerSpec(schema.name, schema.kinds(), dict(schema.options), schema.derived,
                      schema.suite_defaults(), implemented=True)


RUNNERS: dict[str, RunnerSpec] = {name: _runner_spec(s) for name, s in SCHEMAS.items()}


@dataclass(frozen=True)
class Suite:
    """A validated suite: where it came from, its runner, and the expanded cases."""

    path: Path
    name: str
    description: str
    runner: str
    options: dict[str, Any]
    cases: list[dict[str, Any]]

    @property
    def implemented(self) -> bool:
        return RUNNERS[self.runner].implemented


@dataclass(frozen=True)
class _Ratio:
    """A budget given as a fraction of the context (``0.4%``)."""

    fraction: float
    text: str

    def of(self, ctx: int) -> int:
        return max(1, round(ctx * self.fraction))


# ------------------------------------------------------------ loading
_RATIO = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*%\s*$")


def _method_params(runner: str) -> dict[str, Param]:
    """Every parameter of every method a runner can name (registry, planned methods)."""
    return {p.name: p for m in REGISTRY for p in m.params}


def _retired_params() -> dict[str, str]:
    """Parameters some method no longer takes: name -> ``"<method> <why>"``."""
    return {name: f"{m.name} {why}" for m in REGISTRY for name, why in m.retired}


def _method(spec: str, runner: str) -> tuple[Method, dict[str, Any]]:
    parsed = parse_method_specs(str(spec))
    if len(parsed) != 1:
        sweep = " (a value a|b sweeps: list the values under grid instead)" if "|" in str(spec) \
            else ""
        raise MethodError(f"{spec!r} names {len(parsed)} methods; give one per item{sweep}")
    parsed[0][0].resolve_params(parsed[0][1])  # unknown or invalid parameters fail here
    return parsed[0]


def _value(kind: str, value: Any, runner: str) -> Any:
    """Normalises one value of a key of the given kind; ValueError/MethodError if bad."""
    if isinstance(value, (dict, list)):
        raise ValueError(f"expected a single value, got {value!r}")
    if kind == "size":
        return parse_size(value)
    if kind == "budget":
        match = _RATIO.match(str(value)) if isinstance(value, str) else None
        if match:
            fraction = float(match.group(1)) / 100
            if not 0 < fraction <= 1:
                raise ValueError(f"a ratio budget must be in (0%, 100%], got {value!r}")
            return _Ratio(fraction, str(value))
        return parse_size(value)
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"expected an integer, got {value!r}")
        return value
    if kind == "bool":
        if not isinstance(value, bool):
            raise ValueError(f"expected true or false, got {value!r}")
        return value
    if kind == "method":
        return _method(value, runner)
    if not isinstance(value, (str, int, float)):
        raise ValueError(f"expected a string, got {value!r}")
    return value


def load_suite(
    path: Path | str,
    max_cases: int = MAX_CASES,
    announce: Callable[[str], None] | None = None,
) -> Suite:
    """Loads, validates and expands a suite file; raises SuiteError naming file and key
    (see :func:`suite_from_dict` for ``max_cases`` and ``announce``)."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise SuiteError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise SuiteError(f"{path}: not valid YAML: {exc}") from None
    return suite_from_dict(data, path, max_cases, announce)


def suite_from_dict(
    data: Any,
    path: Path | str = "<suite>",
    max_cases: int = MAX_CASES,
    announce: Callable[[str], None] | None = None,
) -> Suite:
    """Validates and expands a suite already parsed from YAML (see :func:`load_suite`).

    A suite of more than ``max_cases`` combinations is refused before expansion;
    ``announce`` receives a line with the count before a long one (``ANNOUNCE_FROM``)."""
    path = Path(path)

    def fail(key: str, message: str) -> SuiteError:
        return SuiteError(f"{path}: {key}: {message}")

    if not isinstance(data, dict):
        raise SuiteError(f"{path}: a suite must be a mapping of {', '.join(TOP_LEVEL)}")
    for key in data:
        if key not in TOP_LEVEL:
            raise fail(str(key), f"unknown top-level key; expected one of {', '.join(TOP_LEVEL)}")
    runner = data.get("runner")
    if runner not in RUNNERS:
        raise fail("runner", f"expected one of {', '.join(RUNNERS)}, got {runner!r}")
    spec = RUNNERS[runner]
    params = _method_params(runner)

    # every key's values, by section, normalised
    axes: list[list[dict[str, Any]]] = []  # each axis: its list of partial assignments
    seen: dict[str, str] = {}

    def values(section: str, key: Any, raw: Any, single: bool) -> list[Any]:
        where = f"{section}.{key}"
        if not isinstance(key, str):
            raise fail(where, "keys must be strings")
        retired = _retired_params()
        if key not in spec.keys and key not in params and key in retired:
            raise fail(where, f"{retired[key]}; drop {key}")
        if key not in spec.keys and key not in params:
            accepted = sorted({*spec.keys, *params})
            close = difflib.get_close_matches(key, accepted, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise fail(
                where, f"unknown key for runner {runner!r}; {hint}accepted: {', '.join(accepted)}"
            )
        if key in seen:
            raise fail(where, f"also given in {seen[key]}")
        seen[key] = where
        items = [raw] if single or not isinstance(raw, list) else raw
        if single and isinstance(raw, list):
            raise fail(where, "a fixed key takes one value (put lists under grid or zip)")
        if not items:
            raise fail(where, "empty list")
        kind = spec.keys.get(key, "param")
        out = []
        for index, item in enumerate(items):
            label = where if len(items) == 1 else f"{where}[{index}]"
            try:
                out.append(
                    params[key].validate(item, key)
                    if kind == "param"
                    else _value(kind, item, runner)
                )
            except (ValueError, MethodError) as exc:
                raise fail(label, str(exc)) from None
        return out

    fixed = data.get("fixed") or {}
    if not isinstance(fixed, dict):
        raise fail("fixed", "expected a mapping of key: value")
    axes.append([{k: values("fixed", k, v, True)[0] for k, v in fixed.items()}])
    grid = data.get("grid") or {}
    if not isinstance(grid, dict):
        raise fail("grid", "expected a mapping of key: [values]")
    for key, raw in grid.items():
        axes.append([{key: v} for v in values("grid", key, raw, False)])
    zipped = data.get("zip") or []
    groups = [zipped] if isinstance(zipped, dict) else zipped
    if not isinstance(groups, list) or not all(isinstance(g, dict) for g in groups):
        raise fail("zip", "expected a mapping of key: [values], or a list of them")
    for number, group in enumerate(groups):
        section = "zip" if isinstance(zipped, dict) else f"zip[{number}]"
        columns = {k: values(section, k, v, False) for k, v in group.items()}
        lengths = {k: len(v) for k, v in columns.items()}
        if len(set(lengths.values())) > 1:
            raise fail(section, f"tied axes need equal lengths, got {lengths}")
        if columns:
            axes.append(
                [
                    dict(zip(columns, row, strict=True))
                    for row in zip(*columns.values(), strict=True)
                ]
            )

    methods = [v for axis in axes for a in axis for k, v in a.items() if k == "method"]
    if not methods:
        raise fail("method", "no method named (give method under fixed, grid or zip)")
    for key, where in seen.items():
        if (
            key in params
            and key not in spec.keys
            and not any(key in {p.name for p in m.params} for m, _ in methods)
        ):
            raise fail(where, f"no method of this suite has a parameter {key!r}")

    raw_where = data.get("where") or []
    raw_where = [raw_where] if isinstance(raw_where, str) else raw_where
    if not isinstance(raw_where, list):
        raise fail("where", "expected an expression or a list of expressions")
    known = {*spec.keys, *spec.derived, *params}
    constraints = []
    for index, text in enumerate(raw_where):
        label = f"where[{index}]"
        try:
            expression = Expression.parse(text)
        except ValueError as exc:
            raise fail(label, str(exc)) from None
        if unknown := sorted(expression.names - known - {"True", "False", "None"}):
            raise fail(label, f"unknown name(s) {unknown} in {text!r}")
        constraints.append((label, expression))

    options = data.get("options") or {}
    if not isinstance(options, dict):
        raise fail("options", "expected a mapping")
    for key, value in options.items():
        if key not in spec.options:
            raise fail(
                f"options.{key}",
                f"unknown option for runner {runner!r}; expected "
                f"{', '.join(spec.options) or 'none'}",
            )
        if (not isinstance(value, (int, float)) or isinstance(value, bool)
                or not math.isfinite(value) or value <= 0):
            raise fail(f"options.{key}", f"expected a finite number > 0, got {value!r}")

    for key, default in spec.defaults.items():  # a list default is swept where not given
        if isinstance(default, list) and key not in seen:
            axes.append([{key: _value(spec.keys[key], v, runner)} for v in default])

    combinations = math.prod(len(axis) for axis in axes)
    if combinations > max_cases:
        raise fail(
            "grid",
            f"{combinations:,} combinations of grid and zip values exceed the limit of "
            f"{max_cases:,} cases; give fewer values, split the suite, or raise "
            "sweep --max-cases",
        )
    if announce is not None and combinations >= ANNOUNCE_FROM:
        announce(f"{path}: expanding {combinations:,} combinations of grid and zip values")
    cases: list[dict[str, Any]] = []
    hashes: set[str] = set()
    for parts in itertools.product(*axes):
        given = {k: v for part in parts for k, v in part.items()}
        combo = {**{k: v for k, v in spec.defaults.items() if not isinstance(v, list)}, **given}
        if runner == "kernel" and given.get("inputs") and "ctx" not in given:
            try:  # a capture file's cases default to its captured length
                combo["ctx"] = _captured_ctx(str(given["inputs"]))
            except ValueError as exc:
                raise fail(_describe(combo), str(exc)) from None
        try:
            built = _build(runner, combo)
        except (ValueError, MethodError) as exc:
            raise fail(_describe(combo), str(exc)) from None
        for case in built:
            scope = {**_plain(combo), **case}
            for label, expression in constraints:
                try:
                    if not expression(scope):
                        break
                except Exception as exc:
                    raise fail(
                        label,
                        f"{expression.text!r} on {_describe(combo)}: {type(exc).__name__}: {exc}",
                    ) from None
            else:
                digest = config_hash(case)
                if digest not in hashes:
                    hashes.add(digest)
                    cases.append(case)
    description = str(data.get("description") or "").strip()
    return Suite(
        path, str(data.get("name") or path.stem), description, runner, dict(options), cases
    )


def _plain(combo: dict[str, Any]) -> dict[str, Any]:
    """The combination with methods as names and budgets as numbers (for ``where``)."""
    plain = dict(combo)
    if "method" in plain:
        plain["method"] = plain["method"][0].name
    if isinstance(plain.get("S"), _Ratio):
        plain["S"] = plain["S"].of(plain["ctx"])
    return plain


def _describe(combo: dict[str, Any]) -> str:
    shown = {k: (v[0].name if k == "method" else getattr(v, "text", v)) for k, v in combo.items()}
    return "case " + ", ".join(f"{k}={v}" for k, v in shown.items())


def _overrides(method: Method, given: dict[str, Any], combo: dict[str, Any]) -> dict[str, Any]:
    """The method's spec overrides plus the suite's values of its other parameters."""
    names = {p.name for p in method.params} - {"S"}
    return {**{k: combo[k] for k in names if k in combo}, **given}


def _build(runner: str, combo: dict[str, Any]) -> list[dict[str, Any]]:
    """Returns the (zero or one) case of one combination."""
    method, given = combo["method"]
    budget = combo.get("S")
    if isinstance(budget, _Ratio):
        if "ctx" not in combo:
            raise ValueError("a ratio budget needs ctx")
        budget = budget.of(combo["ctx"])
    overrides = _overrides(method, given, combo)
    if runner == "kernel":
        return _kernel_case(method, overrides, budget, combo)
    if runner in ("fidelity", "accuracy"):
        return _expanded_case(runner, method, overrides, budget, combo)
    if runner == "e2e":
        return _e2e_cases(method, overrides, budget, combo)
    names = {p.name for p in method.params}
    if budget is not None and "S" in names and "S" not in overrides:
        overrides["S"] = budget
    resolved = method.resolve_params(overrides)
    if "S" in names and "ctx" in combo and resolved["S"] > combo["ctx"]:
        return []
    keys = [k for k in RUNNERS[runner].keys if k not in ("method", "S") and k in combo]
    return [
        {
            "kind": runner,
            "method": method.name,
            "family": method.family,
            **resolved,
            **{k: combo[k] for k in keys},
        }
    ]


def _expanded_case(
    runner: str,
    method: Method,
    overrides: dict[str, Any],
    budget: int | None,
    combo: dict[str, Any],
) -> list[dict[str, Any]]:
    """The fidelity or accuracy case(s) of one combination, exactly as its command builds
    them (a task group such as ``ruler-niah`` gives one case per concrete task)."""
    names = {p.name for p in method.params}
    budgets = [budget] if budget is not None and "S" in names and "S" not in overrides else []
    if runner == "fidelity":
        from santa_bench.accuracy.patterns import PATTERNS
        from santa_bench.runners.fidelity import FidelityGrid, expand_fidelity_cases

        if combo.get("pattern") not in PATTERNS:
            raise ValueError(
                f"pattern: expected one of {list(PATTERNS)}, got {combo.get('pattern')!r}"
            )
        grid = FidelityGrid(
            methods=[(method, overrides)],
            patterns=[combo["pattern"]],
            S=budgets or [overrides.get("S", 128)],
            ctx=[combo["ctx"]],
            batch=combo["batch"],
            heads=combo["heads"],
            kv_heads=combo["kv_heads"],
            head_dim=combo["head_dim"],
            seeds=combo["seeds"],
            input_seed=combo["seed"],
        )
        return expand_fidelity_cases(grid)
    from santa_bench.runners.tasks import expand_task_names, task_case

    if budgets:
        overrides = {**overrides, "S": budgets[0]}
    return [
        task_case(
            task,
            combo["model"],
            method,
            overrides,
            n=combo["n"],
            seed=combo["seed"],
            dense_layers=combo["dense_layers"],
            max_new_tokens=combo["max_new_tokens"],
            ctx=combo.get("ctx"),
            device=combo["device"],
            reference=combo["reference"],
            batch=combo["batch"],
        )
        for task in expand_task_names(combo["task"])  # ruler-niah: the eight NIAH tasks
    ]


def _e2e_cases(
    method: Method, overrides: dict[str, Any], budget: int | None, combo: dict[str, Any]
) -> list[dict[str, Any]]:
    """The e2e case(s) of one combination (dense: one per dense backend), as the command."""
    from santa_bench.e2e.runner import E2EGrid, check_grid, expand_cases
    from santa_bench.units import parse_list

    device = resolve_device(combo["device"], option="device", visible=False)
    if budget is not None and "S" in {p.name for p in method.params} and "S" not in overrides:
        overrides = {**overrides, "S": budget}
    backends = combo["dense_backends"]
    grid = E2EGrid(
        model=str(combo["model"]), weights=combo["weights"], methods=[(method, overrides)],
        ctx=[combo["ctx"]], batch=[combo["batch"]], steps=combo["decode_steps"],
        dense_backends=None if backends == "auto" else parse_list(backends),
        layout=combo["layout"], page_size=combo["page_size"],
        dense_layers=str(combo["dense_layers"]), prefill=combo["prefill"],
        prefill_chunk=combo["prefill_chunk"], dtype=combo["dtype"], seed=combo["seed"],
        device=device, graph=combo["graph"], rest=combo["rest"],
    )
    check_grid(grid, str)
    return expand_cases(grid)


def _captured_ctx(path: str) -> int:
    """The captured length of a capture file (ValueError if it is not one)."""
    from santa_bench.captured import describe_capture

    return describe_capture(path, digest=False).ctx


def _kernel_case(
    method: Method, overrides: dict[str, Any], budget: int | None, combo: dict[str, Any]
) -> list[dict[str, Any]]:
    from santa_bench.runners.kernel import (
        KernelGrid,
        attention_shape,
        check_grid,
        expand_cases,
    )

    device = resolve_device(combo.get("device", "auto"), option="device", visible=False)
    inputs = str(combo["inputs"]) if combo.get("inputs") else None
    shape = attention_shape(inputs, {k: combo.get(k) for k in ("heads", "kv_heads", "head_dim")})
    grid = KernelGrid(
        methods=[(method, overrides)],
        ctx=[combo["ctx"]],
        batch=[combo["batch"]],
        S=[budget if budget is not None else 128],
        device=device,
        inputs=inputs,
        **shape,
        **{
            k: combo[k]
            for k in (
                "dtype",
                "layout",
                "page_size",
                "seed",
                "graph",
            )
            if k in combo
        },
        **({"cold_l2": combo["cold"]} if "cold" in combo else {}),
    )
    check_grid(grid)
    return expand_cases(grid)


# ------------------------------------------------------------ selection
def select_only(cases: list[dict[str, Any]], text: str) -> list[dict[str, Any]]:
    """Filters cases by ``--only``: a comma list of method names, or an expression.

    ``dense,santa-prop`` keeps those methods; anything else is a boolean expression
    over case keys in ``where`` syntax (``ctx == 32768 and S <= 128``), and a case
    without a named key is dropped.
    """
    names = [t.strip() for t in text.split(",") if t.strip()]
    if names and all(n in REGISTRY.names() for n in names):
        return [c for c in cases if c.get("method") in names]
    try:
        expression = Expression.parse(text)
    except ValueError as exc:
        raise SuiteError(f"--only: {exc}") from None
    known = {k for c in cases for k in c} | {"True", "False", "None"}
    if unknown := sorted(expression.names - known):
        raise SuiteError(f"--only: unknown name(s) {unknown}; case keys: {sorted(known)}")
    try:
        return [c for c in cases if expression(c, missing=False)]
    except Exception as exc:
        raise SuiteError(f"--only: {text!r}: {type(exc).__name__}: {exc}") from None


def parse_shard(text: str) -> tuple[int, int]:
    """Parses ``i/n`` (0 <= i < n)."""
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    if not match or not 0 <= int(match.group(1)) < int(match.group(2)):
        raise SuiteError(f"--shard: expected i/n with 0 <= i < n, got {text!r}")
    return int(match.group(1)), int(match.group(2))


def shard(cases: list[dict[str, Any]], index: int, count: int) -> list[dict[str, Any]]:
    """Every ``count``-th case from ``index`` on, in the expanded order."""
    return cases[index::count]


def cases_table(
    suite: Suite,
    cases: list[dict[str, Any]],
    total: int,
    stored: set[str] | None = None,
    rows: int | None = None,
) -> Any:
    """Returns a rich Table of ``cases``: the keys that vary, the hash, whether stored;
    of more than ``rows`` (default ``DRY_RUN_ROWS``) the first ones (the title counts all)."""
    rows = DRY_RUN_ROWS if rows is None else rows
    from rich.table import Table

    from santa_bench.units import format_size

    keys = list(dict.fromkeys(k for c in cases for k in c))
    varying = [k for k in keys if len({repr(c.get(k)) for c in cases}) > 1 and k != "family"]
    fixed = [k for k in keys if k not in varying and k != "family"]
    caption = ("fixed: " + ", ".join(f"{k}={cases[0].get(k)}" for k in fixed)) if cases else ""
    if len(cases) > rows:
        more = f"the first {rows:,} listed; --only or --shard lists others"
        caption = f"{caption}; {more}" if caption else more
    table = Table(
        title=f"{suite.name} ({suite.runner}): {len(cases)} of {total} cases", caption=caption
    )
    table.add_column("#", justify="right")
    table.add_column("case_hash", no_wrap=True)
    if stored is not None:
        table.add_column("stored")
    for key in varying:
        table.add_column(key, no_wrap=key == "method", overflow="fold", min_width=len(key))
    for number, case in enumerate(cases[:rows]):
        digest = config_hash(case)
        cells = [
            format_size(v) if k == "ctx" and isinstance(v, int) else ("-" if v is None else str(v))
            for k in varying
            for v in [case.get(k)]
        ]
        done = [] if stored is None else ["yes" if digest in stored else "-"]
        table.add_row(str(number), digest, *done, *cells)
    return table
