"""Running cases: skip finished ones, run the rest on an executor, write each case's rows.

Used by ``santa-bench kernel`` and ``santa-bench sweep``. Executors:

- ``local``: one runner in this process, cases in order (vendor baselines first).
- a device pool (``devices=("0", "1")``): one spawned worker process per device, each
  pinned with ``CUDA_VISIBLE_DEVICES`` (``"cpu"`` tokens start CPU workers, for tests);
  work units come from one queue (dynamic), and each worker writes its cases' parts
  into the same run folder (parts are per-case atomic files, so this is safe).
- ``ray``: each work unit is a Ray task that needs one GPU (``num_cpus=1`` for CPU
  cases); rows come back to the driver, which writes them to its store.

A work unit is one case, except that every case of a shape group (same shape, dtype,
layout, device, timing mode) that includes a vendor dense baseline travels together,
so that its ``speedup_vs_best_dense`` is a ratio measured in one process, and the
accuracy cases that share their prompts travel together: each batch of prompts is
prefilled once and decoded by every method of the group before the next batch.
Every row carries ``device_id`` (where it ran) and ``command`` (the command line that
reproduces that one case). A case that raises, or runs out of device memory, becomes
a ``failed`` row with the reason and the run goes on.
"""

from __future__ import annotations

import contextlib
import math
import os
import queue
import shlex
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from santa_bench import environment, results
from santa_bench.units import format_size

EXECUTORS = ("local", "ray")


class ExecutorError(ValueError):
    """A bad executor or device request."""


class StoreUnwritable(ExecutorError):
    """The result store's folder cannot be written (read-only, not a folder, no access)."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during a run, with the :class:`Outcome` so far (rows of finished cases are
    written; ``not_run`` holds the rest)."""

    def __init__(self, outcome: Outcome) -> None:
        super().__init__()
        self.outcome = outcome


@dataclass(frozen=True)
class RunOptions:
    """How to run cases (not part of any case, so not in the config hash)."""

    cpu_budget_s: float = 1.0
    gpu_budget_ms: float = 300.0
    force: bool = False
    run_id: str | None = None
    executor: str = "local"
    devices: tuple[str, ...] = ()


@dataclass
class Outcome:
    """What a call of :func:`run_cases` did."""

    total: int
    skipped: int
    results: list[tuple[dict[str, Any], list[dict[str, Any]]]] = field(default_factory=list)
    not_run: list[dict[str, Any]] = field(default_factory=list)
    run_path: str | None = None
    stored: list[tuple[dict[str, Any], list[dict[str, Any]]]] = field(default_factory=list)
    """The skipped cases with their stored rows (the newest run's), for the tables."""

    @property
    def shown(self) -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
        """Every case with its rows: stored ones (skipped) first, then those run now."""
        return self.stored + self.results

    @property
    def failed(self) -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
        """The cases with at least one ``failed`` row."""
        return [(c, rows) for c, rows in self.results if _failed(rows)]


def case_label(case: dict[str, Any]) -> str:
    """Returns a short label such as ``santa-prop S=128 ctx=32k B=1``."""
    budget = f" S={case['S']}" if case.get("S") is not None else ""
    ctx = f" ctx={format_size(int(case['ctx']))}" if case.get("ctx") else ""
    batch = f" B={case['batch']}" if case.get("batch") is not None else ""
    return f"{case.get('method', case.get('kind', 'case'))}{budget}{ctx}{batch}"


def case_command(case: dict[str, Any]) -> str:
    """Returns the command line that reproduces ``case`` alone (by its runner kind); a
    plugin's method is loaded with ``--plugin`` first."""
    if case.get("kind") == "accuracy":  # names the plugins of its method and task itself
        from santa_bench.runners.tasks import case_command as task_command

        return task_command(case)
    if case.get("kind") == "kernel":
        from santa_bench.runners.kernel import case_command as command_of
    elif case.get("kind") == "fidelity":
        from santa_bench.runners.fidelity import case_command as command_of
    elif case.get("kind") == "e2e":
        from santa_bench.e2e.runner import case_command as command_of
    else:
        raise ValueError(f"no command line for cases of kind {case.get('kind')!r}")
    return _with_plugin(command_of(case), case)


