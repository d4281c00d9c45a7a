"""``santa-bench e2e``: time per generated token of batched long-context decoding."""

from __future__ import annotations

import math
import shlex
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from santa_bench.cli_options import (
    Force,
    ResultsDir,
    RunId,
    exit_if_cases_failed,
    fail,
    run_cases_or_exit,
)
from santa_bench.devices import DEVICE_HELP, resolve_device
from santa_bench.runners.schema import E2E
from santa_bench.units import format_size

console = Console()

# --config / --ctx / --batch when not given: on a GPU, and on a CPU (where the GPU ones
# need ~35 GiB at bf16, most of it weights and KV cache)
DEFAULTS = {
    # a GPU's defaults are the e2e case schema's; a CPU's are small enough for its memory
    "cuda": (E2E.option_default("model"), E2E.option_default("ctx"),
             E2E.option_default("batch")),
    "cpu": ("llama-3.2-1b", "1k", "1"),
}


def _fail(message: str) -> None:
    fail(console, message)


def e2e_command(
    config: Annotated[
        str | None,
        typer.Option(
            help="Named model shape with random weights, for speed-only runs (weights do not "
            "change speed): llama-3.1-8b (default; llama-3.2-1b on a CPU), llama-3.2-1b, "
            "qwen2.5-7b, tiny, tiny-qwen."
        ),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(
            help="A Hugging Face causal LM (Llama, Qwen2, Mistral family): hub id, local path "
            "or catalog name (smollm2-135m, ...). Real weights: the run also reports token "
            "agreement with dense. Not with --config."
        ),
    ] = None,
    random_weights: Annotated[
        bool,
        typer.Option(
            "--random-weights",
            help="With --model: build its architecture (read from its config) with random "
            "weights instead of loading them.",
        ),
    ] = False,
    ctx: Annotated[
        str | None,
        typer.Option(help=f"{E2E.help('ctx')} Default {E2E.option_default('ctx')}; 1k on a "
                     "CPU."),
    ] = None,
    batch: Annotated[
        str | None,
        typer.Option(help=f"{E2E.help('batch')} Default {E2E.option_default('batch')}; 1 on a "
                     "CPU."),
    ] = None,
    methods: Annotated[
        str,
        typer.Option(
            help="Methods, comma list with parameters as name:key=value "
            "(dense,santa-prop:S=128,santapp:M=32). 'dense' runs once per --dense-backends "
            "entry; speedups are against the fastest of them."
        ),
    ] = "dense,santa-prop:S=128",
    steps: Annotated[
        int,
        typer.Option(
            help="Greedy decode steps per run (>= 2); the first 2 are untimed warm-up "
            "(compilation, graph capture)."
        ),
    ] = 64,
    dense_backends: Annotated[
        str,
        typer.Option(
            help="Exact backends that 'dense' runs: auto (GPU: sdpa, triton-splitkv, "
            "flashinfer-tc, flashinfer-cuda, flashinfer-fa3 (Hopper only), flash-attn, "
            "those missing recorded as skipped; "
            "CPU: sdpa) or a comma list of them."
        ),
    ] = "auto",
    layout: Annotated[
        str,
        typer.Option(help="KV cache layout: contiguous [B, N, Hkv, d], or paged (shuffled pages)."),
    ] = "contiguous",
    page_size: Annotated[int, typer.Option(help=E2E.help("page_size"))] = E2E.default("page_size"),
    dense_layers: Annotated[
        str,
        typer.Option(
            help="Layers kept exact under a sampled method, comma list (0,1); they run "
            "triton-splitkv on a GPU, sdpa on a CPU."
        ),
    ] = "",
    prefill: Annotated[
        str,
        typer.Option(
            help="dense: chunked causal prefill of the prompt (SDPA); random: fill the "
            "cache with random K/V and random first tokens (speed-only, random weights)."
        ),
    ] = "dense",
    prefill_chunk: Annotated[
        int, typer.Option(help=E2E.help("prefill_chunk"))
    ] = E2E.default("prefill_chunk"),
    graph: Annotated[
        bool,
        typer.Option(
            help="GPU: capture the whole decode step in a CUDA graph and replay it (as a "
            "serving engine does); --no-graph launches every step eagerly."
        ),
    ] = True,
    rest: Annotated[
        str,
        typer.Option(
            help="The step outside attention: fused (residual add + RMSNorm, RoPE + K/V "
            "write, SiLU*mul as three Triton kernels a layer around cuBLAS GEMMs, as serving "
            "engines fuse them; a GPU, or TRITON_INTERPRET=1), gemm (the same with Triton "
            "decode GEMMs, SiLU*mul inside gate/up, each kernel a programmatic dependent of "
            "the one before; batch <= 32), torch (the ~39 eager ops a layer transformers "
            "runs), or auto (gemm on a GPU up to batch 32, fused above, torch on a CPU). "
            "Dense and sampled cases of a run share it, so speedups compare like with like."
        ),
    ] = "auto",
    dtype: Annotated[str, typer.Option(help="Weights and KV cache dtype: bf16, fp16, fp32.")] = (
        "bf16"
    ),
    seed: Annotated[
        int, typer.Option(help=E2E.help("seed"))
    ] = E2E.default("seed"),
    device: Annotated[str, typer.Option(help=DEVICE_HELP)] = "auto",
    results_dir: ResultsDir = Path("results"),
    run_id: RunId = None,
    force: Force = False,
) -> None:
    """Time batched greedy decoding end to end: per-step latency, tokens/s, attention's
    share, and each method's speedup over the best dense backend.

    The prompt is prefilled once per (model, batch, ctx) and every method decodes from
    it. Every layer (but --dense-layers) attends through the method; the whole step runs
    as one CUDA graph on a GPU with fresh random numbers per step and layer. Finished
    cases already in the store are skipped (resume), unless --force. The memory the
    largest case needs is estimated and printed first; a run that will not fit is refused.
    """
    from santa_bench import environment, results
    from santa_bench.e2e.runner import E2EGrid, check_grid, expand_cases
    from santa_bench.execute import RunOptions
    from santa_bench.methods import MethodError, parse_method_specs
    from santa_bench.units import parse_list, parse_size_list

    if config and model:
        _fail("--config and --model: give one (a named shape, or a Hugging Face model)")
    if random_weights and not model:
        _fail("--random-weights goes with --model (--config is always random)")
    try:
        device = resolve_device(device)
    except ValueError as exc:
        _fail(str(exc))
    weights = "real" if model and not random_weights else "random"
    default_config, default_ctx, default_batch = DEFAULTS[device]
    given = (bool(config or model), ctx, batch)
    lowered = [(f"{option} {cpu}", gpu) for option, cpu, gpu, chosen in zip(
        ("--config", "--ctx", "--batch"), DEFAULTS["cpu"], DEFAULTS["cuda"], given,
        strict=True) if not chosen and device == "cpu"]
    if lowered:
        console.print(f"[yellow]CPU defaults:[/] {' '.join(o for o, _ in lowered)} in place "
                      f"of the GPU's {', '.join(g for _, g in lowered)} (too large for most "
                      "hosts' memory); set them to choose")
    config = config if config or model else default_config
    ctx, batch = ctx or default_ctx, batch or default_batch
    try:
        backends = None if dense_backends == "auto" else parse_list(dense_backends)
        grid = E2EGrid(
            model=model or config,
            weights=weights,
            methods=parse_method_specs(methods),
            ctx=parse_size_list(ctx),
            batch=parse_list(batch, int),
            steps=steps,
            dense_backends=backends,
            layout=layout,
            page_size=page_size,
            dense_layers=dense_layers,
            prefill=prefill,
            prefill_chunk=prefill_chunk,
            dtype=dtype,
            seed=seed,
            device=device,
            graph=graph,
            rest=rest,
        )
        check_grid(grid)
        cases = expand_cases(grid)
    except (MethodError, ValueError) as exc:
        _fail(str(exc))
        return
    if weights == "random":
        console.print(f"[yellow]weights: random[/] ({grid.model} shape; speed only, the "
                      "tokens mean nothing)" + ("; prefill: random K/V" if prefill == "random"
                                                 else ""))
    _check_memory(cases, device)
    command = shlex.join(["santa-bench", *sys.argv[1:]])
    store = results.ResultStore(results_dir)
    env = environment.collect_environment(command)
    options = RunOptions(force=force, run_id=run_id)
    outcome = run_cases_or_exit(cases, store, env, options, console=console, title="e2e")
    if outcome.results:
        print_summary(outcome.results, weights)
        console.print(f"rows written to {outcome.run_path}")
    exit_if_cases_failed(outcome, console)


