"""Tidy Parquet results: one row per observation, one file per case, one folder per run.

Layout under a store's root (e.g. `results/`)::

    <run_id>/run.json                   the environment record (collect_environment) + run_id
    <run_id>/part-<case_hash>.parquet   every row of one case, written atomically

A row holds the case's parameters (flat scalars, one column each) followed by
FIXED_COLUMNS. A case that already has rows under the same environment fingerprint
is skipped on re-runs unless forced, so an interrupted sweep resumes where it stopped.
"""

from __future__ import annotations

import hashlib
import json
import math
import numbers
import os
import re
import secrets
import tempfile
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from santa_bench.environment import FINGERPRINT_FIELDS, environment_fingerprint

FIXED_COLUMNS: tuple[str, ...] = (
    "metric",
    "value",
    "unit",
    "status",
    "reason",
    "run_id",
    "case_hash",
    "env_fingerprint",
    "command",
)
"""Columns every row carries after the case's parameters:

- metric: what was observed (`latency_ms`, `rel_l2`, `accuracy`, ...).
- value: the observation as float64; NaN when status is not "ok".
- unit: the value's unit (`ms`, `GB/s`, `""` for ratios and scores).
- status: "ok", "skipped" (could not run here: no CUDA, package missing) or "failed".
- reason: why a row is skipped or failed; "" when ok.
- run_id: the run's folder name; joins to its run.json (environment record).
- case_hash: config_hash of the case's parameters; the resume key.
- env_fingerprint: environment_fingerprint of the run; rows compare only within one.
- command: the exact command line that reproduces the row.
"""

STATUSES: tuple[str, ...] = ("ok", "skipped", "failed")

# Filled by Run.write_case, never by the runner.
RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
"""A run id: a plain folder name, no separators, wildcards, newlines or leading dot."""


def check_run_id(run_id: str) -> str:
    """Returns ``run_id``; ValueError when it is not a plain folder name (:data:`RUN_ID`)."""
    if not isinstance(run_id, str) or not RUN_ID.fullmatch(run_id):
        raise ValueError(
            f"run id {run_id!r}: expected letters, digits, '.', '_' and '-', starting with "
            "a letter or digit"
        )
    return run_id


_FILLED_COLUMNS = ("run_id", "case_hash", "env_fingerprint", "command")
_ARROW_TYPES = {name: pa.float64() if name == "value" else pa.string() for name in FIXED_COLUMNS}
_Scalar = str | int | float | bool | None


def config_hash(case: dict[str, Any]) -> str:
    """Return a stable 16-hex hash of a case's parameters (keys starting with "_" ignored).

    Key order does not matter, and integral floats hash as ints (1.0 == 1).
    """
    params = {key: _canonical(value) for key, value in case.items() if not key.startswith("_")}
    text = json.dumps(params, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def validate_row(row: dict[str, Any]) -> dict[str, Any]:
    """Return `row` with status, reason, unit defaulted and value as float; ValueError if bad."""
    status = row.get("status", "ok")
    if status not in STATUSES:
        raise ValueError(f"row status must be one of {STATUSES}, got {status!r}: {row}")
    metric = row.get("metric")
    if not isinstance(metric, str) or not metric:
        raise ValueError(f"row needs a non-empty str 'metric': {row}")
    value = row.get("value")
    if value is None and status != "ok":
        value = math.nan
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"row {metric!r}: 'value' must be a real number, got {value!r}")
    reason = row.get("reason", "")
    if status != "ok" and not reason:
        raise ValueError(f"row {metric!r} is {status} but gives no 'reason'")
    unit = row.get("unit", "")
    if not isinstance(unit, str) or not isinstance(reason, str):
        raise ValueError(f"row {metric!r}: 'unit' and 'reason' must be str")
    return {**row, "value": float(value), "unit": unit, "status": status, "reason": reason}


