"""The result store: schema, atomic parts, resume by config hash + environment fingerprint."""

from __future__ import annotations

import json
import math

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from santa_bench.environment import collect_environment, environment_fingerprint
from santa_bench.results import (
    FIXED_COLUMNS,
    ResultStore,
    config_hash,
    should_skip,
    validate_row,
)
from santa_bench.stores import StoreSet

CASE = {"method": "santa", "backend": "triton", "ctx": 4096, "S": 64, "dtype": "bf16", "seed": 0}
ENV = {
    "device": "cpu",
    "gpu_name": None,
    "torch": "2.13.0",
    "triton": "3.6.0",
    "flashinfer": None,
    "hostname": "box",
    "command": "santa-bench kernel --method santa",
    "date": "2025-01-01T00:00:00+00:00",
}


ENV_FIELDS = """device gpu_name sm_count l2_bytes gpu_memory_bytes cuda driver hostname
platform python torch triton flashinfer transformers flash_attn git_sha command date
copy_bandwidth_gbps"""


def rows(latency: float = 1.5) -> list[dict]:
    return [
        {"metric": "latency_ms", "value": latency, "unit": "ms"},
        {"metric": "rel_l2", "value": 0.01, "unit": ""},
    ]


def test_round_trip(tmp_path):
    store = ResultStore(tmp_path)
    run = store.start_run(ENV, run_id="r1")
    assert run.path == tmp_path / "r1" and run.run_id == "r1"
    run.write_case(CASE, rows())
    run.write_case({**CASE, "S": 128}, [{"metric": "latency_ms", "value": 2.0, "unit": "ms"}])

    data = store.load()
    assert len(data) == 3
    assert list(data.columns) == [*CASE, *FIXED_COLUMNS]
    first = data[(data.S == 64) & (data.metric == "latency_ms")].iloc[0]
    assert first.value == 1.5 and first.unit == "ms" and first.status == "ok"
    assert first.reason == "" and first.run_id == "r1" and first.method == "santa"
    assert first.case_hash == config_hash(CASE)
    assert first.env_fingerprint == environment_fingerprint(ENV)
    assert first.command == ENV["command"]
    assert set(store.load(runs=["r1"]).case_hash) == set(data.case_hash)


def test_a_renamed_run_keeps_its_rows_under_its_folder_name(tmp_path):
    """The run id is the folder's name: a run moved to another folder loads, is listed and
    is selected under the new name, every row and case hash kept."""
    store = ResultStore(tmp_path / "h200")
    store.start_run(ENV, run_id="kernels-s7b").write_case(CASE, rows())
    before = store.load()
    (tmp_path / "h200" / "kernels-s7b").rename(tmp_path / "h200" / "2025-01-01-h200-kernels")
    moved = StoreSet(tmp_path)
    after = moved.load(["2025-01-01-h200-kernels"])
    assert set(after.run_id) == {"2025-01-01-h200-kernels"}
    assert [r["run_id"] for r in moved.runs()] == ["2025-01-01-h200-kernels"]
    assert after.drop(columns="run_id").equals(before.drop(columns="run_id"))
    assert list(after.case_hash) == [config_hash(CASE)] * 2
    assert len(moved.newest_per_case(after)) == 2


def test_schema_has_fixed_columns_with_types(tmp_path):
    run = ResultStore(tmp_path).start_run(ENV)
    path = run.write_case(CASE, rows())
    schema = pq.read_schema(path)
    assert schema.names[-len(FIXED_COLUMNS) :] == list(FIXED_COLUMNS)
    assert schema.field("value").type == pa.float64()
    for column in set(FIXED_COLUMNS) - {"value"}:
        assert schema.field(column).type == pa.string(), column
    assert schema.field("ctx").type == pa.int64()

    data = ResultStore(tmp_path).load()
    assert data["value"].dtype == "float64"
    assert all(data[c].map(type).eq(str).all() for c in set(FIXED_COLUMNS) - {"value"})


