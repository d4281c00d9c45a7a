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

from santa_bench.cli_options import Force, ResultsDir, RunId
from santa_bench.devices import DEVICE_HELP, resolve_device
from santa_bench.runners.schema import E2E
from santa_bench.units import format_size

console = Console()


def _fail(message: str) -> None:
    console.print(f"[bold red]error:[/] {escape(message)}")
    raise typer.Exit(code=2)


def e2e_command(
    config: Annotated[
        str | None,
        typer.Option(
            help="Named model shape with random weights, for speed-only runs (weights do not "
            "change speed): llama-3.1-8b (default), llama-3.2-1b, qwen2.5-7b, tiny, tiny-qwen."
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
        str, typer.Option(help=E2E.help("ctx"))
    ] = E2E.option_default("ctx"),
    batch: Annotated[str, typer.Option(help=E2E.help("batch"))] = E2E.option_default("batch"),
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
    cases already in the store are skipped (resume), unless --force.
    """
    from santa_bench import environment, results
    from santa_bench.e2e.runner import E2EGrid, check_grid, expand_cases
    from santa_bench.execute import RunOptions, run_cases
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
    try:
        backends = None if dense_backends == "auto" else parse_list(dense_backends)
        grid = E2EGrid(
            model=model or config or "llama-3.1-8b",
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
    command = shlex.join(["santa-bench", *sys.argv[1:]])
    store = results.ResultStore(results_dir)
    env = environment.collect_environment(command)
    options = RunOptions(force=force, run_id=run_id)
    outcome = run_cases(cases, store, env, options, console=console, title="e2e")
    if outcome.results:
        print_summary(outcome.results, weights)
        console.print(f"rows written to {outcome.run_path}")


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
