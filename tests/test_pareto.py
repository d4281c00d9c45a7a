"""santa-bench pareto: the join of accuracy and kernel rows, the front, the verdict."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from santa_bench import pareto, verdict_output
from santa_bench.cli import app
from santa_bench.results import ResultStore
from santa_bench.stores import StoreSet

MODEL = "qwen2.5-coder-0.5b"
ENV = {"device": "cuda", "gpu_name": "NVIDIA H200", "torch": "2.11.0", "triton": "3.6.0",
       "date": "2026-12-04T10:00:00+00:00", "git_sha": "abcdef1234567"}
TASKS = ("niah_single_1", "niah_multikey_1", "vt", "qa_1")
N = 40
DENSE_RATES = {"niah_single_1": 0.95, "niah_multikey_1": 0.8, "vt": 0.6, "qa_1": 0.05}


def _scores(rng: np.random.Generator, rate: float) -> list[int]:
    return [int(x) for x in rng.random(N) < rate]


def _accuracy(run, method: str, params: dict, rates: dict[str, float], seed: int) -> None:
    rng = np.random.default_rng(seed)
    for task in TASKS:
        per_sample = _scores(rng, rates[task])
        case = {"kind": "accuracy", "task": f"ruler-{task}", "model": MODEL, "method": method,
                "ctx": 32768, "n": N, "device": "cuda", **params}
        run.write_case(case, [
            {"metric": "score", "value": float(np.mean(per_sample)),
             "per_sample": json.dumps(per_sample)},
            {"metric": "decode_kv_read_fraction", "value": 0.5},
        ])


def _kernel(run, method: str, params: dict, batch: int, latency: float, speedup: float,
            heads: tuple[int, int, int] = (14, 2, 64)) -> None:
    case = {"kind": "kernel", "method": method, "ctx": 32768, "batch": batch,
            "heads": heads[0], "kv_heads": heads[1], "head_dim": heads[2], "device": "cuda",
            **params}
    run.write_case(case, [
        {"metric": "latency", "value": latency, "unit": "us"},
        {"metric": "speedup_vs_best_dense", "value": speedup, "ci_low": speedup * 0.98,
         "ci_high": speedup * 1.02, "best_dense": "sdpa-cudnn"},
        {"metric": "kv_read_fraction", "value": 0.5},
    ])


@pytest.fixture()
def store(tmp_path):
    root = tmp_path / "results"
    results = ResultStore(root)
    acc = results.start_run({**ENV, "command": "santa-bench accuracy ruler"}, "acc")
    dense_rates = DENSE_RATES
    _accuracy(acc, "dense", {}, dense_rates, seed=1)
    # the same samples decoded by an accurate sampler: dense's scores, one sample flipped
    rng = np.random.default_rng(1)
    for task in TASKS:
        per_sample = _scores(rng, dense_rates[task])
        case = {"kind": "accuracy", "task": f"ruler-{task}", "model": MODEL,
                "method": "santa-prop", "S": 128, "ctx": 32768, "n": N, "device": "cuda"}
        acc.write_case(case, [
            {"metric": "score", "value": float(np.mean(per_sample)),
             "per_sample": json.dumps(per_sample)},
            {"metric": "decode_kv_read_fraction", "value": 0.5}])
    # a fast, inaccurate one (recording a default explicitly must not split its key)
    _accuracy(acc, "santapp", {"M": 32, "sink": 4, "draw": "pooled"},
              {t: r * 0.5 for t, r in dense_rates.items()}, seed=2)
    _accuracy(acc, "santa-sys", {"S": 64}, dense_rates, seed=1)  # no kernel rows
    kern = results.start_run({**ENV, "command": "santa-bench kernel"}, "kern")
    for batch, (prop, pp, dense_us) in {1: (1.5, 2.5, 30.0), 8: (1.8, 4.0, 150.0)}.items():
        _kernel(kern, "santa-prop", {"S": 128}, batch, dense_us / prop, prop)
        _kernel(kern, "santapp", {"M": 32, "draw": "pooled"}, batch, dense_us / pp, pp)
        _kernel(kern, "sdpa-cudnn", {"family": "baseline"}, batch, dense_us, 1.0)
        # another model's shape, and a retired santa-flash kernel: neither may be joined
        _kernel(kern, "santa-prop", {"S": 128}, batch, 1.0, 30.0, heads=(32, 8, 128))
    _kernel(kern, "santa-flash", {"S": 2048, "gather": "masked"}, 1, 40.0, 0.7)
    return StoreSet(root)


def test_config_key_fills_defaults_and_ignores_retired_options():
    santapp = {"method": "santapp", "draw": "pooled"}
    assert pareto.config_key({**santapp, "M": 32.0, "sink": 4}) == "santapp:M=32"
    assert pareto.config_key({**santapp, "M": 32, "sink": 0.0, "window": 0}) == \
        "santapp:M=32,sink=0,window=0"
    # stored before draw=pooled became the default: it drew per head
    assert pareto.config_key({"method": "santapp", "M": 32.0}) == "santapp:M=32,draw=head"
    assert pareto.config_key({"method": "santa-prop", "S": 128.0}) == "santa-prop:S=128"
    assert pareto.config_key({"method": "santa-flash", "S": 2048, "gather": "compact"}) == \
        pareto.config_key({"method": "santa-flash", "S": 2048})
    assert pareto.config_key({"method": "no-such-method"}) is None
    # the selection methods: budgets always named, other parameters where not default
    assert pareto.config_key({"method": "quest", "page": 16, "pages": 64.0,
                              "shared": "group"}) == "quest:pages=64"
    assert pareto.config_key({"method": "vattention", "epsilon": 0.1, "delta": 0.05}) == \
        "vattention:epsilon=0.1"
    assert pareto.config_key({"method": "topk-santa", "k": 64, "S": 128}) == \
        "topk-santa:k=64,S=128"


def test_only_the_current_flash_kernel_times_santa_flash():
    """Kernel rows stored before santa-flash had one kernel carry gather / passes: only
    the one-pass compact kernel's (gather=compact, one pass) time what santa-flash runs
    now, as do rows since, which name the function that ran and no gather; the masked
    kernel (its default then, no gather) and the two-pass kernels are left out."""
    nan = float("nan")
    rows = pd.DataFrame([
        {"method": "santa-flash", "gather": None, "passes": nan},  # masked, the old default
        {"method": "santa-flash", "gather": "masked", "passes": nan},
        {"method": "santa-flash", "gather": "compact", "passes": 2.0},
        {"method": "santa-flash", "gather": "inline", "passes": 2.0},
        {"method": "santa-flash", "gather": "compact", "passes": nan},
        {"method": "santa-flash", "gather": None, "passes": nan,
         "kernel_function": "triton_santa_flash.santa_flash"},
        {"method": "santa-prop", "gather": None, "passes": nan},
    ])
    assert list(pareto._retired_flash(rows)) == [True, True, True, True, False, False, False]
    fresh = pd.DataFrame([{"method": "santa-flash", "kernel_function": "x"},
                          {"method": "santa-prop", "kernel_function": None}])
    assert not pareto._retired_flash(fresh).any()  # a store without the old columns
    assert pareto._retired_flash(pd.DataFrame([{"method": "santa-flash"}])).all()


def test_min_dense_decides_which_tasks_count(store):
    frame, runs = store.load(), store.runs()
    dense = {t: np.mean(s) for t, s in pareto.accuracy_rows(frame, MODEL, 32768)["dense"]
             .per_task.items()}
    for floor in (0.0, 0.5, 0.9):
        result = pareto.verdict(frame, runs, MODEL, min_dense=floor)
        assert result.tasks == sorted(t for t, v in dense.items() if v >= floor)
        assert f"dense >= {100 * floor:.0f}%" in verdict_output.markdown(result, "cmd")
    assert "ruler-qa_1" in pareto.verdict(frame, runs, MODEL, min_dense=0.0).tasks
    with pytest.raises(pareto.ParetoError, match="min-dense"):
        pareto.verdict(frame, runs, MODEL, min_dense=1.5)


def test_verdict_joins_marks_the_front_and_picks_the_fastest_matched(store):
    result = pareto.verdict(store.load(), store.runs(), MODEL)
    assert str(result.shape) == "14/2/64" and result.gpu == "NVIDIA H200"
    # qa_1 (dense 5%) is uninformative and left out
    assert "ruler-qa_1" not in result.tasks and len(result.tasks) == 3
    points = {p.config: p for p in result.points}
    prop, pp = points["santa-prop:S=128"], points["santapp:M=32"]
    assert prop.overall.retention == pytest.approx(1.0)
    assert prop.overall.low < 1.0 < prop.overall.high or prop.overall.low == 1.0
    assert pp.overall.retention < 0.7
    assert prop.timings[1].speedup == pytest.approx(1.5)
    assert pp.timings[8].speedup == pytest.approx(4.0)
    # both are on the front (one faster, the other more accurate)
    assert prop.front == {1, 8} and pp.front == {1, 8}
    assert result.fastest("all", 1).config == "santa-prop:S=128"
    assert result.fastest("RULER NIAH", 8).config == "santa-prop:S=128"
    # the other shape's 30x and the retired kernel are not joined
    assert "santa-flash:S=2048" not in points
    assert all(t.speedup < 5 for p in result.points for t in p.timings.values())
    # santa-sys S=64 has accuracy but no kernel rows: listed with the command
    missing = [m for m in result.missing if m[0] == "santa-sys:S=64"]
    assert missing and missing[0][2].startswith("santa-bench kernel --ctx 32k --batch 1,8 "
                                                 "--heads 14 --kv-heads 2 --head-dim 64")
    assert "santa-sys:S=64" not in {p.config for p in result.points if p.front}


def test_a_configuration_with_dense_layers_is_its_own_point_timed_as_a_mixed_step(
        store, tmp_path):
    """Rows run with some layers dense (``--dense-layers``) must not replace the
    all-sampled rows of the same method configuration (written later, they would): they
    make a point of their own whose time is the mean layer of a step with d of the
    model's 24 layers dense; dense with dense layers is dense; an empty value is none;
    without a layer count (a ``--shape`` of three fields) they are set aside and named."""
    def verdict_with(rows_of: dict, **kw) -> pareto.Verdict:
        extra = ResultStore(tmp_path / str(len(list(tmp_path.iterdir()))))
        run = extra.start_run({**ENV, "command": "santa-bench accuracy ruler"}, "later")
        for layers, rate in rows_of.items():
            _accuracy(run, "santapp", {"M": 32, "draw": "pooled", "dense_layers": layers},
                      dict.fromkeys(TASKS, rate), seed=5)
        _accuracy(run, "dense", {"dense_layers": "1,0"}, DENSE_RATES, seed=1)  # dense's
        frame = pd.concat([store.load(), extra.load()], ignore_index=True)
        return pareto.verdict(frame, [*store.runs(), *extra.runs()], MODEL, **kw)

    plain = pareto.verdict(store.load(), store.runs(), MODEL)
    before = {p.config: p for p in plain.points}["santapp:M=32"]
    assert before.overall.retention < 0.7 and not plain.set_aside
    result = verdict_with({"1,0": 0.99})
    points = {p.config: p for p in result.points}
    assert points["santapp:M=32"].overall.retention == pytest.approx(before.overall.retention)
    assert points["dense"].overall.retention == 1.0  # the layered dense rows are dense's
    layered = points["santapp:M=32 dense_layers=0,1"]
    assert layered.overall.retention > 1.0
    for batch, s in ((1, 2.5), (8, 4.0)):  # the kernel rows of santapp:M=32
        mixed = layered.timings[batch]
        assert mixed.speedup == pytest.approx(24 / (22 / s + 2))
        assert mixed.low == pytest.approx(24 / (22 / (s * 0.98) + 2))
        dense_us = {1: 30.0, 8: 150.0}[batch]
        assert mixed.latency_us == pytest.approx((22 * dense_us / s + 2 * dense_us) / 24)
        assert mixed.read_fraction == pytest.approx((22 * 0.5 + 2) / 24)
    assert "santapp:M=32 dense_layers=0,1" in verdict_output.markdown(result)
    assert pareto.accuracy_command("santapp:M=32 dense_layers=0,1", MODEL, 32768,
                                   ["ruler-vt"], 50).endswith(
        "--methods santapp:M=32 --dense-layers 0,1 --device cuda")
    assert "santapp:M=32 dense_layers" not in {
        p.config for p in verdict_with({"": 0.99}).points}  # no dense layer: plain rows
    blind = verdict_with({"0,1": 0.99}, shape=pareto.Shape.parse("14/2/64"))
    assert blind.set_aside == ["santapp:M=32 dense_layers=0,1"]
    assert "santapp:M=32 dense_layers=0,1" not in {p.config for p in blind.points}
    assert "`santapp:M=32 dense_layers=0,1`" in verdict_output.markdown(blind)
    assert pareto.Shape.parse("14/2/64/24").layers == 24


def test_a_dominated_point_is_off_the_front(store, tmp_path):
    results = ResultStore(tmp_path / "results")
    kern = results.start_run({**ENV, "command": "santa-bench kernel"}, "slow")
    for batch in (1, 8):  # santa-sys S=64: as accurate as santa-prop, slower: dominated
        _kernel(kern, "santa-sys", {"S": 64}, batch, 25.0, 1.2)
    store = StoreSet(tmp_path / "results")
    points = {p.config: p for p in pareto.verdict(store.load(), store.runs(), MODEL).points}
    sys_ret = points["santa-sys:S=64"].overall.retention
    assert sys_ret <= points["santa-prop:S=128"].overall.retention
    assert points["santa-sys:S=64"].front == set()


def test_a_point_slower_than_dense_and_less_accurate_is_off_the_front(tmp_path):
    """Dense (speedup 1, retention 1) dominates what is slower and no more accurate, also
    where no other configuration does: here the only configuration besides dense."""
    results = ResultStore(tmp_path / "results")
    acc = results.start_run({**ENV, "command": "santa-bench accuracy ruler"}, "acc")
    rates = {"niah_single_1": 0.95, "niah_multikey_1": 0.8, "vt": 0.6, "qa_1": 0.05}
    _accuracy(acc, "dense", {}, rates, seed=1)
    _accuracy(acc, "quest", {"pages": 64}, {t: r * 0.8 for t, r in rates.items()}, seed=3)
    kern = results.start_run({**ENV, "command": "santa-bench kernel"}, "kern")
    for batch in (1, 8):
        _kernel(kern, "sdpa-cudnn", {"family": "baseline"}, batch, 30.0, 1.0)
        _kernel(kern, "quest", {"pages": 64}, batch, 60.0, 0.5)  # half dense's speed
        _kernel(kern, "santa-prop", {"S": 128}, batch, 20.0, 1.5)  # fast, no accuracy rows
    store = StoreSet(tmp_path / "results")
    points = {p.config: p for p in pareto.verdict(store.load(), store.runs(), MODEL).points}
    quest = points["quest:pages=64"]
    assert quest.overall.retention < 1.0 and quest.timings[1].speedup == pytest.approx(0.5)
    assert quest.front == set()


def test_retention_interval_covers_and_narrows():
    rng = np.random.default_rng(0)
    dense = rng.random(200) < 0.7
    noisy = np.where(rng.random(200) < 0.1, ~dense, dense)
    a = pareto.Accuracy({"ruler-x": dense.astype(float)}, 1.0)
    b = pareto.Accuracy({"ruler-x": noisy.astype(float)}, 0.5)
    ret = pareto.retention(b, a, ["ruler-x"])
    assert ret.low < ret.retention < ret.high
    same = pareto.retention(a, a, ["ruler-x"])
    assert same.low == same.high == same.retention == 1.0
    assert pareto.retention(b, a, ["ruler-y"]) is None  # a task it lacks


def test_cli_writes_markdown_csv_and_figure(store, tmp_path):
    out = tmp_path / "plots" / "pareto"
    result = CliRunner().invoke(app, ["pareto", "--model", MODEL, "--results",
                                      str(store.root), "--out", str(out)])
    assert result.exit_code == 0, result.output
    md = (tmp_path / "plots" / "pareto.md").read_text()
    assert "## Verdict" in md and "`santa-prop:S=128` 1.50x" in md
    assert "santa-bench kernel" in md  # the missing configuration's command
    csv = (tmp_path / "plots" / "pareto.csv").read_text().splitlines()
    assert csv[0].startswith("config,retention") and len(csv) == 1 + 4
    assert (tmp_path / "plots" / "pareto.png").stat().st_size > 10_000


@pytest.mark.parametrize(("args", "message"), [
    (["--model", "nobody"], "no RULER accuracy rows of nobody"),
    (["--model", MODEL, "--shape", "14x2"], "--shape: expected"),
    (["--model", MODEL, "--batch", "0"], "positive"),
])
def test_cli_bad_input_is_one_line(store, args, message):
    result = CliRunner().invoke(app, ["pareto", "--results", str(store.root), *args])
    assert result.exit_code != 0
    assert message in result.output and "Traceback" not in result.output


def test_a_matched_configuration_slower_than_dense_leaves_dense_the_verdict(tmp_path):
    results = ResultStore(tmp_path / "results")
    acc = results.start_run({**ENV, "command": "santa-bench accuracy ruler"}, "acc")
    rates = {"niah_single_1": 0.95, "niah_multikey_1": 0.8, "vt": 0.6, "qa_1": 0.5}
    _accuracy(acc, "dense", {}, rates, seed=1)
    _accuracy(acc, "santa-prop", {"S": 128}, rates, seed=1)  # the same scores
    kern = results.start_run({**ENV, "command": "santa-bench kernel"}, "kern")
    for batch in (1, 8):
        _kernel(kern, "santa-prop", {"S": 128}, batch, 33.0, 0.9)
    store = StoreSet(tmp_path / "results")
    result = pareto.verdict(store.load(), store.runs(), MODEL)
    assert result.fastest("all", 1).config == "santa-prop:S=128"
    verdict_rows = verdict_output.markdown(result).split("## Every configuration")[0]
    assert "dense (the fastest matched, `santa-prop:S=128` 0.90x" in verdict_rows


def test_labels_of_near_points_do_not_overlap():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    points = [(0.5, 0.50), (0.51, 0.505), (0.49, 0.495), (0.1, 0.1)]
    labels = [ax.annotate(f"config {i}", xy, xytext=(3, 3), textcoords="offset points",
                          fontsize=6) for i, xy in enumerate(points)]
    renderer = fig.canvas.get_renderer()

    def overlaps() -> int:
        boxes = [t.get_window_extent(renderer) for t in labels]
        return sum(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:])

    assert overlaps() > 0
    verdict_output.spread_labels(ax, labels)
    assert overlaps() == 0
    assert labels[3].get_position() == (3, 3)  # a label alone stays where it was
    plt.close(fig)