def test_atomic_write_leaves_no_temp_files(tmp_path):
    run = ResultStore(tmp_path).start_run(ENV, run_id="r1")
    run.write_case(CASE, rows())
    run.write_case(CASE, rows(latency=2.0))  # a rerun replaces the part
    names = sorted(p.name for p in (tmp_path / "r1").iterdir())
    assert names == [f"part-{config_hash(CASE)}.parquet", "run.json"]
    assert ResultStore(tmp_path).load().query("metric == 'latency_ms'").value.tolist() == [2.0]


def test_failed_write_leaves_no_temp_files(tmp_path):
    run = ResultStore(tmp_path).start_run(ENV, run_id="r1")
    with pytest.raises(ValueError, match="flat scalar"):
        run.write_case(CASE, [{"metric": "m", "value": 1.0, "extra": [1, 2]}])
    assert sorted(p.name for p in (tmp_path / "r1").iterdir()) == ["run.json"]


def test_resume_detects_completed_cases(tmp_path):
    store = ResultStore(tmp_path)
    fingerprint = environment_fingerprint(ENV)
    store.start_run(ENV, run_id="r1").write_case(CASE, rows())

    # A later run (new date, command, host) under the same fingerprint skips it.
    later = {**ENV, "date": "2025-02-02T00:00:00+00:00", "command": "other", "hostname": "b"}
    assert environment_fingerprint(later) == fingerprint
    store.start_run(later, run_id="r2")
    assert store.completed(fingerprint) == {config_hash(CASE)}
    reordered = dict(reversed(list(CASE.items())))
    assert should_skip(store, reordered, fingerprint, force=False)
    assert not should_skip(store, reordered, fingerprint, force=True)
    assert not should_skip(store, {**CASE, "S": 128}, fingerprint, force=False)


def test_other_fingerprint_is_not_completed(tmp_path):
    store = ResultStore(tmp_path)
    store.start_run(ENV, run_id="r1").write_case(CASE, rows())
    gpu = {**ENV, "device": "cuda", "gpu_name": "NVIDIA H200"}
    assert environment_fingerprint(gpu) != environment_fingerprint(ENV)
    assert store.completed(environment_fingerprint(gpu)) == set()
    assert not should_skip(store, CASE, environment_fingerprint(gpu), force=False)


def test_config_hash_is_canonical():
    h = config_hash(CASE)
    assert len(h) == 16 and int(h, 16) >= 0
    assert config_hash(dict(sorted(CASE.items()))) == h
    assert config_hash({**CASE, "ctx": 4096.0}) == h
    assert config_hash({**CASE, "_note": "ignored", "_tensor": object()}) == h
    assert config_hash({**CASE, "S": 65}) != h
    assert config_hash({**CASE, "ctx": 4096.5}) != h
    assert config_hash({**CASE, "seed": True}) != config_hash({**CASE, "seed": 1})


def test_run_json_holds_environment(tmp_path):
    store = ResultStore(tmp_path)
    run = store.start_run(ENV)
    record = json.loads((tmp_path / run.run_id / "run.json").read_text())
    first = {key: ENV.get(key) for key in ("date", "command", "git_sha")}
    assert record == {**ENV, "run_id": run.run_id, "env_fingerprint": run.env_fingerprint,
                      "invocations": [first]}
    assert store.runs() == [record]
    with pytest.raises(ValueError, match="fingerprint"):
        store.start_run({**ENV, "device": "cuda"}, run_id=run.run_id)


