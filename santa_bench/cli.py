"""The santa-bench command line (Typer): list, env, kernel."""

from __future__ import annotations

import itertools
import math
import shlex
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from santa_bench import environment, results
from santa_bench.cli_options import (
    Force,
    ResultsDir,
    RunId,
    exit_if_every_case_failed,
    fail,
    make_console,
    option_list,
    run_cases_or_exit,
)
from santa_bench.methods import REGISTRY, MethodError, parse_method_specs
from santa_bench.units import format_size, parse_list, parse_size_list

app = typer.Typer(
    help="Reproduce, benchmark and extend stochastic sparse attention (SANTA, S2ANTA, SANTA++).",
    no_args_is_help=True,
    add_completion=False,
)
console = make_console()

DEFAULT_METHODS = "dense,santa-iid,santa-strat,santa-sys,santa-flash,santa-prop"


CPU_NOTE = (
    "note: on a CPU every method runs its PyTorch reference, so these are wall-clock "
    "times of reference code, not kernel speed: they do not compare the methods (time "
    "the kernels on a GPU)"
)


def _fail(message: str) -> None:
    fail(console, message)


@app.callback()
def load_plugins(
    plugin: Annotated[
        list[str] | None,
        typer.Option(
            "--plugin",
            metavar="MODULE",
            help="Import MODULE first (repeatable): a module of your own that registers "
            "methods, tasks or baselines, which then work like the built-in ones. Plugins "
            "of the santa_bench.plugins entry point group load without it.",
        ),
    ] = None,
) -> None:
    """Reproduce, benchmark and extend stochastic sparse attention (SANTA, S2ANTA, SANTA++)."""
    from santa_bench import plugins

    try:
        plugins.load(plugin or ())
    except plugins.PluginError as exc:
        _fail(str(exc))


@app.command("list")
def list_methods() -> None:
    """List every registered method with its parameters and availability here, then every
    accuracy task."""
    table = Table(title="santa-bench methods")
    columns = ("name", "family", "module", "parameters (defaults)", "kernel", "available",
               "description")
    for column in columns:
        table.add_column(column, overflow="fold", no_wrap=column == "name")
    for method in REGISTRY:
        ok, reason = method.available()
        params = ", ".join(f"{p.name}={p.default}" for p in method.params) or "-"
        table.add_row(
            method.name,
            method.family,
            method.module or "-",
            params,
            method.kernel_kind,
            "[green]yes[/]" if ok else f"[red]no[/]: {reason}",
            method.description,
        )
    console.print(table)
    _list_baselines()
    _list_tasks()


def _list_baselines() -> None:
    """The table of dense baselines: the kernels `kernel` times, the backends `e2e` decodes
    with (``--dense-backends``)."""
    from santa_bench.baselines import BASELINES

    table = Table(title="santa-bench dense baselines")
    for column in ("name", "kernel (timed)", "e2e decode", "description"):
        table.add_column(column, overflow="fold", no_wrap=column == "name")
    for entry in BASELINES.values():
        table.add_row(entry.name, "yes" if entry.timed else "-",
                      "yes" if entry.decode else "-", entry.description)
    console.print(table)


def _list_tasks() -> None:
    """The table of registered accuracy tasks (`santa-bench accuracy task NAME`)."""
    from santa_bench.accuracy.registry import TASKS

    table = Table(title="santa-bench tasks")
    for column in ("name", "module", "context", "description"):
        table.add_column(column, overflow="fold", no_wrap=column == "name")
    for task in TASKS:
        table.add_row(task.name, task.module or "-", "ctx" if task.long_context else "-",
                      task.description)
    console.print(table)


@app.command("env")
def show_env() -> None:
    """Print the environment every run records (device, GPU, versions, git SHA)."""
    env = environment.collect_environment()
    table = Table(title="environment", show_header=False)
    for key, value in env.items():
        table.add_row(key, str(value))
    table.add_row("fingerprint", environment.environment_fingerprint(env))
    console.print(table)


@app.command("report")
def report(
    results_dir: Annotated[
        Path,
        typer.Option("--results", help="Result store root to read, with the stores below it."),
    ] = Path("results"),
    run: Annotated[
        str | None, typer.Option(help="Comma list of run ids to include (default: all).")
    ] = None,
    matrix: Annotated[
        bool,
        typer.Option(
            "--matrix",
            help="Print a speedup matrix instead (a line per ctx, batch and method, a "
            "column per sample budget S: latency and speedup vs the best dense baseline).",
        ),
    ] = False,
) -> None:
    """Print Markdown tables of the kernel results in a store (the tables of docs/benchmarks.md)."""
    from santa_bench.report import kernel_table, speedup_matrix
    from santa_bench.stores import StoreSet

    try:
        frame = StoreSet(results_dir).load(parse_list(run) or None)
    except ValueError as exc:  # an unknown --run
        _fail(str(exc))
        return
    print(speedup_matrix(frame) if matrix else kernel_table(frame))


