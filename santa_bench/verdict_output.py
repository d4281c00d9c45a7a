"""The outputs of a verdict (:func:`santa_bench.pareto.verdict`): its Markdown, its table
as a frame (the CSV) and its figure (speedup against retention, the front drawn)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from santa_bench.methods import REGISTRY
from santa_bench.pareto import (
    MARGIN_POINTS,
    RETENTION_BANDS,
    Point,
    Retention,
    Timing,
    Verdict,
    captured_kernel_command,
    kernel_command,
)


def _pct(value: float) -> str:
    return "–" if math.isnan(value) else f"{100 * value:.1f}%"


def _speed(timing: Timing | None) -> str:
    if timing is None or math.isnan(timing.speedup):
        return "–"
    return f"{timing.speedup:.2f}x [{timing.low:.2f}, {timing.high:.2f}]"


def _ret(ret: Retention | None) -> str:
    if ret is None:
        return "–"
    return f"{ret.retention:.3f} [{ret.low:.2f}, {ret.high:.2f}]"


def _points(ret: Retention) -> str:
    """Score minus dense in points, its interval, and whether the data separate them."""
    point = "0.0" if abs(ret.drop_points) < 0.05 else f"{-ret.drop_points:+.1f}"
    if math.isnan(ret.diff_low):
        return point
    return f"{point} [{ret.diff_low:+.1f}, {ret.diff_high:+.1f}] {ret.versus_dense}"


def _floors(timings: dict[int, Timing], batches: Sequence[int]) -> str:
    """``2.10x / 1.35x``: each batch's time over its byte floor, or ``–``."""
    cells = [timings[b].floor_ratio if b in timings else math.nan for b in batches]
    if all(math.isnan(c) for c in cells):
        return "–"
    return " / ".join("–" if math.isnan(c) else f"{c:.2f}x" for c in cells)


def _mean_reads(timings: dict[int, Timing]) -> str:
    """The mean KV read fraction over the batches timed, or ``–``."""
    reads = [t.read_fraction for t in timings.values() if not math.isnan(t.read_fraction)]
    return _pct(float(np.mean(reads))) if reads else "–"


def _overall(point: Point, total: int) -> str:
    """The retention cell: on every informative task, or on the ones it has (k/N)."""
    if point.overall is not None or point.partial is None:
        return _ret(point.overall)
    return f"{_ret(point.partial)} ({len(point.partial.tasks)}/{total} tasks)"


def table_frame(result: Verdict) -> pd.DataFrame:
    """One row per configuration (the CSV)."""
    records = []
    for p in result.points:
        record: dict[str, Any] = {
            "config": p.config,
            "retention": p.overall.retention if p.overall else math.nan,
            "retention_low": p.overall.low if p.overall else math.nan,
            "retention_high": p.overall.high if p.overall else math.nan,
            "score": p.overall.score if p.overall else math.nan,
            "drop_points": p.overall.drop_points if p.overall else math.nan,
            "diff_points_low": p.overall.diff_low if p.overall else math.nan,
            "diff_points_high": p.overall.diff_high if p.overall else math.nan,
            "versus_dense": p.overall.versus_dense if p.overall else "",
            "matched": bool(p.overall and p.overall.matched),
            "kv_read_model": p.read_fraction,
            "tasks": len(p.overall.tasks if p.overall else p.partial.tasks if p.partial else []),
            "retention_on_its_tasks": p.partial.retention if p.partial else math.nan,
        }
        for family in result.families:
            ret = p.families.get(family)
            record[f"retention {family}"] = ret.retention if ret else math.nan
        for batch in result.batches:
            t = p.timings.get(batch)
            record[f"speedup_b{batch}"] = t.speedup if t else math.nan
            record[f"speedup_b{batch}_low"] = t.low if t else math.nan
            record[f"speedup_b{batch}_high"] = t.high if t else math.nan
            record[f"latency_us_b{batch}"] = t.latency_us if t else math.nan
            record[f"floor_ratio_b{batch}"] = t.floor_ratio if t else math.nan
            record[f"kv_read_kernel_b{batch}"] = t.read_fraction if t else math.nan
            record[f"index_build_ms_b{batch}"] = t.index_build_ms if t else math.nan
            record[f"front_b{batch}"] = batch in p.front
        for batch in result.batches if result.has_captured else ():
            c = p.captured.get(batch)
            record[f"speedup_b{batch}_captured"] = c.speedup if c else math.nan
            record[f"speedup_b{batch}_captured_low"] = c.low if c else math.nan
            record[f"speedup_b{batch}_captured_high"] = c.high if c else math.nan
            record[f"latency_us_b{batch}_captured"] = c.latency_us if c else math.nan
            record[f"kv_read_captured_b{batch}"] = c.read_fraction if c else math.nan
        records.append(record)
    return pd.DataFrame(records)