def test_a_reopened_run_keeps_every_invocation(tmp_path):
    """Two commands writing one run id: run.json's top-level command is the last one's,
    and ``invocations`` lists both (a run.json written before the list counts as one)."""
    store = ResultStore(tmp_path)
    store.start_run({**ENV, "command": "santa-bench a", "date": "d1"}, run_id="r")
    store.start_run({**ENV, "command": "santa-bench b", "date": "d2"}, run_id="r")
    record = json.loads((tmp_path / "r" / "run.json").read_text())
    assert record["command"] == "santa-bench b"
    assert [i["command"] for i in record["invocations"]] == ["santa-bench a", "santa-bench b"]
    assert [i["date"] for i in record["invocations"]] == ["d1", "d2"]
    old = {key: value for key, value in record.items() if key != "invocations"}
    (tmp_path / "r" / "run.json").write_text(json.dumps(old))  # as written before the list
    store.start_run({**ENV, "command": "santa-bench c"}, run_id="r")
    again = json.loads((tmp_path / "r" / "run.json").read_text())
    assert [i["command"] for i in again["invocations"]] == ["santa-bench b", "santa-bench c"]


def test_skipped_and_failed_rows(tmp_path):
    run = ResultStore(tmp_path).start_run(ENV)
    run.write_case(
        CASE,
        [
            {
                "metric": "latency_ms",
                "value": None,
                "unit": "ms",
                "status": "skipped",
                "reason": "no CUDA device",
            },
            {"metric": "rel_l2", "value": math.nan, "status": "failed", "reason": "OOM"},
        ],
    )
    data = ResultStore(tmp_path).load()
    assert data.status.tolist() == ["skipped", "failed"]
    assert data.value.isna().all() and data.reason.tolist() == ["no CUDA device", "OOM"]


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"metric": "m", "value": 1.0, "status": "done"}, "status"),
        ({"value": 1.0}, "metric"),
        ({"metric": "m", "value": "fast"}, "real number"),
        ({"metric": "m", "value": None}, "real number"),
        ({"metric": "m", "value": True}, "real number"),
        ({"metric": "m", "value": math.nan, "status": "failed"}, "reason"),
    ],
)
def test_validate_row_rejects_bad_rows(row, message):
    with pytest.raises(ValueError, match=message):
        validate_row(row)


def test_write_case_rejects_bad_cases(tmp_path):
    run = ResultStore(tmp_path).start_run(ENV)
    with pytest.raises(ValueError, match="no rows"):
        run.write_case(CASE, [])
    with pytest.raises(ValueError, match="fixed column"):
        run.write_case({**CASE, "metric": "x"}, rows())
    with pytest.raises(ValueError, match="fills them"):
        run.write_case(CASE, [{"metric": "m", "value": 1.0, "run_id": "x"}])


def test_corrupt_part_is_reported_once_with_its_path_and_remedy(tmp_path):
    import warnings

    store = ResultStore(tmp_path)
    store.start_run(ENV, run_id="r1").write_case(CASE, rows())
    bad = tmp_path / "r1" / "part-deadbeefdeadbeef.parquet"
    bad.write_bytes(b"PAR1 truncated")
    (tmp_path / "r1" / ".part-0123.parquet.abc.tmp").write_bytes(b"half")  # leftover temp

    with pytest.warns(RuntimeWarning) as caught:
        assert store.completed(environment_fingerprint(ENV)) == {config_hash(CASE)}
    (warning,) = caught
    text = str(warning.message)
    assert str(bad) in text and f"rm '{bad}'" in text and "run again into run 'r1'" in text
    assert "deadbeefdeadbeef" in text
    # the warning names the part, not a line of the store's code ("frames = [")
    assert warning.filename == str(bad)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # reported once: later loads are silent
        assert len(store.load()) == 2
        assert len(ResultStore(tmp_path).load()) == 2  # and so is another store
    bad.write_bytes(b"PAR1 still truncated")  # a new version of the file is news
    with pytest.warns(RuntimeWarning, match="deadbeef"):
        store.load()