@dataclass(frozen=True)
class Run:
    """One run's folder: writes each case's rows as one Parquet part."""

    path: Path
    run_id: str
    env_fingerprint: str
    command: str

    def write_case(
        self, case: dict[str, Any], rows: list[dict[str, Any]], command: str | None = None
    ) -> Path:
        """Return the path of the part written atomically for `case` (replacing an old one).

        Each row gets the case's parameters and the fixed columns; `command` (default:
        the run's command) is what reproduces the case.
        """
        if not rows:
            raise ValueError(f"case {case} has no rows; record a skipped/failed row instead")
        params = {
            key: _scalar(key, value) for key, value in case.items() if not key.startswith("_")
        }
        if clash := set(params) & set(FIXED_COLUMNS):
            raise ValueError(f"case parameters may not use fixed column names: {sorted(clash)}")
        case_hash = config_hash(case)
        filled = {
            "run_id": self.run_id,
            "case_hash": case_hash,
            "env_fingerprint": self.env_fingerprint,
            "command": command if command is not None else self.command,
        }
        records = [self._record(params, validate_row(row), filled) for row in rows]
        columns = list(dict.fromkeys(key for record in records for key in record))
        columns = [c for c in columns if c not in FIXED_COLUMNS] + list(FIXED_COLUMNS)
        table = pa.table(
            {c: pa.array([r.get(c) for r in records], type=_ARROW_TYPES.get(c)) for c in columns}
        )
        path = self.path / f"part-{case_hash}.parquet"
        _atomic_write(path, lambda tmp: pq.write_table(table, tmp))
        return path

    @staticmethod
    def _record(
        params: dict[str, _Scalar], row: dict[str, Any], filled: dict[str, str]
    ) -> dict[str, _Scalar]:
        """Return one output record: case parameters, the row's own columns, filled columns."""
        if given := set(row) & set(_FILLED_COLUMNS):
            raise ValueError(f"rows may not set {sorted(given)}; write_case fills them")
        extra = {key: _scalar(key, value) for key, value in row.items()}
        if clash := {k for k in set(extra) & set(params) if extra[k] != params[k]}:
            raise ValueError(f"row columns {sorted(clash)} contradict the case's parameters")
        return {**params, **extra, **filled}


def _invocation(record: dict[str, Any]) -> dict[str, Any]:
    return {key: record.get(key) for key in ("date", "command", "git_sha")}


