"""One module names configurations: the tables, the e2e report, the kernel summary and the
accuracy table all label a row through santa_bench.labels."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pandas as pd

from santa_bench import labels
from santa_bench.cli import _team_label
from santa_bench.e2e.report import _label as e2e_label
from santa_bench.report import _label as table_label

ROOT = Path(__file__).resolve().parents[1]
SANTAPP = {"method": "santapp", "M": 32.0, "team_size": 64.0, "policy": "kmeans",
           "reps": "int8", "sink": 4, "window": 64, "draw": "pooled"}


def test_the_labels_of_one_row():
    row = pd.Series(SANTAPP)
    assert labels.config_key(row) == "santapp:M=32,team_size=64,policy=kmeans,reps=int8"
    assert table_label(row) == "santapp M=32 P=64 policy=kmeans reps=int8"
    assert e2e_label(row) == "santapp M=32 policy=kmeans reps=int8"
    assert _team_label(SANTAPP) == "M=32,P=64,policy=kmeans,reps=int8"
    prop = pd.Series({"method": "santa-prop", "S": 128.0, "tile": 32.0})
    assert table_label(prop) == "santa-prop S=128 tile=32"
    assert table_label(pd.Series({**prop, "tile": 64.0})) == "santa-prop S=128"


def test_a_row_stored_before_a_default_changed_names_what_it_measured():
    # SANTA++ rows stored before draw=pooled became the default drew per head: they hold no
    # draw, and must not share a key with today's default rows
    old = pd.Series({k: v for k, v in SANTAPP.items() if k != "draw"})
    assert labels.config_key(old) == "santapp:M=32,team_size=64,policy=kmeans,reps=int8,draw=head"
    assert "draw=head" in table_label(old) and "draw" not in table_label(pd.Series(SANTAPP))
    head = pd.Series({**SANTAPP, "draw": "head"})
    assert labels.config_key(head) == labels.config_key(old) != labels.config_key(
        pd.Series(SANTAPP))


def test_the_accuracy_table_labels_through_the_same_function():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from accuracy_table import config_label
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    row = pd.Series({**SANTAPP, "dense_layers": "0,1"})
    assert config_label(row) == (labels.config_label(row) + " dense_layers=0,1")
    assert config_label(row) == "santapp M=32 team_size=64 policy=kmeans reps=int8 dense_layers=0,1"


def test_labels_is_a_leaf_of_the_registry():
    tree = ast.parse((ROOT / "santa_bench" / "labels.py").read_text())
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert {m for m in imported if m and m.startswith("santa_bench")} == {"santa_bench.methods"}
