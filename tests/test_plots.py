"""`santa-bench plot`: every preset from a small synthetic store, checked through matplotlib."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pandas as pd
import pytest
from typer.testing import CliRunner

from santa_bench import plots
from santa_bench.cli import app
from santa_bench.plots.rows import with_series
from santa_bench.results import ResultStore

ENV = {"device": "cuda", "gpu_name": "NVIDIA Test GPU", "torch": "2.13.0", "triton": "3.6.0",
       "date": "2026-01-02T03:04:05+00:00", "command": "santa-bench kernel ..."}
SHAPE = {"heads": 32, "kv_heads": 8, "head_dim": 128, "dtype": "bf16", "l2": "cold"}
CONTEXTS, BUDGETS = (8192, 32768), (64, 256)
SAMPLED = {"santa-prop": "santa", "santa-flash": "santa"}
DENSE = {"sdpa-cudnn": "baseline", "triton-splitkv": "baseline"}
TASKS = ("niah", "qa1")


def _kernel_rows(method: str, s: int | None, ctx: int, batch: int) -> list[dict]:
    base = 10.0 * ctx / 8192 * batch
    latency = base * (0.8 if s else 1.0) * (1.2 if method == "santa-flash" else 1.0)
    if method == "triton-splitkv":
        latency = base * 1.02
    rows = [
        {"metric": "latency", "value": latency, "unit": "us", "q1_us": latency * 0.98,
         "q3_us": latency * 1.03},
        {"metric": "rel_l2_vs_dense", "value": 2.0 / (s or 1e3) ** 0.5, "unit": ""},
        {"metric": "kv_read_fraction", "value": 0.5 + (s or 0) / 2048 if s else 1.0, "unit": ""},
    ]
    if method != "sdpa-cudnn":
        speedup = base / latency
        rows.append({"metric": "speedup_vs_best_dense", "value": speedup, "unit": "x",
                     "ci_low": speedup * 0.99, "ci_high": speedup * 1.01,
                     "best_dense": "sdpa-cudnn"})
    return rows


def _build_store(root) -> ResultStore:
    """Return a store: kernel rows (2 timings x 2 batches x 2 contexts), RULER-like scores,
    and SANTA++ stage rows."""
    store = ResultStore(root)
    for timing in ("graph", "events"):
        run = store.start_run({**ENV, "timing": timing}, run_id=f"kernels-{timing}")
        for ctx in CONTEXTS:
            for batch in (1, 8):
                common = {"kind": "kernel", "ctx": ctx, "batch": batch, "timing": timing, **SHAPE}
                for method, family in DENSE.items():
                    case = {"method": method, "family": family, **common}
                    run.write_case(case, _kernel_rows(method, None, ctx, batch))
                for method, family in SAMPLED.items():
                    for s in BUDGETS:
                        case = {"method": method, "family": family, "S": s, "tile": 64, **common}
                        run.write_case(case, _kernel_rows(method, s, ctx, batch))
    stages = store.start_run({**ENV, "command": "santa-bench kernel --methods santa-pp"},
                             run_id="stages")
    for m in (32, 64):
        case = {"kind": "kernel", "method": "santa-pp", "family": "santapp", "M": m,
                "ctx": 32768, "batch": 1, "timing": "graph", **SHAPE}
        stages.write_case(case, [
            {"metric": "stage_represent_us", "value": 3.0, "unit": "us"},
            {"metric": "stage_select_us", "value": 2.0 + m / 32, "unit": "us"},
            {"metric": "stage_gather_us", "value": 5.0 + m / 16, "unit": "us"},
            {"metric": "latency", "value": 11.0 + m / 10, "unit": "us"},
        ])
    accuracy = store.start_run({**ENV, "command": "santa-bench accuracy ruler"}, run_id="ruler")
    for task in TASKS:
        for seed in (0, 1):
            case = {"kind": "accuracy", "method": "dense", "family": "dense", "task": task,
                    "ctx": 32768, "seed": seed}
            accuracy.write_case(case, [{"metric": "score", "value": 90.0 + seed, "unit": "%"}])
            for method in SAMPLED:
                for s in BUDGETS:
                    case = {"kind": "accuracy", "method": method, "family": "santa", "S": s,
                            "task": task, "ctx": 32768, "seed": seed}
                    score = 90.0 - 200.0 / s + seed
                    accuracy.write_case(case, [{"metric": "score", "value": score, "unit": "%"}])
    return store


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> ResultStore:
    return _build_store(tmp_path_factory.mktemp("store"))


@pytest.fixture(scope="module")
def frame(store) -> pd.DataFrame:
    return store.load()


def _legend_labels(fig) -> list[str]:
    assert len(fig.legends) == 1
    return [text.get_text() for text in fig.legends[0].get_texts()]


def _title(fig) -> str:
    return fig.get_suptitle()


def test_latency_vs_ctx(store, frame):
    fig, points = plots.latency_vs_ctx(frame, store.runs())
    axes = fig.axes
    assert len(axes) == 4  # 2 timings x 2 batches
    assert all(ax.get_xscale() == "log" and ax.get_yscale() == "log" for ax in axes)
    assert "latency" in _title(fig) and "NVIDIA Test GPU" in _title(fig)
    assert "(sampled methods at S=64, M=32)" in _title(fig)
    assert "torch 2.13.0" in _title(fig) and "Llama-3.1-8B" in _title(fig)
    assert axes[-1].get_xlabel() == "context length (tokens)"
    assert "(µs)" in axes[0].get_ylabel()
    assert [t.get_text() for t in axes[-1].get_xticklabels()] == ["8k", "32k"]
    # one line per method (dense baselines included), each through both contexts
    for ax in axes:  # error-bar containers: one per series drawn in the panel
        series = {c.get_label(): len(c.lines[0].get_xdata()) for c in ax.containers}
        assert {name: series[name] for name in (*DENSE, *SAMPLED)} == dict.fromkeys(
            (*DENSE, *SAMPLED), len(CONTEXTS)
        )
        assert len(series) == len(DENSE) + len(SAMPLED) + ("santa-pp" in series)
    assert "santa-pp" in {c.get_label() for c in axes[2].containers}  # graph timing, B=1
    assert set(_legend_labels(fig)) == {*DENSE, *SAMPLED, "santa-pp"}
    assert len(points) == 4 * 4 * len(CONTEXTS) + 1  # + SANTA++ at M=32, 32k, B=1, graph
    assert set(points.columns) >= {"ctx", "latency_us", "q1_us", "q3_us", "method", "timing"}


def test_speedup_vs_S(store, frame):
    fig, points = plots.speedup_vs_S(frame, store.runs())
    assert len(fig.axes) == 2 * 2 * len(CONTEXTS)  # (timing, batch) rows x ctx columns
    assert "Speedup" in _title(fig) and "sdpa-cudnn" in _title(fig)
    ax = fig.axes[0]
    assert len(ax.patches) == len(SAMPLED) * len(BUDGETS)
    assert [t.get_text() for t in ax.get_xticklabels()] == ["64", "256"]
    assert ax.get_ylabel() == "speedup vs best dense (×)"
    assert fig.axes[-1].get_xlabel().startswith("S")
    assert _legend_labels(fig) == ["best dense (1×)", "santa-flash", "santa-prop"]
    assert (points.ci_low <= points.speedup).all() and (points.speedup <= points.ci_high).all()


def test_error_vs_S_has_slope_guide(store, frame):
    fig, points = plots.error_vs_S(frame, store.runs())
    assert len(fig.axes) == 2 * len(CONTEXTS)
    for ax in fig.axes:
        assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
        guide = [line for line in ax.get_lines() if "S^{-1/2}" in line.get_label()]
        assert len(guide) == 1
        x, y = guide[0].get_xydata().T
        assert y[-1] / y[0] == pytest.approx((x[-1] / x[0]) ** -0.5)
    assert "rel. L2" in fig.axes[0].get_ylabel()
    labels = _legend_labels(fig)
    assert {"santa-flash", "santa-prop"} <= set(labels)
    assert "dense kernels (bf16 rounding)" in labels
    assert set(points.S) == set(BUDGETS)


def test_ruler_vs_budget_draws_dense_band(store, frame):
    fig, points = plots.ruler_vs_budget(frame, store.runs())
    assert len(fig.axes) == len(TASKS)
    assert [ax.get_title() for ax in fig.axes] == [f"{t} · ctx 32k" for t in TASKS]
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and ax.get_ylabel() == "score (%)"
    assert len(ax.patches) == 1  # the dense band (axhspan)
    low, high = ax.patches[0].get_path().get_extents().y0, ax.patches[0].get_path().get_extents().y1
    assert high > low
    assert _legend_labels(fig) == ["dense (dense band)", "santa-flash", "santa-prop"]
    assert set(points.task) == set(TASKS)


def test_pareto_joins_accuracy_and_latency(store, frame):
    fig, points = plots.pareto(frame, store.runs())
    assert len(fig.axes) == 4  # (timing, batch) panels
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and ax.get_xlabel() == "latency per decode step (µs)"
    assert len(ax.collections) == 3  # dense + two sampled methods
    labels = _legend_labels(fig)
    assert "dense (best dense kernel)" in labels and "Pareto front" in labels
    prop = points[(points.series == "santa-prop") & (points.timing == "graph")
                  & (points.batch == 1)]
    assert len(prop) == len(BUDGETS) and (prop.ctx == 32768).all()
    assert prop.latency_us.tolist() == pytest.approx([32.0, 32.0])


def test_reads(store, frame):
    fig, _points = plots.reads(frame, store.runs())
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and ax.get_ylim() == (0, 1.08)
    assert ax.yaxis.get_major_formatter().format_data(0.5).startswith("50")
    assert "dense (100%)" in _legend_labels(fig)


def test_stages_stacks_each_case(store, frame):
    fig, points = plots.stages(frame, store.runs())
    ax = fig.axes[0]
    assert len(ax.patches) == 2 * 3  # two SANTA++ cases x three stages
    assert set(_legend_labels(fig)) == {"represent", "select", "gather", "measured total"}
    assert "M=32" in ax.get_xticklabels()[0].get_text()
    totals = points.groupby("case").stage_us.sum().tolist()
    assert totals == pytest.approx([13.0, 16.0])


def test_tables_put_anchors_beside_ours(store, frame):
    tables = plots.render_tables(frame)
    kernels = tables.frames["kernels"]
    row = kernels[(kernels.ctx == "32k") & (kernels.B == 1) & (kernels.kernel == "S²ANTA-prop")]
    assert row["anchor (µs)"].tolist() == ["90.8", "102.2"]
    assert "docs/anchors.md" in tables.markdown and "\\begin{tabular}" in tables.latex
    assert "| 32k | 1 | sdpa-cudnn | 49.6–50.3 | 40.0 |" in tables.markdown


def test_cli_renders_every_preset(store, tmp_path):
    out = tmp_path / "plots"
    result = CliRunner().invoke(
        app, ["plot", "--results", str(store.root), "--out", str(out)], catch_exceptions=False
    )
    assert result.exit_code == 0, result.output
    for name in plots.FIGURES:
        for suffix in ("png", "pdf", "csv"):
            assert (out / f"{name}.{suffix}").stat().st_size > 0, (name, suffix)
    assert (out / "tables.md").exists() and (out / "tables.tex").exists()
    assert "no data" not in result.output


def test_cli_where_and_run_filter(store, tmp_path):
    out = tmp_path / "plots"
    result = CliRunner().invoke(
        app, ["plot", "latency-vs-ctx", "reads", "--results", str(store.root), "--run",
              "kernels-graph", "--where", "batch == 1", "--out", str(out)],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    points = pd.read_csv(out / "latency-vs-ctx.csv")
    assert set(points.timing) == {"graph"} and set(points.batch) == {1}
    assert not (out / "speedup-vs-S.png").exists()


def test_cli_without_data_prints_producers(tmp_path):
    (tmp_path / "empty").mkdir()  # an empty store (a missing folder is an error)
    result = CliRunner().invoke(
        app, ["plot", "--results", str(tmp_path / "empty"), "--out", str(tmp_path / "out")],
        catch_exceptions=False,
    )
    assert result.exit_code == 0
    for name in plots.PRESETS:
        assert f"{name}: no data; produce it with: {plots.PRODUCERS[name]}" in result.output
    assert "santa-bench accuracy ruler" in result.output
    assert not (tmp_path / "out").exists()


def test_cli_rejects_unknown_preset_and_bad_query(store, tmp_path):
    bad = CliRunner().invoke(app, ["plot", "nope", "--results", str(store.root)])
    assert bad.exit_code == 2 and "unknown preset" in bad.output
    query = CliRunner().invoke(app, ["plot", "--results", str(store.root), "--where", "(("])
    assert query.exit_code == 2


@pytest.mark.parametrize(
    "where",
    [
        "batch == batch.to_csv('{marker}')",  # a column's method
        "batch == 1 or method.to_pickle('{marker}')",
        "batch == @store.__class__.__init__.__globals__['pd'].io.common.os.system("
        "'touch {marker}')",  # a local of the command, then a module's os
    ],
)
def test_cli_where_refuses_code_and_runs_nothing(store, tmp_path, where):
    marker = tmp_path / "marker"
    result = CliRunner().invoke(app, ["plot", "--results", str(store.root), "--where",
                                      where.format(marker=marker), "--out", str(tmp_path)])
    assert not marker.exists()
    assert result.exit_code == 2 and "not allowed" in result.output
    assert len(result.output.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("where", "message"),
    [("batch.__class__", "Attribute is not allowed"), ("abs(batch) == 1", "Call is not allowed"),
     ("@where == ''", "@ references are not allowed"), ("lambda: batch", "Lambda is not allowed"),
     ("[b for b in batch]", "ListComp is not allowed"), ("batch[0] == 1", "Subscript"),
     ("gpu == 'h100'", "unknown column(s) ['gpu']")],
)
def test_cli_where_errors_are_one_line(store, tmp_path, where, message):
    result = CliRunner().invoke(app, ["plot", "--results", str(store.root), "--where", where,
                                      "--out", str(tmp_path / "out")])
    assert result.exit_code == 2 and message in result.output
    assert result.output.startswith("error: --where: ")
    assert not (tmp_path / "out").exists()


def test_cli_where_keeps_the_documented_syntax(store, tmp_path):
    out = tmp_path / "plots"
    result = CliRunner().invoke(
        app, ["plot", "speedup-vs-S", "--results", str(store.root), "--where",
              "batch == 1 and timing == 'graph' and not (method in ['santa-flash'] and S > 64)",
              "--out", str(out)], catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    points = pd.read_csv(out / "speedup-vs-S.csv")
    assert set(points.timing) == {"graph"} and set(points.batch) == {1}
    assert set(zip(points.method, points.S, strict=True)) == {
        ("santa-flash", 64), ("santa-prop", 64), ("santa-prop", 256)}


def test_cli_plots_the_newest_run_of_each_case(tmp_path):
    """A case timed again in a later run shows the later figure only (``--all-runs``: the
    median over both), also when ``--where`` leaves out the later run."""
    store = ResultStore(tmp_path / "store")
    case = {"kind": "kernel", "method": "santa-prop", "family": "santa", "S": 64, "tile": 64,
            "ctx": 8192, "batch": 1, "timing": "graph", **SHAPE}
    dense = {**case, "method": "sdpa-cudnn", "family": "baseline"}
    dense.pop("S"), dense.pop("tile")
    for run_id, date, speedup in (("old", "2026-01-01T00:00:00+00:00", 1.0),
                                  ("new", "2026-02-01T00:00:00+00:00", 2.0)):
        run = store.start_run({**ENV, "date": date}, run_id=run_id)
        run.write_case(dense, [{"metric": "latency", "value": 10.0, "unit": "us"}])
        run.write_case(case, [
            {"metric": "latency", "value": 10.0 / speedup, "unit": "us"},
            {"metric": "speedup_vs_best_dense", "value": speedup, "unit": "x",
             "ci_low": speedup, "ci_high": speedup, "best_dense": "sdpa-cudnn"}])

    def plotted(*extra: str) -> list[float]:
        out = tmp_path / f"plots{len(extra)}"
        result = CliRunner().invoke(app, ["plot", "speedup-vs-S", "--results", str(store.root),
                                          "--out", str(out), *extra], catch_exceptions=False)
        assert result.exit_code == 0, result.output
        return sorted(pd.read_csv(out / "speedup-vs-S.csv").speedup)

    assert plotted() == [2.0]
    assert plotted("--all-runs") == [1.5]  # the median over the two runs
    assert plotted("--where", "run_id == 'old'") == [1.0]


def test_variants_split_into_series_with_their_own_shades():
    """A parameter set on some rows and at its default (NA) on others splits a method into
    series; each series gets its own shade of the method's colour."""
    frame = pd.DataFrame({
        "method": ["santapp"] * 4, "family": ["santapp"] * 4, "M": [32] * 4,
        "team_size": [16.0, 16.0, 64.0, 64.0], "reps": [None, "int8", None, "int8"],
    })
    data = with_series(frame)
    assert sorted(data.series) == ["santapp team_size=16", "santapp team_size=16 reps=int8",
                                   "santapp team_size=64", "santapp team_size=64 reps=int8"]
    assert data.colour.nunique() == 4
    assert plots.method_colour("santapp", "santapp") in set(data.colour)


def test_figures_leave_out_kernel_rows_timed_on_captured_attention():
    import pandas as pd

    from santa_bench.plots.rows import kernel_rows

    frame = pd.DataFrame({"kind": ["kernel"] * 3, "inputs": ["gaussian", None, "captured:m:L1"],
                          "value": [1.0, 2.0, 3.0]})
    assert kernel_rows(frame).value.tolist() == [1.0, 2.0]
