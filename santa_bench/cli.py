"""The santa-bench command line (Typer): list, env, kernel."""

from __future__ import annotations

import math
import shlex
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape as escape_markup
from rich.table import Table

from santa_bench import environment, results
from santa_bench.cli_options import (
    Force,
    ResultsDir,
    RunId,
    exit_if_cases_failed,
    fail,
    make_console,
    option_list,
    positive_number,
    run_cases_or_exit,
)
from santa_bench.devices import DEVICE_HELP, resolve_device
from santa_bench.methods import REGISTRY, MethodError, parse_method_specs
from santa_bench.runners import MAX_CASES
from santa_bench.runners.schema import KERNEL
from santa_bench.units import format_size, parse_list, parse_size_list

app = typer.Typer(
    help="Reproduce, benchmark and extend stochastic sparse attention (SANTA, S2ANTA, SANTA++).",
    no_args_is_help=True,
    add_completion=False,
)
console = make_console()

DEFAULT_METHODS = "dense,santa-iid,santa-strat,santa-sys,santa-flash,santa-prop"


COSINE_FLOOR = 0.9  # a CPU summary row whose cosine against dense is lower is flagged
CPU_GUIDE = (
    "reading: rel L2 = |o - o_dense| / |o_dense| for one draw (one seed), cos = its cosine "
    "to dense; a sampler's error falls like 1/sqrt(S), and SANTA / S²ANTA's averages out "
    "over seeds (unbiased, docs/algorithms.md); cos < {floor} is flagged inaccurate. KV "
    "read = the "
    "share of the K/V cache one step reads, what bounds decode speed on a GPU. The CPU "
    "times of the PyTorch references are not kernel speed (they stay in the rows)."
)
SAME_DRAWS = (
    "santa-sys and santa-prop (alloc=systematic) print identical rows: santa-prop is global "
    "systematic sampling computed tile by tile (docs/algorithms.md, section 4), the same CDF "
    "and one offset per head from the same seed, so both draw the same rows."
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
    gpu: Annotated[str | None, typer.Option(
        help="Only the rows of this GPU (run.json's gpu_name, or CPU); default: every GPU, "
        "a table per GPU.")] = None,
) -> None:
    """Print Markdown tables of the kernel results in a store (the tables of docs/benchmarks.md).

    Each line names its GPU (its run's); rows of several GPUs get a table per GPU, so that
    no speedup or best dense latency is read across GPUs."""
    from santa_bench.report import GPU, kernel_table, speedup_matrix
    from santa_bench.stores import check_gpu, open_results, row_gpus

    try:
        store = open_results(results_dir)
        frame = store.load(parse_list(run) or None)
        frame = frame.assign(**{GPU: row_gpus(frame, store.runs())})
        if gpu is not None:
            check_gpu(gpu, set(frame[GPU]))
            frame = frame[frame[GPU] == gpu]
    except ValueError as exc:  # an unknown --run or --gpu, no such folder
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
        help="GPU name (run.json's gpu_name) of the kernel rows to join (default: one "
        "verdict per GPU of the kernel rows; accuracy rows come from any GPU).")] = None,
    out: Annotated[Path | None, typer.Option(
        help="Write OUT.md, OUT.csv and OUT.png (speedup against retention, the front "
        "drawn), OUT-<gpu>.* per GPU where the kernel rows span several; default: print "
        "the Markdown only.")] = None,
    skip_corrupt: Annotated[bool, typer.Option(
        "--skip-corrupt", help="Leave out the rows of unreadable (corrupt) result parts, "
        "named in the verdict, instead of refusing.")] = False,
    min_dense: Annotated[float | None, typer.Option(
        help="Dense score (0-1) a task needs to count (default 0.40): retention on a task "
        "the model can hardly do is too noisy to rank methods.")] = None,
) -> None:
    """The verdict: speedup and retention of the same configurations, the Pareto front, and
    per task family the fastest configuration matched to dense (non-inferior by a paired
    bootstrap test at a 2-point margin) and the fastest at retention 0.99 / 0.95 / 0.90.

    Speed is never joined across GPUs: a verdict's kernel rows are of one GPU, named in its
    title (one verdict per GPU where the store holds several); accuracy rows may come from
    any GPU, and the verdict names which."""
    import warnings

    from santa_bench import pareto as verdict_mod
    from santa_bench import verdict_output
    from santa_bench.stores import open_results

    try:
        ctx_tokens = parse_size_list(ctx)
        batches = [int(b) for b in parse_list(batch)]
        if len(ctx_tokens) != 1 or not batches or min(batches) < 1:
            raise ValueError("--ctx takes one context and --batch positive integers")
        store = open_results(results_dir)
        with warnings.catch_warnings():  # an unreadable part: said below, on one line
            warnings.filterwarnings("ignore", "skipping unreadable result part")
            frame = store.load()
        skipped = [str(path) for path in store.unreadable_parts()]
        if skipped and not skip_corrupt:
            raise ValueError(
                f"unreadable result part {skipped[0]}"
                + (f" (and {len(skipped) - 1} more)" if len(skipped) > 1 else "")
                + ": remove or move it (or rerun its case into its run), or pass "
                "--skip-corrupt to leave its rows out")
        if frame.empty:
            raise ValueError(f"--results {results_dir}: no result rows there")
        found = verdict_mod.verdicts(
            frame, store.runs(), model,
            shape=verdict_mod.Shape.parse(shape) if shape else None,
            ctx=ctx_tokens[0], batches=tuple(batches), gpu=gpu,
            min_dense=verdict_mod.INFORMATIVE if min_dense is None else min_dense)
    except (ValueError, verdict_mod.ParetoError) as exc:
        _fail(str(exc))
        return
    command = "santa-bench " + shlex.join(sys.argv[1:])
    for result in found:
        result.skipped_parts = skipped
    if out is None:
        print("\n".join(verdict_output.markdown(result, command) for result in found))
        return
    try:
        paths = [path for result in found for path in verdict_output.write(
            result, out if len(found) == 1 else verdict_output.per_gpu(out, result.gpu),
            command)]
    except OSError as exc:
        _fail(f"--out {out}: {exc.strerror or exc}")
        return
    print("\n".join(map(str, paths)))
    if skipped:
        print("left out, unreadable: " + ", ".join(skipped))