def _check_memory(cases: list[dict], device: str) -> None:
    """Prints the largest case's memory estimate; refuses the run when it will not fit."""
    from santa_bench.e2e.memory import MARGIN, available_bytes, largest, size
    from santa_bench.units import format_size

    found = largest(cases)
    if found is None:
        console.print("memory: estimated once the model's config is read (a case that will "
                      "not fit is recorded as skipped)")
        return
    need, case = found
    free = available_bytes(device)
    where = "GPU" if device == "cuda" else "host"
    shape = f"--ctx {format_size(int(case['ctx']))} --batch {case['batch']}, {case['model']}"
    console.print(f"memory: {need.describe()} at most ({shape}); {size(free)} of {where} "
                  "memory available")
    if need.total + MARGIN > free:
        _fail(f"e2e needs {need.describe()} ({shape}) plus {size(MARGIN)} headroom, but "
              f"{size(free)} of {where} memory is available: lower --ctx or --batch, or pick "
              "a smaller --config")


def print_summary(summary: list[tuple[dict, list[dict]]], weights: str) -> None:
    """Prints one line per case: latency, throughput, attention share, speedup, agreement."""

    models = sorted({str(case["model"]) for case, _ in summary})
    title = f"e2e decode, {', '.join(models)}" + (
        " (random weights: speed only)" if weights == "random" else "")
    table = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    for column in ("B", "ctx", "method", "backend", "p50 ms", "p90 ms", "tok/s", "attn",
                   "speedup", "agree"):
        wraps = column in ("method", "backend")
        table.add_column(column, no_wrap=not wraps, overflow="fold",
                         justify="left" if wraps else "right",
                         min_width={"method": 12, "backend": 9}.get(column))
    for case, rows in summary:
        by_metric = {r["metric"]: r for r in rows}

        def value(metric: str, spec: str, by_metric=by_metric) -> str:
            row = by_metric.get(metric)
            if not row or row.get("status") != "ok" or math.isnan(row["value"]):
                return "-"
            return format(row["value"], spec)

        step = by_metric.get("step_ms_median", {})
        latency = value("step_ms_median", ".2f")
        if step.get("status", "ok") != "ok":
            latency = f"{step['status']}: {step.get('reason', '')}"
        params = "".join(f" {k}={case[k]}" for k in ("S", "M", "reps")
                         if case.get(k) is not None and case.get(k) != "model")
        table.add_row(
            str(case["batch"]), format_size(int(case["ctx"])), case["method"] + params,
            case["backend"], escape(latency), value("step_ms_p90", ".2f"),
            value("tokens_per_s", ",.0f"), value("attention_share", ".0%"),
            value("speedup_vs_best_dense", ".2f"), value("token_agreement", ".1%"),
        )
    console.print(table)