@app.command("pareto")
def pareto(
    model: Annotated[str, typer.Option(
        help="Model of the accuracy rows (catalog name, path or hub id as in the runs).")],
    results_dir: Annotated[Path, typer.Option(
        "--results", help="Result store root holding both the accuracy and kernel rows.")
    ] = Path("results"),
    ctx: Annotated[str, typer.Option(help="Context of the RULER rows and kernel rows.")
                   ] = "32k",
    batch: Annotated[str, typer.Option(help="Kernel batch sizes to report, comma list.")
                     ] = "1,8",
    shape: Annotated[str | None, typer.Option(
        help="Attention shape of the kernel rows, HEADS/KV_HEADS/HEAD_DIM, and /LAYERS, the "
        "model's layer count, to time runs with --dense-layers (default: the catalog "
        "model's).")] = None,
    gpu: Annotated[str | None, typer.Option(
        help="GPU name of the runs to join (default: the accuracy runs' GPU).")] = None,
    out: Annotated[Path | None, typer.Option(
        help="Write OUT.md, OUT.csv and OUT.png (speedup against retention, the front "
        "drawn); default: print the Markdown only.")] = None,
) -> None:
    """The verdict: speedup and retention of the same configurations, the Pareto front, and
    per task family the fastest configuration within 1 point and 99% retention of dense."""
    from santa_bench import pareto as verdict_mod
    from santa_bench.stores import StoreSet

    try:
        ctx_tokens = parse_size_list(ctx)
        batches = [int(b) for b in parse_list(batch)]
        if len(ctx_tokens) != 1 or not batches or min(batches) < 1:
            raise ValueError("--ctx takes one context and --batch positive integers")
        store = StoreSet(results_dir)
        result = verdict_mod.verdict(
            store.load(), store.runs(), model,
            shape=verdict_mod.Shape.parse(shape) if shape else None,
            ctx=ctx_tokens[0], batches=tuple(batches), gpu=gpu)
    except (ValueError, verdict_mod.ParetoError) as exc:
        _fail(str(exc))
        return
    command = "santa-bench " + shlex.join(sys.argv[1:])
    if out is None:
        print(verdict_mod.markdown(result, command))
        return
    try:
        paths = verdict_mod.write(result, out, command)
    except OSError as exc:
        _fail(f"--out {out}: {exc.strerror or exc}")
        return
    print("\n".join(map(str, paths)))


from santa_bench.accuracy.cli import app as accuracy_app  # noqa: E402
from santa_bench.plots import plot_command  # noqa: E402

app.add_typer(accuracy_app, name="accuracy")

app.command("plot")(plot_command)

from santa_bench.e2e.cli import e2e_command  # noqa: E402

app.command("e2e")(e2e_command)

from santa_bench.capture import capture_command  # noqa: E402

app.command("capture")(capture_command)


def _device(requested: str) -> str:
    import torch

    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda" and not torch.cuda.is_available():
        _fail("--device cuda: no CUDA device is visible")
    if requested not in ("cpu", "cuda"):
        _fail(f"--device: expected auto, cpu or cuda, got {requested!r}")
    return requested