def _environment_line(result: Verdict) -> str:
    envs = result.environments
    parts = []
    for key, label in (("torch", "torch "), ("triton", "triton "),
                       ("transformers", "transformers ")):
        values = sorted({str(e.get(key)) for e in envs if e.get(key)})
        if values:
            parts.append(label + "/".join(values))
    dates = sorted({str(e.get("date"))[:10] for e in envs if e.get("date")})
    shas = sorted({str(e.get("git_sha"))[:7] for e in envs if e.get("git_sha")})
    if dates:
        parts.append("dates " + ", ".join(dates))
    if shas:
        parts.append("commits " + ", ".join(shas))
    return " · ".join(parts)


def markdown(result: Verdict, command: str = "") -> str:
    """The verdict as Markdown: the per-family answer, every configuration, what is missing."""
    shape = result.shape
    lines = [
        f"# Speed and accuracy: {result.model} at {result.ctx // 1024}k on {result.gpu}",
        "",
        f"Kernel rows at the model's attention shape ({shape.heads} query / "
        f"{shape.kv_heads} KV heads, head dim {shape.head_dim}), ctx {result.ctx}, "
        f"B = {', '.join(map(str, result.batches))}; speedup over the fastest dense baseline "
        "timed in the same kernel run, with the run's bootstrap interval widened by the "
        "spread of that baseline's median over the runs of this GPU that timed it (where "
        "more than one did); every kernel "
        "row of this GPU. Accuracy rows of the same configurations, from any GPU (a score is "
        "the model's and the estimator's); retention = the configuration's "
        "task-averaged score over dense's on the same samples (paired bootstrap 95% "
        f"interval), on the {len(result.tasks)} informative tasks (dense >= "
        f"{100 * result.min_dense:.0f}%). *Matched* = non-inferior to dense by a paired test: "
        "the 95% paired bootstrap interval of the score minus dense's (the same samples "
        f"resampled for both) lies above -{MARGIN_POINTS:g} points. Where that interval "
        "holds 0 the configuration is *not separable* from dense: the data do not rank "
        "them.",
        "",
        f"- Speed (kernel rows): {result.gpu}",
        f"- Accuracy rows from: {', '.join(result.accuracy_gpus) or '–'}",
        f"- Environment: {_environment_line(result)}",
        f"- Accuracy runs: {', '.join(result.accuracy_runs) or '–'}",
        f"- Kernel runs: {', '.join(result.kernel_runs) or '–'}",
    ]
    if command:
        lines.append(f"- Command: `{command}`")
    if result.skipped_parts:
        lines.append("- Left out, unreadable (`--skip-corrupt`): "
                     + ", ".join(f"`{p}`" for p in result.skipped_parts))
    for batch, best in result.dense_latency.items():
        if best is not None:
            lines.append(f"- Fastest dense at B={batch} in these kernel runs: {best[0]}, "
                         f"{best[1]:.1f} us")
    if result.has_captured:
        tiled = any(t.tiled for p in result.points for t in p.captured.values())
        lines.append(
            f"- Captured inputs: {', '.join(f'`{x}`' for x in result.captured_inputs)}: the "
            "model's post-RoPE q, K, V on real text (`santa-bench capture`), a batch element "
            "per captured layer" + (", K/V tiled to the context" if tiled else "")
            + "; the *(captured)* columns are timed on them, the others on Gaussian inputs")
        for batch, best in result.captured_dense_latency.items():
            if best is not None:
                lines.append(f"- Fastest dense at B={batch} (captured): {best[0]}, "
                             f"{best[1]:.1f} us")
    lines += ["", "## Verdict", "",
              "| task family | tasks | dense score | "
              + " | ".join(f"fastest matched, B={b}" for b in result.batches) + " |",
              "|---|---|---|" + "---|" * len(result.batches)]
    dense_point = next(p for p in result.points if p.config == "dense")
    for family, tasks in [("all", result.tasks), *result.families.items()]:
        base = dense_point.overall if family == "all" else dense_point.families.get(family)
        cells = []
        for batch in result.batches:
            best = result.fastest(family, batch)
            if best is None:
                cells.append("no matched configuration timed")
                continue
            ret = best.overall if family == "all" else best.families[family]
            timing = best.timings[batch]
            text = (f"`{best.config}` {timing.speedup:.2f}x [{timing.low:.2f}, "
                    f"{timing.high:.2f}], retention {ret.retention:.3f}")
            if batch in best.captured:
                text += f", captured inputs {_speed(best.captured[batch])}"
            cells.append(text if timing.low > 1.0 else f"dense (the fastest matched, {text}, "
                         "is not faster)")
        label = "all informative" if family == "all" else family
        dense_score = f"{100 * base.dense:.1f}%" if base else "–"
        lines.append(f"| {label} | {len(tasks)} | {dense_score} | " + " | ".join(cells) + " |")
    lines += ["", "Fastest at each retention band (all informative tasks; retention's point "
              "estimate at least the band, with its interval):", "",
              "| retention | " + " | ".join(f"B={b}" for b in result.batches) + " |",
              "|---|" + "---|" * len(result.batches)]
    for band in RETENTION_BANDS:
        cells = []
        for batch in result.batches:
            best = result.fastest("all", batch, band)
            if best is None or best.overall is None:
                cells.append("none timed")
                continue
            cells.append(f"`{best.config}` {_speed(best.timings[batch])}, retention "
                         f"{_ret(best.overall)}")
        lines.append(f"| >= {band:.2f} | " + " | ".join(cells) + " |")
    captured = result.batches if result.has_captured else ()
    lines += ["", "## Every configuration", "",
              "| config | retention [95%] | score vs dense, points [95%] | KV read (model) | "
              + " | ".join(f"speedup B={b} [95%]" for b in result.batches)
              + "".join(f" | speedup B={b} (captured) [95%]" for b in captured)
              + (" | KV read (Gaussian inputs) | KV read (captured)" if captured
                 else " | KV read (kernel inputs)")
              + f" | over byte floor, B={'/'.join(map(str, result.batches))}"
              + " | index build | front |",
              "|---|---|---|---|" + "---|" * (len(result.batches) + len(captured))
              + "---|" * (2 if captured else 1) + "---|---|---|"]
    for p in result.points:
        builds = [t.index_build_ms for t in p.timings.values()
                  if not math.isnan(t.index_build_ms)]
        front = ", ".join(f"B={b}" for b in sorted(p.front)) or ""
        lines.append(
            f"| `{p.config}` | {_overall(p, len(result.tasks))} | "
            f"{'–' if (r := p.overall or p.partial) is None else _points(r)} | "
            f"{_pct(p.read_fraction)} | "
            + " | ".join(_speed(p.timings.get(b)) for b in result.batches)
            + "".join(f" | {_speed(p.captured.get(b))}" for b in captured)
            + f" | {_mean_reads(p.timings)}"
            + (f" | {_mean_reads(p.captured)}" if captured else "")
            + f" | {_floors(p.timings, result.batches)}"
            + f" | {f'{max(builds):.2f} ms' if builds else '–'} | {front} |")
    lines += ["", "Per task family (retention):", "",
              "| config | " + " | ".join(result.families) + " |",
              "|---|" + "---|" * len(result.families)]
    for p in result.points:
        lines.append(f"| `{p.config}` | "
                     + " | ".join(_ret(p.families.get(f)) for f in result.families) + " |")
    if result.missing:
        lines += ["", "## Missing", "",
                  "Configurations measured on one side only (or on some of the tasks), with "
                  "the command that measures the rest:", "",
                  "| config | missing | command |", "|---|---|---|"]
        lines += [f"| `{c}` | {what} | `{cmd}` |" for c, what, cmd in result.missing]
        lacking = [c for c, what, _ in result.missing if what.startswith("kernel rows at")]
        if lacking:
            lines += ["", "Every missing kernel row in one run:", "", "```bash",
                      kernel_command(",".join(lacking), result.shape, result.ctx,
                                     result.batches), "```"]
        lacking = [c for c, what, _ in result.missing if what.startswith("kernel rows on")]
        if lacking:
            timed = [t for p in result.points for t in p.captured.values()]
            lines += ["", "Every missing kernel row on captured inputs in one run:", "",
                      "```bash", captured_kernel_command(",".join(lacking), result.shape,
                                                         result.ctx, result.batches, timed),
                      "```"]
    if result.set_aside:
        lines += ["", "Left out: configurations run with some layers dense (`--dense-layers`), "
                  "whose step time needs the model's layer count (give `--shape "
                  "HEADS/KV_HEADS/HEAD_DIM/LAYERS`): "
                  + ", ".join(f"`{c}`" for c in result.set_aside) + "."]
    return "\n".join(lines) + "\n"