def _with_plugin(command: str, case: dict[str, Any]) -> str:
    """``command`` with ``--plugin MODULE`` after ``santa-bench`` where the case's method
    comes from a plugin."""
    from santa_bench import plugins
    from santa_bench.methods import REGISTRY, MethodError

    try:
        module = REGISTRY.get(str(case.get("method"))).module
    except MethodError:
        return command
    extra = plugins.plugin_args([module])
    if not extra or not command.startswith("santa-bench "):
        return command
    return "santa-bench " + shlex.join(extra) + command[len("santa-bench"):]


def failed_rows(reason: str) -> list[dict[str, Any]]:
    """Returns the one ``failed`` latency row that records a case that could not run."""
    return [
        {"metric": "latency", "value": math.nan, "unit": "us", "status": "failed", "reason": reason}
    ]


def parse_devices(text: str | None) -> tuple[str, ...]:
    """Parses ``--devices 0,1`` or ``cpu,cpu``: GPU indices or ``cpu``, one worker each."""
    tokens = tuple(t.strip() for t in (text or "").split(",") if t.strip())
    for token in tokens:
        if token != "cpu" and not token.isdigit():
            raise ExecutorError(f"--devices: expected GPU indices or 'cpu', got {token!r}")
    if tokens and len({t for t in tokens if t != "cpu"}) != sum(t != "cpu" for t in tokens):
        raise ExecutorError(f"--devices: a GPU is named twice in {text!r}")
    if len(set(tokens) & {"cpu"}) and any(t != "cpu" for t in tokens):
        raise ExecutorError("--devices: mix of cpu and GPU workers")
    return tokens