def test_load_mixes_parts_of_different_columns_and_types(tmp_path):
    store = ResultStore(tmp_path)
    run = store.start_run(ENV, run_id="r1")
    run.write_case({"method": "a", "tile": 64}, [{"metric": "m", "value": 1.0}])
    run.write_case({"method": "b", "tile": 32.5}, [{"metric": "m", "value": 2.0}])
    run.write_case({"method": "c", "tile": None, "note": "x"}, [{"metric": "m", "value": 3.0}])
    run.write_case({"method": "d", "tile": "auto"}, [{"metric": "m", "value": 4.0}])
    other = store.start_run(ENV, run_id="r2")
    other.write_case({"method": "e", "flag": True}, [{"metric": "m", "value": 5.0}])
    data = store.load()
    assert sorted(data["method"]) == ["a", "b", "c", "d", "e"]
    by_method = data.set_index("method")
    assert by_method.loc["a", "tile"] == 64 and by_method.loc["b", "tile"] == 32.5
    assert by_method.loc["d", "tile"] == "auto" and by_method.loc["d", "value"] == 4.0
    assert by_method["note"].isna().sum() == 4 and by_method.loc["c", "note"] == "x"
    assert by_method.loc["e", "flag"] and by_method["flag"].isna().sum() == 4
    assert list(data.columns[-len(FIXED_COLUMNS):]) == list(FIXED_COLUMNS)
    # numeric parts alone unify to one numeric column
    numeric = store.load(["r1"])
    assert numeric.loc[numeric.method.isin(["a", "b"]), "tile"].tolist() == [64, 32.5]


def test_completed_reads_each_part_once(tmp_path, monkeypatch):
    from santa_bench import results

    store = ResultStore(tmp_path)
    run = store.start_run(ENV, run_id="r1")
    run.write_case(CASE, rows())
    reads = []
    real = results._read_part
    monkeypatch.setattr(results, "_read_part", lambda *a: reads.append(a[0]) or real(*a))
    fingerprint = environment_fingerprint(ENV)
    for _ in range(3):
        assert store.completed(fingerprint) == {config_hash(CASE)}
    store.load()
    assert len(reads) == 1
    other = {**CASE, "S": 128}
    run.write_case(other, rows())  # a new part is read; the old one is not read again
    assert store.completed(fingerprint) == {config_hash(CASE), config_hash(other)}
    assert len(reads) == 2


def test_load_unions_columns(tmp_path):
    run = ResultStore(tmp_path).start_run(ENV)
    run.write_case(CASE, rows())
    run.write_case({"method": "dense", "task": "niah"}, [{"metric": "accuracy", "value": 1}])
    data = ResultStore(tmp_path).load()
    assert len(data) == 3
    assert data.loc[data.method == "dense", "ctx"].isna().all()
    assert data.loc[data.method == "santa", "task"].isna().all()
    assert ResultStore(tmp_path / "empty").load().columns.tolist() == list(FIXED_COLUMNS)


def test_environment_without_gpu():
    env = collect_environment(["santa-bench", "kernel", "--ctx", "4096"])
    for field in ENV_FIELDS.split():
        assert field in env, field
    assert env["command"] == "santa-bench kernel --ctx 4096"
    assert env["torch"] and env["copy_bandwidth_gbps"] is None
    assert json.loads(json.dumps(env)) == env
    if env["device"] == "cpu":
        assert env["gpu_name"] is None and env["sm_count"] is None
    assert collect_environment()["command"]  # defaults to this process's argv

    moved = {
        **env,
        "date": "1999-01-01T00:00:00+00:00",
        "command": "x",
        "hostname": "y",
        "git_sha": "abc-dirty",
    }
    assert environment_fingerprint(moved) == environment_fingerprint(env)
    assert environment_fingerprint({**env, "torch": "0.0"}) != environment_fingerprint(env)


def test_failed_cases_are_retried_and_forget_failed_removes_their_parts(tmp_path) -> None:
    store = ResultStore(tmp_path)
    run = store.start_run(collect_environment("santa-bench kernel"), run_id="r1")
    fingerprint = run.env_fingerprint
    run.write_case(CASE, [{"metric": "latency", "value": None, "unit": "us",
                           "status": "failed", "reason": "CUDA out of memory"}])
    assert config_hash(CASE) not in store.completed(fingerprint)
    assert store.forget_failed(config_hash(CASE)) == 1
    run.write_case(CASE, [{"metric": "latency", "value": 1.0, "unit": "us"}])
    assert config_hash(CASE) in store.completed(fingerprint)
    assert store.forget_failed(config_hash(CASE)) == 0  # a finished part stays
    assert len(store.load()) == 1