@app.command("kernel")
def kernel(
    ctx: Annotated[
        str | None,
        typer.Option(
            help="Context length(s), comma list; accepts 4k, 32k, 1m or integers (default: "
            "4k; with --inputs, the captured length)."
        ),
    ] = None,
    S: Annotated[
        str, typer.Option("--S", help="Sample budget(s) S for the sampling methods, comma list.")
    ] = "128",
    batch: Annotated[str, typer.Option(help="Batch size(s), comma list.")] = "1",
    M: Annotated[
        str | None, typer.Option("--M", help="SANTA++: teams selected per head, comma list.")
    ] = None,
    team_size: Annotated[
        str | None, typer.Option(help="SANTA++: team size(s) P, comma list.")
    ] = None,
    team_policy: Annotated[
        str | None, typer.Option(help="SANTA++: team index(es), contiguous and/or kmeans.")
    ] = None,
    baselines: Annotated[
        str,
        typer.Option(
            help="Dense baselines to time beside the methods: 'auto' (every vendor baseline "
            "plus triton-splitkv on a GPU; none on a CPU), 'none', or a comma list "
            "(sdpa-math, sdpa-flash, sdpa-cudnn, flashinfer-tc, flashinfer-cuda, "
            "flashinfer-fa3, flash-attn, triton-splitkv); those that cannot run here are "
            "recorded as skipped with the reason (flashinfer-fa3: Hopper GPUs only)."
        ),
    ] = "auto",
    methods: Annotated[
        str | None,
        typer.Option(
            help="Methods, comma list; parameters as name:key=value (see `santa-bench list`). "
            f"Default: {DEFAULT_METHODS}."
        ),
    ] = None,
    heads: Annotated[
        int | None,
        typer.Option(help="Query heads Hq (default: 32, Llama-3.1-8B; with --inputs, the file's).")
    ] = None,
    kv_heads: Annotated[
        int | None,
        typer.Option(help="KV heads Hkv; Hq must be a multiple (default: 8; with --inputs, "
                     "the file's).")
    ] = None,
    head_dim: Annotated[
        int | None, typer.Option(help="Head dimension d (default: 128; with --inputs, the file's).")
    ] = None,
    inputs: Annotated[
        Path | None,
        typer.Option(
            help="Time on a model's real q, K, V (a `santa-bench capture` file) instead of "
            "Gaussian noise: the attention shape is the file's; a batch element per captured "
            "layer (cycling), the query of the last captured position; a --ctx above the "
            "captured length tiles K/V (rows say inputs_tiled), below it keeps the first "
            "ctx keys."
        ),
    ] = None,
    dtype: Annotated[
        str, typer.Option(help="Storage dtype of Q/K/V: bf16, fp16 or fp32.")
    ] = "bf16",
    layout: Annotated[
        str, typer.Option(help="KV layout: contiguous (NHD) or paged.")
    ] = "contiguous",
    page_size: Annotated[int, typer.Option(help="Tokens per page for the paged layout.")] = 16,
    seed: Annotated[int, typer.Option(help="Seed of the inputs and of the samplers.")] = 0,
    device: Annotated[str, typer.Option(help="auto (GPU when present), cpu or cuda.")] = "auto",
    results_dir: ResultsDir = Path("results"),
    run_id: RunId = None,
    force: Force = False,
    graph: Annotated[
        bool,
        typer.Option(
            help="GPU: time CUDA-graph replays (as a serving engine runs decode); "
            "--no-graph times eager calls with CUDA events."
        ),
    ] = True,
    cold: Annotated[
        bool,
        typer.Option(
            "--cold/--warm",
            help="GPU: keep L2 cold by rotating copies of the inputs, as many as the "
            "bytes one call touches (the method's byte model) need to pass 3x the L2 "
            "between two uses of a copy, each copy with its own workspace (scratch such as "
            "SANTA's logit stash), enough of them to pass the L2 size too (rows record "
            "l2_state, copies, rotated_bytes, workspace_bytes). "
            "--warm reuses one copy.",
        ),
    ] = True,
    gpu_budget_ms: Annotated[
        float, typer.Option(help="GPU: milliseconds of timed repeats per case.")
    ] = 300.0,
    cpu_budget: Annotated[
        float, typer.Option(help="Seconds of wall-clock repeats per case on a CPU.")
    ] = 1.0,
) -> None:
    """Time one decode step of each method and measure its error against dense.

    Each (ctx, batch, method, S) is a case; finished cases already in the store are
    skipped (so an interrupted run resumes), unless --force.
    """
    from santa_bench.captured import describe_capture
    from santa_bench.runners.kernel import (
        KernelGrid,
        attention_shape,
        check_grid,
        describe_dropped,
        expand_cases,
    )

    try:
        on_device = _device(device)
        shape = attention_shape(
            str(inputs) if inputs else None,
            {"heads": heads, "kv_heads": kv_heads, "head_dim": head_dim},
            _flag,
        )
        if ctx is None:
            ctx = str(describe_capture(inputs, digest=False).ctx) if inputs else "4k"
        grid = KernelGrid(
            methods=_with_baselines(
                _with_team_options(parse_method_specs(methods or DEFAULT_METHODS),
                                   M, team_size, team_policy),
                baselines,
                on_device,
            ),
            ctx=_sizes("--ctx", ctx),
            batch=option_list("--batch", batch),
            S=option_list("--S", S),
            **shape,
            dtype=dtype,
            layout=layout,
            page_size=page_size,
            seed=seed,
            device=on_device,
            graph=graph,
            cold_l2=cold,
            inputs=str(inputs) if inputs else None,
        )
        check_grid(grid, _flag)
        dropped: list[dict] = []
        cases = expand_cases(grid, dropped)
    except (MethodError, ValueError) as exc:
        _fail(str(exc))
        return
    if dropped:
        console.print(f"[yellow]warning:[/] {describe_dropped(dropped)}", soft_wrap=True)
    if not cases:
        _fail("no case to run (every S is larger than every context?)")

    from santa_bench.execute import RunOptions

    command = shlex.join(["santa-bench", *sys.argv[1:]])
    options = RunOptions(
        cpu_budget_s=cpu_budget, gpu_budget_ms=gpu_budget_ms, force=force, run_id=run_id
    )
    store = results.ResultStore(results_dir)
    env = environment.collect_environment(command)
    outcome = run_cases_or_exit(cases, store, env, options, console=console, title="kernel")
    if outcome.shown:
        _print_summary(outcome.shown)
    if outcome.results:
        console.print(f"rows written to {outcome.run_path}")
    exit_if_every_case_failed(outcome, console)