class CaseWorker:
    """Runs cases with one kernel runner and writes each case's rows into ``run``."""

    def __init__(
        self,
        run: results.Run,
        store_root: str,
        options: RunOptions,
        device_id: str,
        copy_bandwidth_gbps: float | None = None,
        recall: bool = True,
    ) -> None:
        self.run_folder = run
        self.store = results.ResultStore(store_root)
        self.device_id = device_id
        self.options = options
        self.copy_bandwidth_gbps = copy_bandwidth_gbps
        self.recall = recall
        self.runners: dict[str, Any] = {}
        self.on_samples: Any = None  # progress callback handed to runners that count samples

    def _stored(self) -> tuple[Any, str]:
        """``(rows, fingerprint)`` for a runner's recall: every stored row, the newest
        measurement of a case last (this run's own last of all)."""
        return (self.store.load_latest_last(self.run_folder.run_id),
                self.run_folder.env_fingerprint)

    def _own_rows(self) -> tuple[Any, str]:
        """``(rows, fingerprint)`` of this run alone: the dense timings a resumed run's
        speedups and floors are taken against (speed is never compared across runs)."""
        return (self.store.load(runs=[self.run_folder.run_id]),
                self.run_folder.env_fingerprint)

    def runner(self, kind: str) -> Any:
        """Returns the runner of a case kind (kernel, fidelity, accuracy), made on first use."""
        if kind not in self.runners:
            if kind == "kernel":
                from santa_bench.runners.kernel import KernelRunner

                runner = KernelRunner(
                    cpu_budget_s=self.options.cpu_budget_s,
                    gpu_budget_ms=self.options.gpu_budget_ms,
                    copy_bandwidth_gbps=self.copy_bandwidth_gbps,
                )
                if self.recall:  # vendor baselines timed earlier in this run (resumed)
                    runner.recall_baselines(*self._own_rows())
            elif kind == "fidelity":
                from santa_bench.runners.fidelity import FidelityRunner

                runner = FidelityRunner()
            elif kind == "accuracy":
                from santa_bench.runners.tasks import TaskRunner

                runner = TaskRunner()
                if self.recall:  # dense scores of a resumed run give retention
                    runner.recall(*self._stored())
            elif kind == "e2e":
                from santa_bench.e2e.runner import E2ERunner

                runner = E2ERunner()
                if self.recall:  # dense decode runs of this run give a resumed run speedups
                    runner.recall(*self._own_rows())
            else:
                raise ValueError(f"no runner for cases of kind {kind!r}")
            if hasattr(runner, "on_samples"):
                runner.on_samples = lambda count: self.on_samples and self.on_samples(count)
            self.runners[kind] = runner
        return self.runners[kind]

    def run(self, case: dict[str, Any]) -> list[dict[str, Any]]:
        """Returns the case's rows (``failed`` rows when it raises), with ``device_id``."""
        try:
            runner = self.runner(case.get("kind", "kernel"))
        except ValueError as exc:
            return [{**row, "device_id": self.device_id} for row in failed_rows(str(exc))]
        rows = run_one(runner, case)
        return [{**row, "device_id": self.device_id} for row in rows]

    def run_group(self, cases: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
        """Each case's rows of accuracy cases that share their prompts (one
        :func:`accuracy_groups` group: each batch prefilled once for all their methods)."""
        if len(cases) == 1:
            return [self.run(cases[0])]
        try:
            found = self.runner("accuracy").run_group(cases)
        except Exception as exc:  # every case of the group fails with it
            found = [exc] * len(cases)
        return [[{**row, "device_id": self.device_id} for row in
                 (error_rows(f) if isinstance(f, BaseException) else f)] for f in found]

    def write(self, case: dict[str, Any], rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Writes the case's part atomically (see :func:`write_case`)."""
        return write_case(self.store, self.run_folder, case, rows)


def run_one(runner: Any, case: dict[str, Any]) -> list[dict[str, Any]]:
    """Runs one case; an exception or an out-of-memory error becomes a ``failed`` row."""
    try:
        return runner.run(case)
    except Exception as exc:  # a failing case is recorded and the run goes on
        return error_rows(exc)


def error_rows(exc: BaseException) -> list[dict[str, Any]]:
    """The ``failed`` rows of a case that raised ``exc`` (out of memory: its first line)."""
    import torch

    if isinstance(exc, torch.OutOfMemoryError):
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        lines = str(exc).splitlines() or [type(exc).__name__]
        return failed_rows(f"out of memory: {lines[0]}")
    return failed_rows(f"{type(exc).__name__}: {exc}")


def write_case(
    store: results.ResultStore, run: results.Run, case: dict[str, Any], rows: list[dict]
) -> list[dict[str, Any]]:
    """Stores ``rows`` of ``case`` in ``run`` (with its reproducing command), replacing
    that run's part of the case and the case's failed parts anywhere.

    Returns the rows, or ``failed`` rows (reported, not stored) if the store refuses them.
    """
    try:
        # a re-run drops the case's failed parts; the run's own part is replaced by the
        # write, finished parts of other runs stay (a forced re-run adds a measurement)
        store.forget_failed(results.config_hash(case))
        run.write_case(case, rows, command=case_command(case))
    except ValueError as exc:
        return failed_rows(f"rows not stored: {exc}")
    except OSError as exc:  # the folder went read-only or full mid-run
        return failed_rows(f"rows not stored in {run.path}: {exc.strerror or exc}")
    return rows


def local_device_id(case_device: str) -> str:
    """Returns ``cpu`` or ``cuda:<index>`` for a case run in this process."""
    if case_device == "cuda":
        import torch

        return f"cuda:{torch.cuda.current_device()}"
    return case_device


def work_units(cases: list[dict[str, Any]]) -> list[list[int]]:
    """Returns case indices grouped into work units (see the module docstring)."""
    from santa_bench.methods import REGISTRY
    from santa_bench.runners.kernel import group_key
    from santa_bench.runners.tasks import group_key as prompts_key

    def vendor(case: dict[str, Any]) -> bool:
        return case["method"] in REGISTRY.names() and (
            REGISTRY.get(case["method"]).kernel_kind == "baseline"
        )

    def key(case: dict[str, Any]) -> tuple:
        if case.get("kind") == "accuracy":
            return ("accuracy", *prompts_key(case))
        return group_key(case)

    grouped = {key(c) for c in cases if vendor(c) or c.get("kind") == "accuracy"}
    units: list[list[int]] = []
    by_key: dict[tuple, list[int]] = {}
    for index, case in enumerate(cases):
        if key(case) not in grouped:
            units.append([index])
        elif key(case) in by_key:
            by_key[key(case)].append(index)
        else:
            by_key[key(case)] = [index]
            units.append(by_key[key(case)])
    return [sorted(u, key=lambda i: not vendor(cases[i])) for u in units]


def accuracy_groups(cases: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """``cases`` in order, the accuracy cases that share their prompts (one
    :func:`santa_bench.runners.tasks.group_key`) together at the first one's place: they
    run as one group, each batch of prompts prefilled once; other cases alone."""
    from santa_bench.runners.tasks import group_key

    groups: list[list[dict[str, Any]]] = []
    by_key: dict[tuple, list[dict[str, Any]]] = {}
    for case in cases:
        if case.get("kind") != "accuracy":
            groups.append([case])
            continue
        key = group_key(case)
        if key not in by_key:
            by_key[key] = []
            groups.append(by_key[key])
        by_key[key].append(case)
    return groups


def case_weight(case: dict[str, Any]) -> int:
    """Units of work of a case on the progress bar: its samples (accuracy), else 1."""
    return max(1, int(case.get("n") or 1)) if case.get("kind") == "accuracy" else 1


class _Progress:
    """Rich progress: work done/total (cases; samples x methods for accuracy cases),
    ETA, current case(s), failures so far."""

    def __init__(self, console: Console, total: int, title: str,
                 weighted: bool = False) -> None:
        self.weighted = weighted
        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            TextColumn("[red]{task.fields[failed]} failed[/] {task.fields[current]}"),
            console=console,
            transient=True,
        )
        self.title = title
        self.failures = 0
        self.current: dict[str, str] = {}
        self.left: dict[str, int] = {}  # units of the running case not yet advanced
        self.task = self.progress.add_task(title, total=total, failed=0, current="")

    def __enter__(self) -> _Progress:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.__exit__(*exc)

    def start(self, where: str, case: dict[str, Any]) -> None:
        self.current[where] = case_label(case)
        self.left[where] = case_weight(case) if self.weighted else 1
        self._refresh()

    def start_group(self, where: str, cases: list[dict[str, Any]]) -> None:
        """Starts cases that run together (an accuracy group)."""
        self.start(where, cases[0])
        if len(cases) > 1:
            self.current[where] += f" +{len(cases) - 1} methods"
            self.left[where] = sum(case_weight(c) if self.weighted else 1 for c in cases)
            self._refresh()

    def samples(self, where: str, count: int) -> None:
        """Advances the bar by ``count`` finished samples of the running case."""
        step = min(count, self.left.get(where, 0))
        self.left[where] = self.left.get(where, 0) - step
        self.progress.advance(self.task, step)

    def done(self, where: str, rows: list[dict[str, Any]]) -> None:
        self.current.pop(where, None)
        self.failures += _failed(rows)
        self.progress.advance(self.task, self.left.pop(where, 1))
        self._refresh()

    def _refresh(self) -> None:
        shown = " | ".join(
            f"{w}: {label}" if len(self.current) > 1 else label for w, label in self.current.items()
        )
        self.progress.update(self.task, failed=self.failures, current=shown)


def _failed(rows: list[dict[str, Any]]) -> bool:
    return any(r.get("status") == "failed" for r in rows)


def run_cases(
    cases: list[dict[str, Any]],
    store: results.ResultStore,
    env: dict[str, Any] | None,
    options: RunOptions = RunOptions(),
    *,
    console: Console | None = None,
    title: str = "cases",
) -> Outcome:
    """Runs the cases not yet in ``store`` (same config hash and environment fingerprint).

    ``env`` is the run's environment record (collected here when None; with the Ray
    executor it is collected on a Ray worker, where the cases run). Prints what was
    skipped, a progress bar and a summary of failures; returns the :class:`Outcome`.
    """
    if console is None:
        from santa_bench.console import make_console

        console = make_console()
    if options.executor not in EXECUTORS:
        raise ExecutorError(f"--executor: expected one of {EXECUTORS}, got {options.executor!r}")
    if options.executor == "ray" and options.devices:
        raise ExecutorError("--devices: not with --executor ray (Ray places the tasks)")
    devices_of_cases = {c.get("device") for c in cases}
    if options.executor == "ray":
        env = _ray_environment(env, devices_of_cases)
    else:
        env = env if env is not None else environment.collect_environment()
        _check_devices(options.devices, devices_of_cases)
    _refuse_repeats(cases)
    fingerprint = environment.environment_fingerprint(env)
    done = set() if options.force else store.completed(fingerprint)
    todo = [c for c in cases if results.config_hash(c) not in done]
    outcome = Outcome(total=len(cases), skipped=len(cases) - len(todo))
    if outcome.skipped:
        console.print(f"{outcome.skipped} of {len(cases)} cases already in {store.root}: skipped")
        skipped = [c for c in cases if results.config_hash(c) in done]
        outcome.stored = stored_rows(store, skipped, fingerprint)
    if not todo:
        console.print("nothing to do (use --force to re-run); the stored results:")
        return outcome
    for line in _estimate(todo, store):
        console.print(line, soft_wrap=True, markup=False, highlight=False)
    if (
        "cuda" in devices_of_cases
        and options.executor != "ray"
        and not env.get("copy_bandwidth_gbps")
    ):
        from santa_bench.timing import copy_bandwidth_gbps

        env["copy_bandwidth_gbps"] = copy_bandwidth_gbps("cuda")
    try:
        run = store.start_run(env, run_id=options.run_id)
    except OSError as exc:
        why = exc.strerror or type(exc).__name__
        message = f"--results {store.root}: cannot write results there ({why})"
        raise StoreUnwritable(message) from None
    except ValueError as exc:  # a run id that is no folder name, or another environment's
        raise ExecutorError(f"--run-id: {exc}") from None
    outcome.run_path = str(run.path)
    from santa_bench.methods import REGISTRY

    def baseline_first(case: dict[str, Any]) -> bool:
        known = case.get("method") in REGISTRY.names()
        return not (known and REGISTRY.get(case["method"]).kernel_kind == "baseline")

    todo = sorted(todo, key=baseline_first)  # stable: later cases compare against them
    if any(c.get("kind") == "e2e" for c in todo):
        from santa_bench.e2e.runner import order_cases

        todo = order_cases(todo)  # one prefill per group, its dense backends first
    local = options.executor != "ray" and not options.devices
    total = sum(case_weight(c) for c in todo) if local else len(todo)
    try:
        with _Progress(console, total, title, weighted=local) as progress:
            if options.executor == "ray":
                _run_ray(todo, store, run, options, env, progress, outcome)
            elif options.devices:
                _run_pool(todo, store, run, options, env, progress, outcome)
            else:
                worker = CaseWorker(run, str(store.root), options, "",
                                    env.get("copy_bandwidth_gbps"))
                worker.on_samples = lambda count: progress.samples("local", count)
                for group in accuracy_groups(todo):
                    worker.device_id = local_device_id(group[0]["device"])
                    progress.start_group("local", group)
                    for case, found in zip(group, worker.run_group(group), strict=True):
                        rows = worker.write(case, found)
                        outcome.results.append((case, rows))
                        progress.failures += _failed(rows)
                    progress.done("local", [])
    except KeyboardInterrupt:
        finished = {id(case) for case, _ in outcome.results}
        outcome.not_run = [case for case in todo if id(case) not in finished]
        raise Interrupted(outcome) from None
    if "cuda" in devices_of_cases and options.executor != "ray":
        from santa_bench.gpu_state import gpu_state_record

        store.annotate_run(run.run_id, gpu_state_record("end"))
    print_outcome(outcome, console)
    return outcome


def _estimate(todo: list[dict[str, Any]], store: results.ResultStore) -> list[str]:
    """The estimated time of the accuracy cases to run (see ``accuracy.estimate``)."""
    if not any(c.get("kind") == "accuracy" for c in todo):
        return []
    from santa_bench.accuracy.estimate import estimate_lines

    try:
        return estimate_lines(todo, store.load())
    except Exception:  # an estimate never stops a run
        return []


def stored_rows(
    store: results.ResultStore, cases: list[dict[str, Any]], fingerprint: str
) -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """Each case's rows as stored under ``fingerprint`` (of its newest finished run); a
    case whose rows cannot be read is left out."""
    import pyarrow.parquet as pq

    dates = {str(r.get("run_id")): str(r.get("date") or "") for r in store.runs()}
    found = []
    for case in cases:
        case_hash = results.config_hash(case)
        newest: tuple[tuple[str, str], list[dict[str, Any]]] | None = None
        for path in store.root.glob(f"*/part-{case_hash}.parquet"):
            try:
                records = pq.read_table(path).to_pylist()
            except Exception:  # unreadable: results.py warns where it loads
                continue
            if not records or any(
                r.get("status") == "failed" or r.get("env_fingerprint") != fingerprint
                for r in records
            ):
                continue
            key = (dates.get(path.parent.name, ""), path.parent.name)
            if newest is None or key > newest[0]:
                newest = (key, records)
        if newest is not None:
            rows = [{k: v for k, v in r.items() if v is not None} for r in newest[1]]
            found.append((case, rows))
    return found


def _refuse_repeats(cases: list[dict[str, Any]]) -> None:
    """ExecutorError where two cases are one (the same config hash): the second would
    overwrite the first's stored rows."""
    seen: set[str] = set()
    for case in cases:
        key = results.config_hash(case)
        if key in seen:
            raise ExecutorError(
                f"{case_label(case)} is asked twice: two method specs "
                "that are one configuration once defaults are filled, or a spec's own value "
                "and a grid option's (--S, --batch, ...); name it once")
        seen.add(key)


def print_outcome(outcome: Outcome, console: Console) -> None:
    """Prints the final summary: counts, then one line per failed or unrun case."""
    failed = outcome.failed
    ran = len(outcome.results)
    console.print(
        f"{outcome.total} cases: {ran - len(failed)} ran, {len(failed)} failed, "
        f"{outcome.skipped} skipped (in the store)"
        + (f", {len(outcome.not_run)} not run (re-run to resume)" if outcome.not_run else "")
    )
    if failed:
        table = Table(title="failed cases")
        table.add_column("case", no_wrap=True)
        table.add_column("reason", overflow="fold")
        for case, rows in failed:
            reasons = {r["reason"] for r in rows if r.get("status") == "failed"}
            table.add_row(case_label(case), "; ".join(sorted(reasons)))
        console.print(table)


# ---------------------------------------------------------------- device pool
def _check_devices(devices: tuple[str, ...], case_devices: set[Any]) -> None:
    if not devices:
        if "cuda" in case_devices:
            import torch

            if not torch.cuda.is_available():
                raise ExecutorError("the cases run on cuda, but no CUDA device is visible")
        return
    if devices[0] == "cpu" and case_devices - {"cpu"}:
        raise ExecutorError(f"--devices {','.join(devices)}: the cases run on {case_devices}")
    if devices[0] != "cpu":
        import torch

        if case_devices - {"cuda"}:
            raise ExecutorError(f"--devices {','.join(devices)}: the cases run on {case_devices}")
        count = torch.cuda.device_count()
        if missing := [d for d in devices if int(d) >= count]:
            raise ExecutorError(f"--devices: no GPU {missing} here ({count} visible)")


@contextlib.contextmanager
def _environ(**values: str) -> Iterator[None]:
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in old.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _pool_worker(
    device_id: str,
    run: results.Run,
    store_root: str,
    options: RunOptions,
    copy_bandwidth: float | None,
    tasks: Any,
    events: Any,
) -> None:
    """Worker process: takes work units from ``tasks`` until None; reports on ``events``."""
    from santa_bench import plugins

    plugins.load()  # the driver's plugins ($SANTA_BENCH_PLUGINS, entry points)
    parent = os.getppid()
    worker = CaseWorker(run, store_root, options, device_id, copy_bandwidth)
    while True:
        unit = tasks.get()
        if unit is None or os.getppid() != parent:  # done, or the driver died
            return
        if all(case.get("kind") == "accuracy" for _, case in unit):  # one prompt group
            events.put(("start", device_id, unit[0][0]))
            found = worker.run_group([case for _, case in unit])
            for (index, case), rows in zip(unit, found, strict=True):
                events.put(("done", device_id, index, worker.write(case, rows)))
            continue
        for index, case in unit:
            events.put(("start", device_id, index))
            rows = worker.write(case, worker.run(case))
            events.put(("done", device_id, index, rows))


def _run_pool(todo, store, run, options, env, progress, outcome) -> None:
    import multiprocessing

    spawn = multiprocessing.get_context("spawn")
    tasks, events = spawn.Queue(), spawn.Queue()
    for unit in work_units(todo):
        tasks.put([(i, todo[i]) for i in unit])
    workers: dict[str, Any] = {}
    for number, token in enumerate(options.devices):
        device_id = f"cpu:{number}" if token == "cpu" else f"cuda:{token}"
        pin = {} if token == "cpu" else {"CUDA_VISIBLE_DEVICES": token}
        args = (
            device_id,
            run,
            str(store.root),
            options,
            env.get("copy_bandwidth_gbps"),
            tasks,
            events,
        )
        with _environ(**pin):
            process = spawn.Process(target=_pool_worker, args=args, daemon=True)
            process.start()
        workers[device_id] = process
        tasks.put(None)  # one stop sign per worker, after every unit
    pending = set(range(len(todo)))
    in_flight: dict[str, int] = {}
    try:
        while pending:
            try:
                event = events.get(timeout=0.5)
            except queue.Empty:
                _reap(workers, in_flight, pending, todo, store, run, progress, outcome)
                if not any(p.is_alive() for p in workers.values()):
                    break
                continue
            if event[0] == "start":
                in_flight[event[1]] = event[2]
                progress.start(event[1], todo[event[2]])
            else:
                _, device_id, index, rows = event
                in_flight.pop(device_id, None)
                pending.discard(index)
                outcome.results.append((todo[index], rows))
                progress.done(device_id, rows)
    finally:
        for process in workers.values():
            process.join(timeout=5)
            if process.is_alive():
                process.terminate()
    outcome.not_run += [todo[i] for i in sorted(pending)]


def _reap(workers, in_flight, pending, todo, store, run, progress, outcome) -> None:
    """A worker that died mid-case (crash, killed): its case becomes a failed row."""
    for device_id, process in workers.items():
        if process.exitcode not in (None, 0) and device_id in in_flight:
            index = in_flight.pop(device_id)
            rows = [
                {**r, "device_id": device_id}
                for r in failed_rows(f"worker {device_id} exited with code {process.exitcode}")
            ]
            rows = write_case(store, run, todo[index], rows)
            pending.discard(index)
            outcome.results.append((todo[index], rows))
            progress.done(device_id, rows)


# ---------------------------------------------------------------- Ray
def import_ray() -> Any:
    """Returns the ``ray`` module, or raises ExecutorError saying how to install it."""
    try:
        import ray
    except ImportError:
        raise ExecutorError(
            "--executor ray needs Ray: pip install -e '.[ray]' (or pip install ray)"
        ) from None
    return ray


def _resources(case_devices: set[Any]) -> dict[str, float]:
    return {"num_gpus": 1} if "cuda" in case_devices else {"num_cpus": 1}


def _ray_environment(env: dict[str, Any] | None, case_devices: set[Any]) -> dict[str, Any]:
    """Collects the environment on a Ray worker (where the cases will run)."""
    ray = import_ray()
    if not ray.is_initialized():
        ray.init()  # RAY_ADDRESS (or a running local cluster) is joined, else one is started
    command = (env or {}).get("command") or environment.collect_environment().get("command")
    remote = ray.remote(_ray_collect_environment).options(**_resources(case_devices))
    return ray.get(remote.remote(command, "cuda" in case_devices))


def _ray_collect_environment(command: str, cuda: bool) -> dict[str, Any]:
    env = environment.collect_environment(command)
    if cuda:
        from santa_bench.timing import copy_bandwidth_gbps

        env["copy_bandwidth_gbps"] = copy_bandwidth_gbps("cuda")
    return env


def _ray_unit(
    unit: list[tuple[int, dict[str, Any]]], options: RunOptions, copy_bandwidth: float | None
) -> list[tuple[int, list[dict[str, Any]]]]:
    """Ray task: runs a work unit, returns each case's rows (the driver writes them)."""
    import ray

    from santa_bench.runners.kernel import KernelRunner

    context = ray.get_runtime_context()
    gpus = context.get_accelerator_ids().get("GPU", [])
    node = context.get_node_id()[:8]
    device_id = f"ray:{node}:" + (f"cuda:{','.join(map(str, gpus))}" if gpus else "cpu")
    runner = KernelRunner(
        cpu_budget_s=options.cpu_budget_s,
        gpu_budget_ms=options.gpu_budget_ms,
        copy_bandwidth_gbps=copy_bandwidth,
    )
    return [
        (index, [{**row, "device_id": device_id} for row in run_one(runner, case)])
        for index, case in unit
    ]


def _run_ray(todo, store, run, options, env, progress, outcome) -> None:
    ray = import_ray()
    remote = ray.remote(_ray_unit).options(**_resources({c.get("device") for c in todo}))
    refs: dict[Any, list[int]] = {}
    for unit in work_units(todo):
        ref = remote.remote([(i, todo[i]) for i in unit], options, env.get("copy_bandwidth_gbps"))
        refs[ref] = unit
    progress.current["ray"] = f"{len(refs)} tasks submitted"
    waiting = list(refs)
    while waiting:
        ready, waiting = ray.wait(waiting, num_returns=1)
        unit = refs[ready[0]]
        try:
            returned = ray.get(ready[0])
        except Exception as exc:  # the task or its worker died: record, go on
            reason = f"ray task failed: {type(exc).__name__}: {str(exc).splitlines()[0]}"
            returned = [(i, failed_rows(reason)) for i in unit]
        for index, returned_rows in returned:
            rows = write_case(store, run, todo[index], returned_rows)
            outcome.results.append((todo[index], rows))
            progress.done("ray", rows)
        progress.current["ray"] = f"{len(waiting)} tasks in flight"