def test_a_forced_rerun_into_another_run_keeps_the_first_measurement(tmp_path,
                                                                     monkeypatch) -> None:
    """Repeated measurements of one case (an A/B on one machine, a rerun on another) each keep
    their rows; a failed part elsewhere does not make the case unfinished."""
    from santa_bench import execute
    from santa_bench.execute import write_case

    monkeypatch.setattr(execute, "case_command", lambda case: "santa-bench kernel ...")

    store = ResultStore(tmp_path)
    env = collect_environment("santa-bench kernel")
    first, second, third = (store.start_run(env, run_id=r) for r in ("r1", "r2", "r3"))
    write_case(store, first, CASE, [{"metric": "latency", "value": 1.0, "unit": "us"}])
    write_case(store, second, CASE, [{"metric": "latency", "value": 2.0, "unit": "us"}])
    assert sorted(store.load()["value"]) == [1.0, 2.0]
    third.write_case(CASE, [{"metric": "latency", "value": None, "unit": "us",
                             "status": "failed", "reason": "x"}])
    assert config_hash(CASE) in store.completed(first.env_fingerprint)
    write_case(store, third, CASE, [{"metric": "latency", "value": 3.0, "unit": "us"}])
    assert sorted(store.load()["value"]) == [1.0, 2.0, 3.0]  # the failed part replaced


def test_git_sha_falls_back_to_the_environment_outside_a_checkout(tmp_path, monkeypatch):
    from santa_bench import environment

    monkeypatch.setattr(environment, "_run", lambda args: None)  # no git here
    monkeypatch.setenv("SANTA_BENCH_GIT_SHA", "abc123")
    assert environment._git_sha() == "abc123"
    monkeypatch.delenv("SANTA_BENCH_GIT_SHA")
    assert environment._git_sha() is None


def test_git_sha_pinned_by_the_environment_beats_a_stale_checkout(monkeypatch):
    from santa_bench import environment

    monkeypatch.setattr(environment, "_run", lambda args: "0ld")  # a stale .git answers
    monkeypatch.setenv("SANTA_BENCH_GIT_SHA", "abc123")
    assert environment._git_sha() == "abc123"
    monkeypatch.delenv("SANTA_BENCH_GIT_SHA")
    assert environment._git_sha() == "0ld-dirty"  # _run answers the status query too


def test_kernel_table_with_one_case_in_two_runs():
    """The same case stored by two runs (a re-timing) gives one line per run, not a crash."""
    import pandas as pd

    from santa_bench.report import kernel_table

    rows = []
    for run, latency in (("old", 40.0), ("new", 30.0)):
        base = {"kind": "kernel", "method": "santa-prop", "S": 128, "ctx": 32768, "batch": 1,
                "timing": "graph", "l2": "cold", "status": "ok", "reason": None,
                "case_hash": "abc", "run_id": run, "q1_us": latency - 1, "q3_us": latency + 1,
                "ci_low": 1.0, "ci_high": 1.1, "best_dense": "sdpa-cudnn"}
        rows.append({**base, "metric": "latency", "value": latency})
        rows.append({**base, "metric": "speedup_vs_best_dense", "value": 38.0 / latency})
    table = kernel_table(pd.DataFrame(rows))
    lines = [line for line in table.splitlines() if line.startswith("| 32k")]
    assert lines[0].startswith("| 32k | 1 | santa-prop S=128 | 30.0 [29.0-31.0] | 1.27x")
    assert lines[0].endswith("| new |") and lines[1].endswith("| old |")
    assert lines[1].startswith("| 32k | 1 | santa-prop S=128 | 40.0 [39.0-41.0] | 0.95x")


