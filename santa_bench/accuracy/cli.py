"""``santa-bench accuracy``: fidelity on synthetic inputs, tasks and token agreement."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from santa_bench import cli_options, environment, execute, results
from santa_bench.cli_options import Force, ResultsDir, RunId
from santa_bench.methods import MethodError, parse_method_specs
from santa_bench.runners.schema import FIDELITY
from santa_bench.units import parse_list, parse_size_list

app = typer.Typer(
    help="Accuracy of the methods: estimator fidelity, real-model tasks, token agreement.",
    no_args_is_help=True,
)
console = cli_options.make_console()

DEFAULT_METHODS = "santa-iid,santa-strat,santa-sys,santa-flash,santa-prop"


def _fail(message: str) -> None:
    console.print(f"[bold red]error:[/] {escape(message)}")
    raise typer.Exit(code=2)


def _announce(message: str) -> None:
    console.print(message, soft_wrap=True)


def _run(cases: list[dict], results_dir: Path, run_id: str | None, force: bool, title: str):
    from santa_bench.accuracy.models import download_notice

    for model in dict.fromkeys(str(c["model"]) for c in cases if c.get("kind") == "accuracy"):
        if notice := download_notice(model):
            _announce(notice)
    command = shlex.join(["santa-bench", *sys.argv[1:]])
    env = environment.collect_environment(command)
    options = execute.RunOptions(force=force, run_id=run_id)
    return cli_options.run_cases_or_exit(
        cases, results.ResultStore(results_dir), env, options, console=console, title=title
    )


def _task_table(outcome, heading: str,
                keys: tuple[str, ...] = ("task", "ctx", "method", "S", "M", "backend")):
    """Prints the score / retention / KV-read table of a task run (ran now or stored)."""
    if outcome.shown:
        _table(heading, outcome, ("score", "retention", "decode_kv_read_fraction"), keys)
    _finish(outcome)


def _finish(outcome) -> None:
    """Says where the rows went, then exits 1 if a case failed."""
    if outcome.results:
        console.print(f"rows written to {outcome.run_path}", soft_wrap=True)
    cli_options.exit_if_cases_failed(outcome, console)


def _table(title: str, outcome, metrics: tuple[str, ...], keys: tuple[str, ...]) -> None:
    table = Table(title=title)
    for column in (*keys, *metrics):
        table.add_column(column)
    for case, rows in outcome.shown:
        by_metric = {r["metric"]: r for r in rows}
        cells = [str(case.get(k, "-")) for k in keys]
        cells += [cli_options.metric_cell(m, by_metric.get(m)) for m in metrics]
        table.add_row(*cells)
    console.print(table)


@app.command("fidelity")
def fidelity(
    patterns: Annotated[
        str | None,
        typer.Option(
            help="Attention patterns, comma list: uniform, peaked, needle, multi-needle, "
            "sink-heavy, or captured:<model>:L<layer> from --inputs (default: the five "
            "synthetic ones, or every captured one with --inputs)."
        ),
    ] = None,
    methods: Annotated[
        str, typer.Option(help="Methods, comma list, parameters as name:key=value.")
    ] = DEFAULT_METHODS,
    S: Annotated[str, typer.Option("--S", help=FIDELITY.help("S"))] = FIDELITY.option_default("S"),
    ctx: Annotated[str, typer.Option(help=FIDELITY.help("ctx"))] = FIDELITY.option_default("ctx"),
    batch: Annotated[int, typer.Option(help=FIDELITY.help("batch"))] = FIDELITY.default("batch"),
    heads: Annotated[int, typer.Option(help=FIDELITY.help("heads"))] = FIDELITY.default("heads"),
    kv_heads: Annotated[
        int, typer.Option(help=FIDELITY.help("kv_heads"))
    ] = FIDELITY.default("kv_heads"),
    head_dim: Annotated[
        int, typer.Option(help=FIDELITY.help("head_dim"))
    ] = FIDELITY.default("head_dim"),
    seeds: Annotated[int, typer.Option(help=FIDELITY.help("seeds"))] = FIDELITY.default("seeds"),
    seed: Annotated[int, typer.Option(help=FIDELITY.help("seed"))] = FIDELITY.default("seed"),
    inputs: Annotated[
        Path | None,
        typer.Option(
            help="Captured decode inputs (`santa-bench capture`): real post-RoPE q, K, V; "
            "their shape and context come from the file."
        ),
    ] = None,
    results_dir: ResultsDir = Path("results"),
    run_id: RunId = None,
    force: Force = False,
) -> None:
    """Error of each method against dense as a random estimator, on synthetic or captured inputs.

    Per (pattern, method, S): mean relative L2 and cosine over seeds, relative bias and
    the largest |z| of the seed mean, spread, KL of the attention distribution where the
    method estimates one (Bernoulli scores), and read fractions. A method with an
    (epsilon, delta) promise (vattention) adds the share of draws x heads that broke it
    and whether that share stays within delta. float64 references.
    """
    from santa_bench.accuracy.patterns import PATTERNS
    from santa_bench.capture import captured_patterns
    from santa_bench.runners.fidelity import FidelityGrid, expand_fidelity_cases

    try:
        available = captured_patterns(inputs) if inputs else []
        chosen = parse_list(patterns) if patterns else available or list(PATTERNS)
        unknown = [p for p in chosen if p not in PATTERNS and p not in available]
        if unknown:
            raise ValueError(
                f"--patterns: unknown {unknown}; known: {[*PATTERNS, *available]}"
            )
        if seeds < 2:
            raise ValueError("--seeds: need at least 2 draws")
        for option, value in (("--batch", batch), ("--heads", heads), ("--kv-heads", kv_heads),
                              ("--head-dim", head_dim)):
            if value <= 0:
                raise ValueError(f"{option}: must be > 0, got {value}")
        grid = FidelityGrid(
            methods=parse_method_specs(methods),
            patterns=chosen,
            S=cli_options.option_list("--S", S),
            ctx=parse_size_list(ctx),
            batch=batch,
            heads=heads,
            kv_heads=kv_heads,
            head_dim=head_dim,
            seeds=seeds,
            input_seed=seed,
            inputs=str(inputs) if inputs else None,
        )
        if min(grid.S, default=1) <= 0 or heads % kv_heads:
            raise ValueError("--S must be > 0 and --heads a multiple of --kv-heads")
        cases = expand_fidelity_cases(grid)
    except (MethodError, ValueError) as exc:
        _fail(str(exc))
        return
    outcome = _run(cases, results_dir, run_id, force, "fidelity")
    if outcome.shown:
        promised = any(r["metric"] == "promise_held" for _, rows in outcome.shown for r in rows)
        _table(
            "fidelity vs dense",
            outcome,
            ("rel_l2_vs_dense", "rel_bias", "max_abs_z", "kv_read_fraction", "attention_kl")
            + (("promise_violation_rate", "promise_held") if promised else ()),
            ("pattern", "method", "S"),
        )
    _finish(outcome)


def _task(
    task: str,
    model: str,
    methods: str,
    n: int,
    seed: int,
    dense_layers: str,
    max_new_tokens: int,
    data_dir: Path | None,
    results_dir: Path,
    run_id: str | None,
    force: bool,
    decode: dict,
) -> None:
    from santa_bench.runners.tasks import expand_task_cases

    try:
        cases = expand_task_cases(
            task,
            model,
            parse_method_specs(methods),
            n=n,
            seed=seed,
            dense_layers=dense_layers,
            max_new_tokens=max_new_tokens,
            data_dir=str(data_dir) if data_dir else None,
            **decode,
        )
    except (MethodError, ValueError) as exc:
        _fail(str(exc))
        return
    outcome = _run(cases, results_dir, run_id, force, task)
    _task_table(outcome, f"{task} on {model} (n={n})", keys=("method", "S", "M", "backend"))


MODEL = Annotated[
    str,
    typer.Option(
        help="Catalog model (smollm2-135m, qwen2.5-coder-0.5b, qwen2.5-coder-1.5b), a local "
        "path or a Hugging Face id."
    ),
]
METHODS = Annotated[
    str, typer.Option(help="Methods, comma list; dense is always added so retention is measured.")
]
N = Annotated[int, typer.Option("--n", help="Samples (a seeded shuffle of the task).")]
SEED = Annotated[int, typer.Option(help="Seed of the sample shuffle and the samplers.")]
DENSE_LAYERS = Annotated[str, typer.Option(help="Layers kept exact, comma list (e.g. 0,1).")]
DATA_DIR = Annotated[
    Path | None, typer.Option(help="Data directory (default: $SANTA_BENCH_DATA or the user cache).")
]
DEVICE = Annotated[
    str,
    typer.Option(
        help="Where the model runs: auto (CUDA when present), cuda (bf16; each sampled "
        "method's Triton kernel in every decode step) or cpu (fp32; the PyTorch references)."
    ),
]
BATCH = Annotated[
    int,
    typer.Option(
        help="Sequences decoded together (each at its own length). Larger is faster on a GPU "
        "and needs ctx x layers x KV heads x head dim x 4 bytes (bf16 K and V) per sequence."
    ),
]
REFERENCE = Annotated[
    bool,
    typer.Option(
        "--reference",
        help="Run the methods' PyTorch references on the GPU instead of their Triton kernels "
        "(for checking the kernels; much slower).",
    ),
]


@app.command("mmlu")
def mmlu(
    model: MODEL = "smollm2-135m",
    methods: METHODS = "dense,santa-prop:S=16",
    n: N = 20,
    seed: SEED = 0,
    dense_layers: DENSE_LAYERS = "",
    data_dir: DATA_DIR = None,
    device: DEVICE = "auto",
    batch: BATCH = 16,
    reference: REFERENCE = False,
    results_dir: ResultsDir = Path("results"),
    run_id: RunId = None,
    force: Force = False,
) -> None:
    """MMLU-Redux choice accuracy (the answer token is a decode step through the method)."""
    _task("mmlu", model, methods, n, seed, dense_layers, 0, data_dir, results_dir, run_id, force,
          {"device": device, "batch": batch, "reference": reference})


@app.command("gsm8k")
def gsm8k(
    model: MODEL = "smollm2-135m",
    methods: METHODS = "dense,santa-prop:S=16",
    n: N = 10,
    seed: SEED = 0,
    dense_layers: DENSE_LAYERS = "",
    max_new_tokens: Annotated[int, typer.Option(help="Greedy generation length.")] = 256,
    data_dir: DATA_DIR = None,
    device: DEVICE = "auto",
    batch: BATCH = 16,
    reference: REFERENCE = False,
    results_dir: ResultsDir = Path("results"),
    run_id: RunId = None,
    force: Force = False,
) -> None:
    """GSM8K exact match of the final number, greedy decoding through the method."""
    _task(
        "gsm8k",
        model,
        methods,
        n,
        seed,
        dense_layers,
        max_new_tokens,
        data_dir,
        results_dir,
        run_id,
        force,
        {"device": device, "batch": batch, "reference": reference},
    )


RULER_DEFAULT_TASKS = "niah_single_1,niah_single_2,vt,qa_1"


@app.command("ruler")
def ruler(
    tasks: Annotated[
        str,
        typer.Option(
            help="RULER tasks, comma list or 'all': niah_single_1..3, niah_multikey_1..3, "
            "niah_multivalue, niah_multiquery, vt, cwe, fwe, qa_1, qa_2; 'niah' = the eight "
            "NIAH tasks."
        ),
    ] = RULER_DEFAULT_TASKS,
    ctx: Annotated[str, typer.Option(help="Context length(s) of the samples: 2k, 8k, ...")] = "2k",
    model: MODEL = "smollm2-135m",
    methods: METHODS = "dense,santa-prop:S=128",
    n: Annotated[int, typer.Option("--n", help="Samples per task and context.")] = 3,
    seed: Annotated[int, typer.Option(help="Seed of the generated samples and samplers.")] = 0,
    dense_layers: DENSE_LAYERS = "",
    data_dir: Annotated[
        Path | None,
        typer.Option(help="Folder with RULER's JSON files (default: fetched into the cache)."),
    ] = None,
    device: DEVICE = "auto",
    batch: BATCH = 16,
    reference: REFERENCE = False,
    results_dir: ResultsDir = Path("results"),
    run_id: RunId = None,
    force: Force = False,
) -> None:
    """RULER tasks generated at each context length, greedy decoding through the method.

    Scores are RULER's (string_match_all; string_match_part for qa), 0..1 per sample.
    """
    from santa_bench.accuracy.ruler import (
        RULER_TASKS,
        SAMPLE_CACHE_MIN_TOKENS,
        DataUnavailable,
        fetch_ruler_data,
        samples_cached,
    )
    from santa_bench.runners.tasks import RULER_GROUPS, expand_task_cases

    try:
        chosen = list(RULER_TASKS) if tasks.strip() == "all" else parse_list(tasks)
        chosen = list(dict.fromkeys(t for c in chosen for t in RULER_GROUPS.get(c, (c,))))
        unknown = [t for t in chosen if t not in RULER_TASKS]
        if unknown:
            raise ValueError(f"--tasks: unknown {unknown}; known: {', '.join(RULER_TASKS)}")
        contexts = parse_size_list(ctx)
        specs = parse_method_specs(methods)
        cli_options.require_model_packages(console, [model])  # before a data download
        try:
            if data_dir is not None or not samples_cached(chosen, contexts, n, seed):
                fetch_ruler_data(data_dir, announce=_announce)
        except DataUnavailable as exc:
            # long contexts may be in the sample cache, which needs no RULER data (an
            # offline GPU machine given the cache): a sample that is not fails its case
            if data_dir is not None or min(contexts) < SAMPLE_CACHE_MIN_TOKENS:
                raise
            console.print(f"warning: {exc}; using cached samples where present")
        cases = [
            case
            for size in contexts
            for task in chosen
            for case in expand_task_cases(
                f"ruler-{task}",
                model,
                specs,
                n=n,
                seed=seed,
                dense_layers=dense_layers,
                ctx=size,
                data_dir=str(data_dir) if data_dir else None,
                device=device,
                batch=batch,
                reference=reference,
            )
        ]
    except (MethodError, ValueError, DataUnavailable) as exc:
        _fail(str(exc))
        return
    outcome = _run(cases, results_dir, run_id, force, "ruler")
    _task_table(outcome, f"RULER on {model} (n={n})")


def _long_task(
    tasks: list[str],
    ctx: str,
    model: str,
    methods: str,
    n: int,
    seed: int,
    dense_layers: str,
    data_dir: Path | None,
    file: Path | None,
    demo_file: Path | None,
    results_dir: Path,
    run_id: str | None,
    force: bool,
    title: str,
    decode: dict,
) -> None:
    """Runs LongBench v2 / HELMET-RAG cases at each context length."""
    from santa_bench.runners.tasks import expand_task_cases

    try:
        if file is not None and not file.is_file():
            raise ValueError(f"--file: {file} not found")
        if file is not None and len(tasks) > 1:
            raise ValueError("--file holds one dataset: name one (e.g. --datasets nq)")
        specs = parse_method_specs(methods)
        cases = [
            case
            for size in parse_size_list(ctx)
            for task in tasks
            for case in expand_task_cases(
                task,
                model,
                specs,
                n=n,
                seed=seed,
                dense_layers=dense_layers,
                ctx=size,
                data_dir=str(data_dir) if data_dir else None,
                data_file=str(file) if file else None,
                demo_file=str(demo_file) if demo_file else None,
                **decode,
            )
        ]
    except (MethodError, ValueError) as exc:
        _fail(str(exc))
        return
    outcome = _run(cases, results_dir, run_id, force, title)
    _task_table(outcome, f"{title} on {model} (n={n})")


LONG_CTX = Annotated[
    str, typer.Option(help="Context length(s) in tokens (prompts are truncated to fit): 8k, 32k.")
]
FILE = Annotated[
    Path | None,
    typer.Option(help="A local JSONL/JSON/Parquet/CSV file with the task's fields instead."),
]


@app.command("longbench-v2")
def longbench_v2(
    ctx: LONG_CTX = "32k",
    model: MODEL = "smollm2-135m",
    methods: METHODS = "dense,santapp:M=32",
    n: N = 20,
    seed: SEED = 0,
    dense_layers: DENSE_LAYERS = "",
    data_dir: DATA_DIR = None,
    file: FILE = None,
    device: DEVICE = "auto",
    batch: BATCH = 16,
    reference: REFERENCE = False,
    results_dir: ResultsDir = Path("results"),
    run_id: RunId = None,
    force: Force = False,
) -> None:
    """LongBench v2 multiple-choice accuracy (official 0-shot prompt, middle truncation).

    Data: <data-dir>/longbench-v2/data.json (THUDM/LongBench-v2, fetched from the
    Hugging Face hub when missing and reachable) or --file.
    """
    _long_task(
        ["longbench-v2"], ctx, model, methods, n, seed, dense_layers, data_dir, file, None,
        results_dir, run_id, force, "longbench-v2",
        {"device": device, "batch": batch, "reference": reference},
    )  # fmt: skip


@app.command("helmet-rag")
def helmet_rag(
    datasets: Annotated[
        str, typer.Option(help="HELMET-RAG datasets, comma list: nq, triviaqa, hotpotqa, popqa.")
    ] = "nq,triviaqa,hotpotqa,popqa",
    ctx: LONG_CTX = "32k",
    model: MODEL = "smollm2-135m",
    methods: METHODS = "dense,santapp:M=32",
    n: N = 20,
    seed: SEED = 0,
    dense_layers: DENSE_LAYERS = "",
    data_dir: DATA_DIR = None,
    file: FILE = None,
    demo_file: Annotated[
        Path | None, typer.Option(help="Demonstrations for --file (HELMET's k=3 train file).")
    ] = None,
    device: DEVICE = "auto",
    batch: BATCH = 16,
    reference: REFERENCE = False,
    results_dir: ResultsDir = Path("results"),
    run_id: RunId = None,
    force: Force = False,
) -> None:
    """HELMET-RAG SubEM (retrieved passages fitted to --ctx, two demonstrations).

    Data: <data-dir>/helmet/kilt/*.jsonl (HELMET's data/kilt files; fetched from
    princeton-nlp/HELMET's data.tar.gz on the hub when missing and reachable) or --file.
    """
    from santa_bench.runners.tasks import HELMET_DATASETS, HELMET_PREFIX

    chosen = parse_list(datasets)
    unknown = [d for d in chosen if d not in HELMET_DATASETS]
    if unknown or not chosen:
        _fail(f"--datasets: unknown {unknown}; known: {', '.join(HELMET_DATASETS)}")
    _long_task(
        [HELMET_PREFIX + d for d in chosen], ctx, model, methods, n, seed, dense_layers,
        data_dir, file, demo_file, results_dir, run_id, force, "helmet-rag",
        {"device": device, "batch": batch, "reference": reference},
    )  # fmt: skip


@app.command("task")
def task_command(
    name: Annotated[str, typer.Argument(
        metavar="TASK", help="A registered task or group (`santa-bench list` shows them).")],
    ctx: Annotated[str | None, typer.Option(
        help="Context length(s) of a long-context task's samples: 8k, 32k, ...")] = None,
    model: MODEL = "smollm2-135m",
    methods: METHODS = "dense,santa-prop:S=16",
    n: N = 20,
    seed: SEED = 0,
    dense_layers: DENSE_LAYERS = "",
    max_new_tokens: Annotated[int, typer.Option(
        help="Greedy generation length (tasks that keep one).")] = 256,
    data_dir: DATA_DIR = None,
    file: FILE = None,
    device: DEVICE = "auto",
    batch: BATCH = 16,
    reference: REFERENCE = False,
    results_dir: ResultsDir = Path("results"),
    run_id: RunId = None,
    force: Force = False,
) -> None:
    """Any registered task, built-in or a plugin's, scored through the methods."""
    from santa_bench.runners.tasks import expand_task_cases, get_task

    try:
        concrete = [get_task(t) for t in _task_names(name)]
        long_context = any(t.long_context for t in concrete)
        if long_context and ctx is None:
            raise ValueError(f"--ctx: task {name!r} makes its samples at a context length")
        if file is not None and not file.is_file():
            raise ValueError(f"--file: {file} not found")
        specs = parse_method_specs(methods)
        cases = [
            case
            for size in (parse_size_list(ctx) if long_context else [None])
            for case in expand_task_cases(
                name, model, specs, n=n, seed=seed, dense_layers=dense_layers,
                max_new_tokens=max_new_tokens, ctx=size,
                data_dir=str(data_dir) if data_dir else None,
                data_file=str(file) if file else None,
                device=device, batch=batch, reference=reference)
        ]
    except (MethodError, ValueError) as exc:
        _fail(str(exc))
        return
    outcome = _run(cases, results_dir, run_id, force, name)
    _task_table(outcome, f"{name} on {model} (n={n})",
                keys=("task", "ctx", "method", "S", "M", "backend") if long_context
                else ("method", "S", "M", "backend"))


def _task_names(name: str) -> list[str]:
    from santa_bench.runners.tasks import expand_task_names

    return expand_task_names(name)


@app.command("agreement")
def agreement_command(
    text: Annotated[Path, typer.Option(help="Text file to teacher-force.")],
    model: MODEL = "smollm2-135m",
    methods: METHODS = "santa-prop:S=16",
    prefix: Annotated[int, typer.Option(help="Tokens prefilled densely.")] = 64,
    max_tokens: Annotated[int, typer.Option(help="Tokens of the text used, at most.")] = 512,
    seed: SEED = 0,
    results_dir: ResultsDir = Path("results"),
    run_id: RunId = None,
) -> None:
    """Top-1 agreement and KL against dense logits, one decode step per token of a text.

    Each method's rows (top1_agreement, kl_vs_dense, kv_read_fraction) are written to
    the store as a case of kind ``agreement``.
    """
    from santa_bench.accuracy.agreement import agreement
    from santa_bench.accuracy.models import download_notice, load_model

    if not text.exists():
        _fail(f"--text: {text} not found")
    try:
        parsed = parse_method_specs(methods)
        resolved = [method.resolve_params(overrides) for method, overrides in parsed]
    except MethodError as exc:
        _fail(str(exc))
        return
    specs = [
        m.name + (":" + ",".join(f"{k}={v}" for k, v in o.items()) if o else "")
        for m, o in parsed
    ]
    cli_options.require_model_packages(console, [model])
    if notice := download_notice(model):
        _announce(notice)
    model_obj, tokenizer = _load(load_model, model)
    ids = tokenizer(text.read_text(), return_tensors="pt").input_ids[:, :max_tokens]
    command = shlex.join(["santa-bench", *sys.argv[1:]])
    store = results.ResultStore(results_dir)
    try:
        run = store.start_run(environment.collect_environment(command), run_id=run_id)
    except (OSError, ValueError) as exc:
        _fail(f"--results {results_dir}: cannot write results there ({exc})")
        return
    table = Table(title=f"token agreement with dense, {model}, {ids.shape[1]} tokens")
    for column in ("method", "top-1 agreement", "KL vs dense (nats)", "KV read"):
        table.add_column(column)
    reference = None
    for spec, (method, _), params in zip(specs, parsed, resolved, strict=True):
        try:
            result = agreement(model_obj, ids, spec, prefix=prefix, seed=seed, reference=reference)
        except ValueError as exc:
            _fail(str(exc))
            return
        reference = result["reference"]
        case = {"kind": "agreement", "model": model, "method": method.name,
                "family": method.family, **params, "text": str(text),
                "prefix": prefix, "max_tokens": max_tokens, "seed": seed}
        run.write_case(case, [
            {"metric": "top1_agreement", "value": result["top1_agreement"], "unit": "fraction"},
            {"metric": "kl_vs_dense", "value": result["kl_vs_dense"], "unit": "nats"},
            {"metric": "kv_read_fraction", "value": result["kv_read_fraction"],
             "unit": "fraction"},
        ])
        table.add_row(
            spec,
            f"{result['top1_agreement']:.3f}",
            f"{result['kl_vs_dense']:.4f}",
            f"{result['kv_read_fraction']:.1%}",
        )
    console.print(table)
    console.print(f"rows written to {run.path}", soft_wrap=True)


def _load(load_model, model: str):
    """``load_model(model)``; a model that cannot be loaded ends the command in one line."""
    try:
        return load_model(model)
    except (OSError, ValueError) as exc:
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        _fail(f"--model {model}: cannot load it ({first})")
        raise  # not reached: _fail exits