def _invocations(old: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The invocations an existing run.json lists (one made before the list: its own)."""
    if old is None:
        return []
    return list(old.get("invocations") or [_invocation(old)])


class ResultStore:
    """A folder of runs; answers which cases are done and loads rows as one DataFrame."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)
        # each part's table by path, kept while the file's (inode, size, mtime) stays the
        # same: load() and completed() read a part once per store, not once per call
        self._tables: dict[Path, tuple[tuple[int, int, int], pa.Table | None]] = {}

    def start_run(self, env: dict[str, Any], run_id: str | None = None) -> Run:
        """Return a new (or reopened) run whose run.json holds `env`, run_id, env_fingerprint."""
        run_id = run_id or datetime.now(UTC).strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(3)
        check_run_id(run_id)
        fingerprint = environment_fingerprint(env)
        directory = self.root / run_id
        old = _read_json(directory / "run.json")
        if old is not None and old.get("env_fingerprint") != fingerprint:
            raise ValueError(f"run {run_id!r} exists with a different environment fingerprint")
        directory.mkdir(parents=True, exist_ok=True)
        record = {**env, "run_id": run_id, "env_fingerprint": fingerprint,
                  "invocations": [*_invocations(old), _invocation(env)]}
        text = json.dumps(record, indent=2, sort_keys=True, default=str) + "\n"
        _atomic_write(directory / "run.json", lambda tmp: Path(tmp).write_text(text))
        return Run(directory, run_id, fingerprint, str(env.get("command") or ""))

    def annotate_run(self, run_id: str, fields: dict[str, Any]) -> None:
        """Adds ``fields`` to the run.json of ``run_id`` (fields of the fingerprint may not
        change: they identify the environment the rows were measured in)."""
        path = self.root / run_id / "run.json"
        record = _read_json(path)
        if record is None:
            raise ValueError(f"run {run_id!r} has no run.json under {self.root}")
        if changed := sorted(f for f in FINGERPRINT_FIELDS if f in fields
                             and fields[f] != record.get(f)):
            raise ValueError(f"run {run_id!r}: fingerprint fields may not change: {changed}")
        text = json.dumps({**record, **fields}, indent=2, sort_keys=True, default=str) + "\n"
        _atomic_write(path, lambda tmp: Path(tmp).write_text(text))

    def runs(self) -> list[dict[str, Any]]:
        """Return the run.json records under the root, sorted by run_id; a record's run_id
        is its folder's name (as a row's is)."""
        records = ((path, _read_json(path)) for path in sorted(self.root.glob("*/run.json")))
        return [{**record, "run_id": path.parent.name} for path, record in records
                if record is not None]

    def completed(self, env_fingerprint: str) -> set[str]:
        """Return the case hashes finished under `env_fingerprint` (in any run).

        A case is finished when some run holds a part of it without a ``failed`` row; a
        case whose only parts failed is not, so a resumed run retries it. Parts already
        read by this store are not read again (only new or rewritten ones).
        """
        done: set[str] = set()
        for table in self._tables_of(self._parts(None)):
            if table is None or not table.num_rows:
                continue
            statuses = table["status"].to_pylist()
            fingerprints = set(table["env_fingerprint"].to_pylist())
            if fingerprints == {env_fingerprint} and "failed" not in statuses:
                done.update(table["case_hash"].to_pylist())
        return done

    def forget_failed(self, case_hash: str) -> int:
        """Delete the stored parts of ``case_hash`` that hold a ``failed`` row (before it is
        re-run); finished parts stay, in whatever run holds them (a forced re-run into
        another run adds a measurement, it does not erase one). Returns how many went."""
        gone = 0
        paths = sorted(self.root.glob(f"*/part-{case_hash}.parquet"))
        for path, table in zip(paths, self._tables_of(paths), strict=True):
            if table is not None and "failed" in table["status"].to_pylist():
                path.unlink()
                self._tables.pop(path, None)
                gone += 1
        return gone

    def load(self, runs: list[str] | None = None) -> pd.DataFrame:
        """Return every row of the given runs (default: all), columns unioned (missing: NA)."""
        tables = [
            table
            for table in self._tables_of(self._parts(runs))
            if table is not None and table.num_rows
        ]
        if not tables:
            return pd.DataFrame({c: pd.Series(dtype=_pandas_dtype(c)) for c in FIXED_COLUMNS})
        data = _concat(tables)
        params = [c for c in data.columns if c not in FIXED_COLUMNS]
        return data[params + list(FIXED_COLUMNS)]

    def unreadable_parts(self, runs: list[str] | None = None) -> list[Path]:
        """The part files of the given runs (default: all) that cannot be read (corrupt):
        :meth:`load` leaves their rows out."""
        paths = self._parts(runs)
        return [path for path, table in zip(paths, self._tables_of(paths), strict=True)
                if table is None and path.is_file()]

    def newest_per_case(self, frame: pd.DataFrame) -> pd.DataFrame:
        """The rows of ``frame`` (from this store) that belong, for their case
        (``case_hash``), to the newest run holding the case in ``frame`` (by run.json date,
        then run id): a case timed again after a code change shows its new figure, not a
        blend with the old one."""
        if frame.empty:
            return frame
        dates = self._run_dates()
        when = frame["run_id"].map(lambda run: (dates.get(run, ""), str(run)))
        newest = when.groupby(frame["case_hash"]).transform("max")
        return frame[when == newest].reset_index(drop=True)

    def load_latest_last(self, current_run: str) -> pd.DataFrame:
        """Every row, ordered so that a later measurement of a case comes after an earlier
        one: other runs by their run.json date, then ``current_run``. The accuracy
        runner's recall lets a case's last row win (dense scores, for retention); timings
        are recalled from a run's own rows only."""
        frame = self.load()
        if frame.empty:
            return frame
        dates = self._run_dates()
        order = pd.DataFrame({"current": frame["run_id"] == current_run,
                              "date": frame["run_id"].map(lambda run: dates.get(run, ""))})
        index = order.sort_values(["current", "date"], kind="stable").index
        return frame.loc[index].reset_index(drop=True)

    def _run_dates(self) -> dict[str, str]:
        """Each run's run.json date ("" where it has none), by run id."""
        return {record["run_id"]: str(record.get("date") or "") for record in self.runs()}

    def _tables_of(self, paths: list[Path]) -> list[pa.Table | None]:
        """Return each part's table (None if corrupt), reading only parts not yet read
        or changed since (by inode, size and mtime), several files at a time."""
        keys: dict[Path, tuple[int, int, int] | None] = {}
        for path in paths:
            try:
                stat = path.stat()
            except OSError:
                keys[path] = None
                continue
            keys[path] = (stat.st_ino, stat.st_size, stat.st_mtime_ns)
        stale = [
            (path, key) for path, key in keys.items()
            if key is not None and (path not in self._tables or self._tables[path][0] != key)
        ]
        if stale:
            workers = min(4, os.cpu_count() or 1, len(stale))
            with ThreadPoolExecutor(workers) as pool:  # Arrow reads without the GIL
                read = list(pool.map(lambda item: _read_part(*item), stale))
            for (path, key), table in zip(stale, read, strict=True):
                self._tables[path] = (key, table)
        return [self._tables[path][1] if keys[path] is not None else None for path in paths]

    def _parts(self, runs: list[str] | None) -> list[Path]:
        """Return the part files of the given runs (default: all), in a stable order."""
        if runs is None:
            return sorted(self.root.glob("*/part-*.parquet"))
        for run in runs:
            check_run_id(run)
        if missing := [run for run in runs if not (self.root / run).is_dir()]:
            raise ValueError(f"unknown runs under {self.root}: {missing}")
        return [path for run in runs for path in sorted((self.root / run).glob("part-*.parquet"))]


def should_skip(
    store: ResultStore, case: dict[str, Any], fingerprint: str, force: bool = False
) -> bool:
    """Return True when `case` already has rows under `fingerprint` and `force` is off.

    Lists the store's parts on every call (reading only parts it has not read before);
    for many cases, call `store.completed()` once instead.
    """
    return not force and config_hash(case) in store.completed(fingerprint)


def _canonical(value: Any) -> Any:
    """Return `value` with integral floats as ints and tuples as lists, recursively."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, (list, tuple)):
        return [_canonical(item) for item in value]
    if isinstance(value, dict):
        return {str(key): _canonical(item) for key, item in value.items()}
    return value


def _scalar(key: str, value: Any) -> _Scalar:
    """Return `value` as a plain Python scalar (numpy scalars unwrapped); ValueError if not."""
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()  # numpy scalars and 0-d tensors
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    raise ValueError(f"column {key!r} must be a flat scalar, got {type(value).__name__}")


def _atomic_write(path: Path, write: Callable[[str], object]) -> None:
    """Write `path` via a temp file in the same folder, so readers never see it half-written."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        with open(tmp, "rb+") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _read_part(path: Path, key: tuple[int, int, int]) -> pa.Table | None:
    """Return the part's table, or None if unreadable, warning once per file version."""
    try:
        with pq.ParquetFile(path) as part:
            return _with_run_id(part.read(use_threads=False), path.parent.name)
    except (OSError, pa.ArrowException, KeyError) as exc:
        if (path.resolve(), key) not in _REPORTED:
            _REPORTED.add((path.resolve(), key))
            _warn_corrupt(path, exc)
        return None


def _with_run_id(table: pa.Table, run_id: str) -> pa.Table:
    """The table with its ``run_id`` column set to the folder holding the part: a run
    renamed (its folder moved) keeps every row, under its new name."""
    index = table.schema.get_field_index("run_id")
    if index < 0:
        return table
    column = pa.array([run_id] * table.num_rows, table.schema.field(index).type)
    return table.set_column(index, table.schema.field(index), column)


_REPORTED: set[tuple[Path, tuple[int, int, int]]] = set()
"""Corrupt parts already reported in this process (path, file version)."""


def _warn_corrupt(path: Path, exc: BaseException) -> None:
    """Warn that a part is unreadable and say how to clear it (no source line attached)."""
    case_hash = path.stem.removeprefix("part-")
    message = (
        f"skipping unreadable result part {path} ({type(exc).__name__}: {exc}); its rows "
        f"are ignored until it is removed (rm '{path}') or its case ({case_hash}) is run "
        f"again into run {path.parent.name!r}, which rewrites it (resuming that run does: "
        f"an unreadable part does not count as finished)"
    )
    # filename/lineno name the part itself, so the warning shows no line of this module
    warnings.warn_explicit(message, RuntimeWarning, filename=str(path), lineno=0,
                           module="santa_bench.results", registry={})


def _concat(tables: list[pa.Table]) -> pd.DataFrame:
    """Return the tables as one DataFrame, columns unioned (missing values: NA).

    One Arrow concatenation and one conversion; where a column's types cannot be unified
    (a string in one part, a number in another) the parts are converted in groups of one
    schema each and joined by pandas, which keeps such a column as objects.
    """
    try:
        return pa.concat_tables(tables, promote_options="permissive").to_pandas()
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        pass
    groups: dict[pa.Schema, list[int]] = {}
    for index, table in enumerate(tables):
        groups.setdefault(table.schema, []).append(index)
    frames = []
    for members in groups.values():
        frame = pa.concat_tables([tables[i] for i in members]).to_pandas()
        frame.index = [i for i in members for _ in range(tables[i].num_rows)]
        frames.append(frame)
    data = pd.concat(frames, sort=False).sort_index(kind="stable")
    return data.reset_index(drop=True)


def _read_json(path: Path) -> dict[str, Any] | None:
    """Return the JSON object in `path`, None if absent, or None with a warning if unreadable."""
    if not path.exists():
        return None
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        warnings.warn(f"skipping unreadable run record {path}: {exc}", RuntimeWarning, stacklevel=3)
        return None
    return record if isinstance(record, dict) else None


def _pandas_dtype(column: str) -> str:
    """Return the pandas dtype of a fixed column in an empty frame."""
    return "float64" if column == "value" else "str"