def test_kernel_table_gives_each_attention_shape_its_own_table():
    import pandas as pd

    from santa_bench.report import kernel_table

    def rows(heads: int, kv_heads: int, d: int, latency: float) -> list[dict]:
        base = {"kind": "kernel", "method": "sdpa-cudnn", "ctx": 32768, "batch": 1,
                "heads": heads, "kv_heads": kv_heads, "head_dim": d, "timing": "graph",
                "l2": "cold", "status": "ok", "reason": None, "case_hash": f"h{heads}",
                "run_id": "r", "q1_us": latency, "q3_us": latency}
        return [{**base, "metric": "latency", "value": latency}]

    table = kernel_table(pd.DataFrame(rows(14, 2, 64, 13.0) + rows(32, 8, 128, 50.0)))
    titles = [line for line in table.splitlines() if line.startswith("**")]
    assert titles == ["**timing: graph, L2: cold, heads/KV heads/d: 14/2/64**",
                      "**timing: graph, L2: cold, heads/KV heads/d: 32/8/128**"]
    one = kernel_table(pd.DataFrame(rows(32, 8, 128, 50.0)))
    assert [line for line in one.splitlines() if line.startswith("**")] == [
        "**timing: graph, L2: cold**"]  # one shape: the title as before


def test_report_label_names_two_pass_flash_only():
    import pandas as pd

    from santa_bench.report import _label

    row = pd.Series({"method": "santa-flash", "S": 2048.0, "passes": 2.0})
    assert _label(row) == "santa-flash S=2048 passes=2"
    # the default (passes=1) is left out of cases, so of rows: NaN in a mixed frame
    fused = pd.Series({"method": "santa-flash", "S": 2048.0, "passes": float("nan")})
    assert _label(fused) == "santa-flash S=2048"
    assert _label(pd.Series({"method": "santa-flash", "S": 128.0})) == "santa-flash S=128"
    assert _label(pd.Series({**row, "gather": "inline"})) == (
        "santa-flash S=2048 passes=2 gather=inline")


def test_report_label_names_santapp_variants():
    import pandas as pd

    from santa_bench.report import _label

    row = {"method": "santapp", "M": 32.0, "team_size": 16.0, "draw": "pooled"}
    assert _label(pd.Series(row)) == "santapp M=32 P=16"
    assert _label(pd.Series({**row, "draw": "head"})) == "santapp M=32 P=16 draw=head"
    assert _label(pd.Series({**row, "reps": float("nan"), "merge": "kernel"})) == (
        "santapp M=32 P=16 merge=kernel")
    assert _label(pd.Series({**row, "reps": "int8", "merge": "atomic"})) == (
        "santapp M=32 P=16 reps=int8 merge=atomic")
    # the team policy, representative and exact set, away from their defaults: two
    # configurations never share a label
    assert _label(pd.Series({**row, "policy": "kmeans", "representative": "leader",
                             "sink": 4.0, "window": 64.0})) == (
        "santapp M=32 P=16 policy=kmeans representative=leader")
    assert _label(pd.Series({**row, "policy": "contiguous", "sink": 0.0, "window": 0.0})) == (
        "santapp M=32 P=16 sink=0 window=0")
    assert _label(pd.Series({"method": "quest", "pages": 64.0})) == "quest pages=64"
    prop = {"method": "santa-prop", "S": 128.0}
    assert _label(pd.Series({**prop, "tile": 64.0})) == "santa-prop S=128"
    assert _label(pd.Series({**prop, "tile": 128.0})) == "santa-prop S=128 tile=128"


def test_recall_order_puts_the_current_run_and_newer_runs_last(tmp_path) -> None:
    """Two runs of one case: the rows the recall helpers see last (and keep) are the
    current run's, else the newest run's by its run.json date."""
    store = ResultStore(tmp_path)
    env = collect_environment("santa-bench kernel")
    for run_id, date, value in (("b-old", "2026-01-01", 1.0), ("a-new", "2026-02-01", 2.0)):
        run = store.start_run({**env, "date": date}, run_id=run_id)
        run.write_case(CASE, [{"metric": "latency", "value": value, "unit": "us"}])
    assert list(store.load()["value"]) == [2.0, 1.0]  # by folder name
    assert list(store.load_latest_last("other")["value"]) == [1.0, 2.0]  # newest last
    assert list(store.load_latest_last("b-old")["value"]) == [2.0, 1.0]  # this run last