from santa_bench.accuracy.cli import app as accuracy_app  # noqa: E402
from santa_bench.plots import plot_command  # noqa: E402

app.add_typer(accuracy_app, name="accuracy")

app.command("plot")(plot_command)

from santa_bench.e2e.cli import e2e_command  # noqa: E402

app.command("e2e")(e2e_command)

from santa_bench.capture import capture_command  # noqa: E402

app.command("capture")(capture_command)


def _device(requested: str) -> str:
    try:
        return resolve_device(requested)
    except ValueError as exc:
        _fail(str(exc))
        raise  # pragma: no cover - _fail exits


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
        str, typer.Option("--S", help=KERNEL.help("S"))
    ] = KERNEL.option_default("S"),
    batch: Annotated[str, typer.Option(help=KERNEL.help("batch"))] = KERNEL.option_default("batch"),
    M: Annotated[str | None, typer.Option("--M", hidden=True)] = None,
    team_size: Annotated[str | None, typer.Option(hidden=True)] = None,
    team_policy: Annotated[str | None, typer.Option(hidden=True)] = None,
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
            help="Methods, comma list; parameters as name:key=value, a|b sweeping a value "
            f"(santapp:M=32|64,team_size=16; see `santa-bench list`). Default: {DEFAULT_METHODS}."
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
    dtype: Annotated[str, typer.Option(help=KERNEL.help("dtype"))] = KERNEL.default("dtype"),
    layout: Annotated[str, typer.Option(help=KERNEL.help("layout"))] = KERNEL.default("layout"),
    page_size: Annotated[
        int, typer.Option(help=KERNEL.help("page_size"))
    ] = KERNEL.default("page_size"),
    seed: Annotated[int, typer.Option(help=KERNEL.help("seed"))] = KERNEL.default("seed"),
    device: Annotated[str, typer.Option(help=DEVICE_HELP)] = "auto",
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

    _refuse_retired_options(M=M, team_size=team_size, team_policy=team_policy)
    try:
        on_device = _device(device)
        shape = attention_shape(
            str(inputs) if inputs else None,
            {"heads": heads, "kv_heads": kv_heads, "head_dim": head_dim},
            _flag,
        )
        if ctx is None:
            ctx = (str(describe_capture(inputs, digest=False).ctx) if inputs
                   else KERNEL.option_default("ctx"))
        grid = KernelGrid(
            methods=_with_baselines(
                parse_method_specs(DEFAULT_METHODS if methods is None else methods),
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
        positive_number("--cpu-budget", cpu_budget)
        positive_number("--gpu-budget-ms", gpu_budget_ms)
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
    if outcome.shown and on_device == "cpu":
        console.print("speed: on a GPU, this command times the Triton kernels against the "
                      "dense baselines:")
        console.print(f"  {_gpu_command()}", soft_wrap=True, markup=False, highlight=False)
    exit_if_cases_failed(outcome, console)


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
    max_cases: Annotated[
        int,
        typer.Option(
            help="Refuse a suite of more combinations than this before expanding it "
            "(split a larger one into several suites)."
        ),
    ] = MAX_CASES,
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
        suite = suites.load_suite(
            suite_file, max_cases, lambda line: console.print(line, markup=False, soft_wrap=True)
        )
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
    exit_if_cases_failed(outcome, console)


def _flag(name: str) -> str:
    """The command-line option of a case key: ``kv_heads`` -> ``--kv-heads``."""
    return "--" + name.replace("_", "-")


def _sizes(option: str, text: str) -> list[int]:
    """The sizes of ``option`` (``4k,32k``); a bad one raises ValueError naming the option."""
    try:
        return parse_size_list(text)
    except ValueError as exc:
        raise ValueError(f"{option}: {exc}") from None


# options `kernel` had for SANTA++ alone: their method parameter (hidden; they fail)
RETIRED_KERNEL_OPTIONS = {"M": ("--M", "M"), "team_size": ("--team-size", "team_size"),
                          "team_policy": ("--team-policy", "policy")}


def _refuse_retired_options(**given: str | None) -> None:
    """One-line error for a retired method option: its parameter goes in the spec."""
    for name, text in given.items():
        if text is not None:
            option, param = RETIRED_KERNEL_OPTIONS[name]
            values = "|".join(parse_list(text)) or text
            _fail(f"{option} is gone: give it in the method spec, "
                  f"--methods 'santapp:{param}={values}' (a|b sweeps)")


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
    from santa_bench.labels import config_label  # the summary only: not at start-up

    if "M" not in case:
        return "-"
    return config_label(case, head=(("M", "M", True), ("team_size", "P", True)),
                        method=False, sep=",")


def _gpu_command() -> str:
    """This command line without a ``--device cpu``: what times the kernels on a GPU."""
    args, kept = sys.argv[1:], []
    skip = False
    for i, arg in enumerate(args):
        if skip:
            skip = False
        elif arg == "--device" and i + 1 < len(args):
            skip = True
        elif not arg.startswith("--device="):
            kept.append(arg)
    return shlex.join(["santa-bench", *kept])


def _print_summary(summary: list[tuple[dict, list[dict]]]) -> None:
    if any(case.get("device") == "cpu" for case, _ in summary):
        _print_cpu_summary(summary)
        return
    table = Table(title="kernel summary (sorted by latency)")
    for column in ("method", "S", "ctx", "B", "latency", "timing", "rel L2", "cos",
                   "KV read"):
        table.add_column(column, no_wrap=column == "method")
    entries = []
    for case, rows in summary:
        by_metric = {r["metric"]: r for r in rows}
        latency = by_metric.get("latency", {})
        entries.append((latency.get("value", math.nan), case, latency, by_metric))
    entries.sort(key=lambda e: (math.isnan(e[0]), e[0]))
    for value, case, latency, by_metric in entries:
        status = latency.get("status", "ok")
        shown = f"{value:,.1f} us" if status == "ok" else f"{status}: {latency.get('reason', '')}"
        table.add_row(
            case["method"],
            str(case.get("S") or _team_label(case)),
            format_size(case["ctx"]),
            str(case["batch"]),
            shown,
            f"{case['timing']}/{latency.get('l2_state', case['l2'])}",
            _metric(by_metric, "rel_l2_vs_dense", ".2e"),
            _metric(by_metric, "cosine_vs_dense", ".4f"),
            _metric(by_metric, "kv_read_fraction", ".1%"),
        )
    console.print(table)


def _metric(by_metric: dict[str, dict], metric: str, spec: str) -> str:
    row = by_metric.get(metric)
    return format(row["value"], spec) if row and row["status"] == "ok" else "-"


def _ok_value(by_metric: dict[str, dict], metric: str) -> float:
    row = by_metric.get(metric)
    return float(row["value"]) if row and row["status"] == "ok" else math.nan


def _print_cpu_summary(summary: list[tuple[dict, list[dict]]]) -> None:
    """What a CPU measures well: each method's error against dense and its KV reads,
    sorted by reads then error within each (ctx, batch), with a reading guide."""
    from rich import box

    table = Table(title="kernel summary on a CPU: error against dense, KV reads",
                  box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    for column in ("method", "ctx", "B", "rel L2", "cos", "KV read", "note"):
        wraps = column in ("method", "note")
        table.add_column(column, no_wrap=not wraps, overflow="fold",
                         justify="left" if wraps else "right")
    entries = []
    for case, rows in summary:
        by_metric = {r["metric"]: r for r in rows}
        read, error = _ok_value(by_metric, "kv_read_fraction"), _ok_value(by_metric,
                                                                           "rel_l2_vs_dense")
        key = (case["ctx"], case["batch"], math.isnan(read), read, math.isnan(error), error)
        entries.append((key, case, by_metric))
    entries.sort(key=lambda e: tuple(0 if isinstance(v, float) and math.isnan(v) else v
                                     for v in e[0]))
    flagged, identical = False, _identical_rows(entries)
    for _, case, by_metric in entries:
        params = f"S={case['S']}" if case.get("S") else _team_label(case)
        label = case["method"] + ("" if params == "-" else f" {params}")
        latency = by_metric.get("latency", {})
        note = ""
        if latency.get("status", "ok") != "ok":
            note = f"{latency['status']}: {latency.get('reason', '')}"
        elif _ok_value(by_metric, "cosine_vs_dense") < COSINE_FLOOR:
            note, flagged = "inaccurate", True
        table.add_row(label, format_size(case["ctx"]), str(case["batch"]),
                      _metric(by_metric, "rel_l2_vs_dense", ".2e"),
                      _metric(by_metric, "cosine_vs_dense", ".3f"),
                      _metric(by_metric, "kv_read_fraction", ".1%"), escape_markup(note))
    console.print(table)
    console.print(CPU_GUIDE.format(floor=COSINE_FLOOR))
    if flagged:
        console.print(f"inaccurate: cos < {COSINE_FLOOR} against dense at these settings "
                      "(a larger S or M reads more and errs less)")
    for names in identical:
        if set(names) == {"santa-sys", "santa-prop"}:
            console.print(SAME_DRAWS)
        else:
            console.print(f"{' and '.join(names)} print identical rows (the same draws from "
                          "one seed)")


def _identical_rows(entries: list) -> list[tuple[str, ...]]:
    """Names of methods whose rows (rel L2, cos, KV read) coincide at some (ctx, batch, S)."""
    groups: dict[tuple, list[str]] = {}
    for _, case, by_metric in entries:
        values = tuple(_ok_value(by_metric, m) for m in
                       ("rel_l2_vs_dense", "cosine_vs_dense", "kv_read_fraction"))
        if case["method"] == "dense" or any(math.isnan(v) for v in values):
            continue
        key = (case["ctx"], case["batch"], case.get("S"), values)
        groups.setdefault(key, []).append(case["method"])
    found: list[tuple[str, ...]] = []
    for names in groups.values():
        unique = tuple(dict.fromkeys(names))
        if len(unique) > 1 and unique not in found:
            found.append(unique)
    return found


def main() -> None:  # pragma: no cover - console script entry point
    app()
