"""The seeds' accuracy tables: filled from one model, uninformative tasks marked."""

from __future__ import annotations

import pandas as pd

from santa_bench.plots import score_tables
from santa_bench.plots.rows import accuracy_rows


def _row(task, method, value, *, S=None, model="qwen", device="cuda", n=50, family=None):
    return {"metric": "score", "value": value, "status": "ok", "unit": "ratio", "task": task,
            "method": method, "family": family or ("dense" if method == "dense" else "santa"),
            "S": S, "model": model, "device": device, "ctx": 32768, "n": n}


def _scores(rows):
    return accuracy_rows(pd.DataFrame(rows))


def test_uninformative_tasks_are_left_out_of_the_averages_and_named():
    rows = [
        _row("ruler-niah_single_1", "dense", 1.0),
        _row("ruler-niah_single_1", "santa-prop", 0.9, S=128),
        _row("ruler-niah_multikey_3", "dense", 0.1),
        _row("ruler-niah_multikey_3", "santa-prop", 0.0, S=128),
        _row("ruler-fwe", "dense", 0.05),
        _row("ruler-fwe", "santa-prop", 0.04, S=128),
    ]
    scores = _scores(rows)
    assert score_tables.uninformative_tasks(scores) == ["ruler-fwe", "ruler-niah_multikey_3"]
    table = score_tables.ruler_table(scores).set_index("kernel")
    assert table.loc["SDPA", "NIAH ours"] == "100.00"  # multikey_3 (dense 10%) left out
    prop = table[table.S == 128].iloc[0]
    assert prop["NIAH ours"] == "90.00" and prop["FWE ours"] == "4.00 (uninf.)"
    assert table[table.S == 256].iloc[0]["NIAH ours"] == "–"  # not measured
    note = score_tables.scores_note(scores, "ruler")
    assert "qwen (cuda; n = 50 a task and method)" in note
    assert "left out of the averages and marked (uninf.) where alone: fwe, niah_multikey_3" in note


def test_tables_take_one_model_gpu_runs_first():
    rows = [_row("gsm8k", "dense", 0.5, model="big", device="cuda"),
            _row("gsm8k", "dense", 0.9, model="tiny", device="cpu"),
            _row("gsm8k", "dense", 0.8, model="tiny", device="cpu")]
    scores = _scores(rows)
    assert score_tables.table_model(scores) == "big"
    table = score_tables.gsm8k_table(scores)
    assert table.loc[0, "santa-sys ours"] == "50.00"