def test_speedup_matrix_puts_each_budget_in_its_column():
    """A line per (ctx, batch, method variant), a column per S; the best dense baseline
    named with its latency; a failed case shows its status, a missing one stays empty."""
    import pandas as pd

    from santa_bench.report import speedup_matrix

    base = {"kind": "kernel", "ctx": 32768, "batch": 8, "timing": "graph", "l2": "cold",
            "status": "ok", "reason": None, "run_id": "r", "ci_low": 1.0, "ci_high": 1.1,
            "best_dense": "sdpa-cudnn", "passes": float("nan"), "gather": None}
    rows = [{**base, "method": "sdpa-cudnn", "S": float("nan"), "case_hash": "d",
             "metric": "latency", "value": 240.0}]
    cases = (("santa-prop", 128, 150.0, None), ("santa-prop", 2048, 210.0, None),
             ("santa-flash", 2048, 230.0, "compact"), ("santa-flash", 128, 0.0, "oom"))
    for method, budget, latency, extra in cases:
        case = {**base, "method": method, "S": float(budget), "case_hash": f"{method}{budget}"}
        if method == "santa-flash":
            case.update(passes=2.0, gather="compact")
        if extra == "oom":
            case.update(status="failed", reason="out of memory")
        rows.append({**case, "metric": "latency", "value": latency})
        if case["status"] == "ok":
            rows.append({**case, "metric": "speedup_vs_best_dense", "value": 240.0 / latency})
    table = speedup_matrix(pd.DataFrame(rows))
    assert "| ctx | B | method | best dense | S=128 | S=2048 |" in table
    lines = {line.split(" | ")[2]: line for line in table.splitlines() if line.startswith("| 32k")}
    assert set(lines) == {"santa-prop", "santa-flash passes=2 gather=compact"}
    assert lines["santa-prop"] == (
        "| 32k | 8 | santa-prop | sdpa-cudnn 240.0 us | 150.0 us, 1.60x | 210.0 us, 1.14x |")
    assert lines["santa-flash passes=2 gather=compact"].endswith(
        "| sdpa-cudnn 240.0 us | failed | 230.0 us, 1.04x |")
    del rows[0]  # no baseline row: the column says so rather than guessing
    assert "| 32k | 8 | santa-prop | - | 150.0 us" in speedup_matrix(pd.DataFrame(rows))


def test_a_run_takes_speed_baselines_from_its_own_rows_only(tmp_path):
    """A faster cuDNN timing in another run of the same environment must not become a new
    run's best dense: speed is compared within one run."""
    from santa_bench.execute import CaseWorker, RunOptions
    from santa_bench.kernel_keys import GROUP_KEYS

    store = ResultStore(tmp_path)
    env = {"device": "cuda", "gpu_name": "NVIDIA H100 80GB HBM3", "torch": "2.11.0"}
    case = {"kind": "kernel", "method": "sdpa-cudnn", "family": "baseline", "ctx": 4096,
            "batch": 1, "heads": 8, "kv_heads": 2, "head_dim": 64, "dtype": "bf16",
            "layout": "contiguous", "page_size": 16, "device": "cuda", "timing": "graph",
            "l2": "cold", "seed": 0}
    assert set(GROUP_KEYS) <= set(case)
    store.start_run(env, "old").write_case(case, [
        {"metric": "latency", "value": 5.0, "unit": "us", "samples_us": "[5.0, 5.0]"}])
    for run_id, found in (("new", {}), ("old", {"sdpa-cudnn"})):
        worker = CaseWorker(store.start_run(env, run_id), str(tmp_path), RunOptions(), "")
        best = worker.runner("kernel").best_dense
        assert {name for name, _ in best.values()} == set(found), run_id
