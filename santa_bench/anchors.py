"""The reference figures of docs/anchors.md, loaded from the package's data/anchors.yaml.

Every anchor number the tables of `santa-bench plot tables` print beside ours lives in
that file: the dense baselines and the papers' released kernels timed on one H200, and
the seeds' claimed scores. Each table carries its heading in docs/anchors.md (`section`),
how its figures were obtained (`setup`), its rows and its other keys (model, ctx, shape).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import Any

import yaml

ANCHORS_FILE = files("santa_bench") / "data" / "anchors.yaml"
# The tables the file must hold: the keys each table needs beside section, setup and
# rows, and the keys every one of its rows needs.
TABLE_FIELDS: dict[str, tuple[str, ...]] = {
    "dense": ("shape",),
    "kernels": ("shape", "kernels"),
    "ruler": ("model", "ctx"),
    "gsm8k": ("model", "dense"),
    "page_subset": ("shape",),
    "claims": (),
}
ROW_KEYS: dict[str, tuple[str, ...]] = {
    "dense": ("ctx", "batch", "method"),
    "kernels": ("ctx", "batch", "S", "best_dense_us"),
    "ruler": ("kernel", "scores"),
    "gsm8k": ("S",),
    "page_subset": ("ctx", "batch", "pages", "events", "graph"),
    "claims": ("paper", "claim"),
}


class AnchorError(ValueError):
    """The anchors file is malformed; the message names the file, table and row."""


@dataclass(frozen=True)
class AnchorTable:
    """One table of reference figures: its heading, its setup, its rows and other keys."""

    section: str
    setup: str
    rows: tuple[Mapping[str, Any], ...]
    fields: Mapping[str, Any]

    def __getitem__(self, key: str) -> Any:
        """Return the table key `key` (model, ctx, shape, ...)."""
        return self.fields[key]


@dataclass(frozen=True)
class Anchors:
    """The reference figures: the document they are written in and each named table."""

    document: str
    tables: Mapping[str, AnchorTable]

    def __getitem__(self, name: str) -> AnchorTable:
        """Return the table `name` (dense, kernels, ruler, gsm8k, page_subset, claims)."""
        return self.tables[name]


def load_anchors(path: Path | None = None) -> Anchors:
    """Return the anchors of `path` (default: the package's data/anchors.yaml), checked.

    Raises AnchorError when a table, a table key or a row key is missing.
    """
    source = ANCHORS_FILE if path is None else path
    try:
        data = yaml.safe_load(source.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise AnchorError(f"{source}: not valid YAML ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("document"), str):
        raise AnchorError(f"{source}: expected a mapping with a 'document' entry")
    tables = {}
    for name, needed in TABLE_FIELDS.items():
        tables[name] = _table(source, name, data.get(name), needed, ROW_KEYS[name])
    _check_ruler(source, tables["ruler"])
    _check_kernels(source, tables["kernels"])
    return Anchors(data["document"], tables)


@functools.cache
def packaged_anchors() -> Anchors:
    """Return the anchors of the package's data/anchors.yaml (loaded once)."""
    return load_anchors()


def _table(
    source: Any, name: str, entry: Any, needed: tuple[str, ...], row_keys: tuple[str, ...]
) -> AnchorTable:
    """Return table `name` of the file, checked for its keys and its rows' keys."""
    where = f"{source}: table {name!r}"
    if not isinstance(entry, dict):
        raise AnchorError(f"{where} is missing")
    for key in ("section", "setup", "rows", *needed):
        if key not in entry:
            raise AnchorError(f"{where} lacks {key!r}")
    rows = entry["rows"]
    if not isinstance(rows, list) or not rows:
        raise AnchorError(f"{where}: 'rows' must be a non-empty list")
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise AnchorError(f"{where}: row {i} is not a mapping")
        if missing := [k for k in row_keys if k not in row]:
            raise AnchorError(f"{where}: row {i} lacks {', '.join(map(repr, missing))}")
    fields = {k: v for k, v in entry.items() if k not in ("section", "setup", "rows")}
    return AnchorTable(str(entry["section"]), str(entry["setup"]), tuple(rows), fields)


def _check_ruler(source: Any, table: AnchorTable) -> None:
    """Every RULER row scores the same tasks, in the same order."""
    tasks = list(table.rows[0]["scores"])
    for i, row in enumerate(table.rows):
        if list(row["scores"]) != tasks:
            raise AnchorError(
                f"{source}: table 'ruler': row {i} scores {list(row['scores'])}, not {tasks}"
            )


def _check_kernels(source: Any, table: AnchorTable) -> None:
    """Every kernel row has each named kernel: its us and speedup, or null (not run)."""
    for i, row in enumerate(table.rows):
        for method in table["kernels"]:
            cell = row.get(method, "missing")
            if cell is not None and not (isinstance(cell, dict) and {"us", "speedup"} <= set(cell)):
                raise AnchorError(
                    f"{source}: table 'kernels': row {i}: {method!r} needs us and speedup "
                    "(or null where the kernel does not run)"
                )