@app.command("sweep")
def sweep(
    suite_file: Annotated[
        Path, typer.Argument(metavar="SUITE", help="Suite file (YAML): suites/smoke-kernel.yaml")
    ],
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the expanded cases as a table and exit.")
    ] = False,
    only: Annotated[
        str | None,
        typer.Option(
            help="Keep some cases: a comma list of method names (dense,santa-prop), or else "
            "a boolean expression over case keys in the suite's `where` syntax "
            '("ctx == 32768 and S <= 128"; a case without a named key is dropped).'
        ),
    ] = None,
    shard: Annotated[
        str | None,
        typer.Option(
            help="i/n: every n-th case of the expanded order from the i-th (0-based), "
            "taken before --only; the n shards partition the suite."
        ),
    ] = None,
    devices: Annotated[
        str | None,
        typer.Option(
            help="One worker process per device, cases from one queue: GPU indices (0,1,...), "
            "or cpu,cpu for CPU workers. Rows record device_id."
        ),
    ] = None,
    executor: Annotated[
        str,
        typer.Option(
            help="local (this machine), or ray: one Ray task per case (1 GPU, or 1 CPU for "
            "CPU cases) on the cluster at RAY_ADDRESS, else a local one; needs Ray installed."
        ),
    ] = "local",
    results_dir: ResultsDir = Path("results"),
    run_id: RunId = None,
    force: Force = False,
) -> None:
    """Run a suite file: its cases not yet in the store (so an interrupted sweep resumes).

    A case already stored (same config hash, same environment fingerprint) is skipped
    unless --force; each case's rows are written atomically as it finishes, with the
    `santa-bench kernel` command that reproduces it.
    """
    from santa_bench import execute
    from santa_bench import sweep as suites

    try:
        suite = suites.load_suite(suite_file)
        cases = suite.cases
        if shard:
            cases = suites.shard(cases, *suites.parse_shard(shard))
        if only:
            cases = suites.select_only(cases, only)
        options = execute.RunOptions(
            cpu_budget_s=suite.options.get("cpu_budget", 1.0),
            gpu_budget_ms=suite.options.get("gpu_budget_ms", 300.0),
            force=force,
            run_id=run_id,
            executor=executor,
            devices=execute.parse_devices(devices),
        )
    except (suites.SuiteError, execute.ExecutorError) as exc:
        _fail(str(exc))
        return
    command = shlex.join(["santa-bench", *sys.argv[1:]])
    env = environment.collect_environment(command)
    store = results.ResultStore(results_dir)
    if dry_run:
        stored = store.completed(environment.environment_fingerprint(env))
        console.print(suites.cases_table(suite, cases, len(suite.cases), stored))
        if not suite.implemented:
            console.print(f"runner {suite.runner} not implemented yet: nothing can run")
        return
    if not suite.implemented:
        _fail(
            f"{suite_file}: runner {suite.runner} not implemented yet (the suite is valid: "
            f"{len(cases)} cases; --dry-run lists them)"
        )
    if not cases:
        _fail("no case selected (see --only, --shard)")
    outcome = run_cases_or_exit(cases, store, env, options, console=console, title=suite.name)
    if outcome.shown and suite.runner == "kernel":
        _print_summary(outcome.shown)
    if outcome.results:
        console.print(f"rows written to {outcome.run_path}")
    exit_if_every_case_failed(outcome, console)