def spread_labels(ax: Any, labels: list[Any]) -> None:
    """Moves annotations up, a label's height at a time, until none overlaps one placed
    before it (the labels of near points otherwise print over each other)."""
    renderer = ax.figure.canvas.get_renderer()
    placed: list[Any] = []
    for label in sorted(labels, key=lambda t: t.xy[1]):
        for _ in range(len(labels) + 1):
            box = label.get_window_extent(renderer)
            if not any(box.overlaps(other) for other in placed):
                break
            x, y = label.get_position()
            label.set_position((x, y + box.height * 72 / ax.figure.dpi + 1))
        placed.append(label.get_window_extent(renderer))


def figure(result: Verdict, path: Path) -> Path:
    """Speedup against retention, one point per configuration and a panel per batch, the
    Pareto front drawn; saved to ``path`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(result.batches), figsize=(6.0 * len(result.batches), 4.6),
                             squeeze=False)
    panels = []
    for ax, batch in zip(axes[0], result.batches, strict=True):
        captured_shown = False
        points = [p for p in result.points if p.overall is not None and batch in p.timings
                  and not math.isnan(p.timings[batch].speedup)]
        labels: list[Any] = []
        panels.append((ax, labels))
        for p in points:
            method = REGISTRY.get(p.config.split(":")[0])
            style = method.plot
            t = p.timings[batch]
            ax.errorbar(p.overall.retention, t.speedup,
                        xerr=[[p.overall.retention - p.overall.low],
                              [p.overall.high - p.overall.retention]],
                        yerr=[[max(t.speedup - t.low, 0)], [max(t.high - t.speedup, 0)]],
                        fmt=style.marker or "o", color=style.colour or None, capsize=2,
                        markersize=6, alpha=0.9)
            labels.append(ax.annotate(p.config, (p.overall.retention, t.speedup), fontsize=6,
                                      xytext=(3, 3), textcoords="offset points"))
            c = p.captured.get(batch)
            if c is not None and not math.isnan(c.speedup):  # open: on captured inputs
                ax.plot([p.overall.retention] * 2, [t.speedup, c.speedup], color=style.colour
                        or "grey", lw=0.6, alpha=0.6)
                ax.plot(p.overall.retention, c.speedup, marker=style.marker or "o",
                        mfc="none", color=style.colour or None, markersize=6, ls="none",
                        label="captured inputs (open)" if not captured_shown else None)
                captured_shown = True
        front = sorted((p for p in points if batch in p.front),
                       key=lambda p: p.overall.retention)
        if front:
            ax.plot([p.overall.retention for p in front],
                    [p.timings[batch].speedup for p in front], "k--", lw=1, label="Pareto front")
        ax.axhline(1.0, color="grey", lw=0.8)
        for band in RETENTION_BANDS:
            ax.axvline(band, color="grey", lw=0.6, ls=":")
        ax.set_xlabel("retention against dense (informative tasks)")
        ax.set_ylabel("speedup over the fastest dense kernel")
        ax.set_title(f"B={batch}", fontsize=10)
        ax.legend(fontsize=7, loc="lower left")
    fig.suptitle(f"{result.model}, ctx {result.ctx // 1024}k, {result.gpu} "
                 f"({result.shape.heads}/{result.shape.kv_heads}/{result.shape.head_dim})",
                 fontsize=10)
    fig.tight_layout()
    for ax, labels in panels:
        spread_labels(ax, labels)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=150)
    plt.close(fig)
    return path


def per_gpu(out: Path, gpu: str) -> Path:
    """``plots/pareto-nvidia-h200`` from ``plots/pareto``: the output of one GPU's verdict
    where the kernel rows span several."""
    slug = "-".join("".join(c if c.isalnum() else " " for c in gpu.lower()).split())
    return out.with_name(f"{out.name}-{slug}")


def write(result: Verdict, out: Path, command: str = "") -> list[Path]:
    """Writes ``<out>.md``, ``<out>.csv`` and ``<out>.png``; returns their paths."""
    out.parent.mkdir(parents=True, exist_ok=True)
    md, csv, png = (out.with_name(out.name + ext) for ext in (".md", ".csv", ".png"))
    md.write_text(markdown(result, command), encoding="utf-8")
    table_frame(result).to_csv(csv, index=False)
    figure(result, png)
    return [md, csv, png]