def _flag(name: str) -> str:
    """The command-line option of a case key: ``kv_heads`` -> ``--kv-heads``."""
    return "--" + name.replace("_", "-")


def _sizes(option: str, text: str) -> list[int]:
    """The sizes of ``option`` (``4k,32k``); a bad one raises ValueError naming the option."""
    try:
        return parse_size_list(text)
    except ValueError as exc:
        raise ValueError(f"{option}: {exc}") from None


def _with_team_options(
    parsed: list, M: str | None, team_size: str | None, policy: str | None
) -> list:
    """Expands the methods with SANTA++ parameters over --M, --team-size, --team-policy
    (a value in the method's own spec wins); other methods are left as they are."""
    options = (("M", "--M", M, int), ("team_size", "--team-size", team_size, int),
               ("policy", "--team-policy", policy, str))
    axes = [(name, option_list(option, text, kind))
            for name, option, text, kind in options if text is not None]
    expanded = []
    for method, overrides in parsed:
        known = {p.name for p in method.params}
        free = [(name, values) for name, values in axes if name in known and name not in overrides]
        names = [name for name, _ in free]
        for combo in itertools.product(*(values for _, values in free)):
            expanded.append((method, {**overrides, **dict(zip(names, combo, strict=True))}))
    return expanded


def _with_baselines(parsed: list, baselines: str, device: str) -> list:
    """Adds the requested dense baselines (``auto``: all of them on a GPU, none on a CPU)."""
    named = {m.name for m, _ in parsed}
    if baselines == "auto":
        wanted = [m.name for m in REGISTRY if m.family == "baseline"] if device == "cuda" else []
    elif baselines == "none":
        wanted = []
    else:
        wanted = parse_list(baselines)
        for name in wanted:
            if REGISTRY.get(name).family != "baseline":
                raise MethodError(f"--baselines: {name!r} is not a dense baseline")
    return parsed + [(REGISTRY.get(n), {}) for n in wanted if n not in named]



def _team_label(case: dict) -> str:
    """``M=..,P=..`` and the SANTA++ case's other parameters away from their defaults
    (``policy=kmeans``, ``reps=int8``, ...)."""
    from santa_bench.pareto import config_params  # the summary only: not at start-up

    if "M" not in case:
        return "-"
    extra = [f"{name}={text}" for name, text in (config_params(case) or [])
             if name not in ("M", "team_size")]
    return ",".join([f"M={case['M']}", f"P={case['team_size']}", *extra])


def _print_summary(summary: list[tuple[dict, list[dict]]]) -> None:
    on_cpu = any(case.get("device") == "cpu" for case, _ in summary)
    title = "kernel summary (sorted by latency)"
    if on_cpu:
        title = "kernel summary (sorted by CPU wall-clock time of the references)"
    table = Table(title=title)
    latency_column = "CPU wall (ref.)" if on_cpu else "latency"
    for column in ("method", "S", "ctx", "B", latency_column, "timing", "rel L2", "cos",
                   "KV read"):
        table.add_column(column, no_wrap=column == "method")
    entries = []
    for case, rows in summary:
        by_metric = {r["metric"]: r for r in rows}
        latency = by_metric.get("latency", {})
        entries.append((latency.get("value", math.nan), case, latency, by_metric))
    entries.sort(key=lambda e: (math.isnan(e[0]), e[0]))
    for value, case, latency, by_metric in entries:

        def fmt(metric: str, spec: str, by_metric=by_metric) -> str:
            row = by_metric.get(metric)
            return format(row["value"], spec) if row and row["status"] == "ok" else "-"

        status = latency.get("status", "ok")
        shown = f"{value:,.1f} us" if status == "ok" else f"{status}: {latency.get('reason', '')}"
        table.add_row(
            case["method"],
            str(case.get("S") or _team_label(case)),
            format_size(case["ctx"]),
            str(case["batch"]),
            shown,
            f"{case['timing']}/{latency.get('l2_state', case['l2'])}",
            fmt("rel_l2_vs_dense", ".2e"),
            fmt("cosine_vs_dense", ".4f"),
            fmt("kv_read_fraction", ".1%"),
        )
    console.print(table)
    if on_cpu:
        console.print(CPU_NOTE, soft_wrap=True)


def main() -> None:  # pragma: no cover - console script entry point
    app()
