"""The anchor numbers: one data file, loaded and checked, and the tables print what it holds."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest
import yaml

import santa_bench
from santa_bench.anchors import ANCHORS_FILE, AnchorError, load_anchors, packaged_anchors
from santa_bench.plots import render_tables, tables

TABLES = ("dense", "kernels", "ruler", "gsm8k", "page_subset", "claims")


def _data() -> dict:
    return yaml.safe_load(ANCHORS_FILE.read_text(encoding="utf-8"))


def _write(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "anchors.yaml"
    path.write_text(yaml.safe_dump(data, allow_unicode=True, sort_keys=False), encoding="utf-8")
    return path


def _kernel_frame() -> pd.DataFrame:
    """One measured kernel row (our cuDNN SDPA at 32k, B=1, events), so the tables render."""
    return pd.DataFrame([{
        "metric": "latency", "value": 40.0, "status": "ok", "unit": "us", "kind": "kernel",
        "method": "sdpa-cudnn", "family": "baseline", "ctx": 32768, "batch": 1,
        "timing": "events", "heads": 32, "kv_heads": 8, "head_dim": 128, "dtype": "bf16",
    }])


def _row(frame: pd.DataFrame, **where) -> pd.Series:
    mask = pd.Series(True, index=frame.index)
    for key, value in where.items():
        mask &= frame[key] == value
    assert mask.sum() == 1, where
    return frame[mask].iloc[0]


def test_packaged_file_has_every_table_with_its_source():
    anchors = packaged_anchors()
    assert anchors.document == "docs/anchors.md"
    assert set(anchors.tables) == set(TABLES)
    for name in TABLES:
        assert anchors[name].section and anchors[name].setup and anchors[name].rows
    dense = anchors["dense"].rows
    assert len(dense) == 20 and {r["method"] for r in dense} == {
        "sdpa-cudnn", "sdpa-flash", "flashinfer-tc", "flashinfer-cuda"}
    cudnn = next(r for r in dense if (r["ctx"], r["batch"], r["method"]) ==
                 (32768, 1, "sdpa-cudnn"))
    assert cudnn["events"] == [49.6, 50.3] and cudnn["graph"] == 37.1
    assert [r["kernel"] for r in anchors["ruler"].rows] == ["SDPA", "prop", "prop", "flash",
                                                            "flash"]
    assert list(anchors["ruler"].rows[0]["scores"]) == ["FWE", "NIAH", "QA1", "QA2"]
    assert anchors["gsm8k"]["dense"] == 78.06
    assert [r["S"] for r in anchors["gsm8k"].rows] == [16, 32, 64, 128, 256]
    assert anchors["kernels"].rows[4]["santa-prop"] is None  # the released prop has no batch


def test_the_file_ships_inside_the_package():
    package = Path(santa_bench.__file__).parent
    assert Path(str(ANCHORS_FILE)) == package / "data" / "anchors.yaml"
    pyproject = (package.parent / "pyproject.toml").read_text()
    assert '"santa_bench.data" = ["*.yaml", "tasks/*/*"]' in pyproject


def test_the_task_data_ships_inside_the_package():
    from santa_bench.accuracy.datasets import PACKAGED_DATA

    package = Path(santa_bench.__file__).parent
    assert package / "data" / "tasks" == PACKAGED_DATA
    for name in ("gsm8k/test.jsonl", "gsm8k/LICENSE", "mmlu-redux/LICENSE"):
        assert (PACKAGED_DATA / name).is_file(), name


def test_no_anchor_number_is_a_python_literal():
    """Every anchor with decimals (22.3, 78.06, ...) lives in the data file alone."""
    numbers: set[float] = set()

    def collect(value) -> None:
        if isinstance(value, float) and value > 2 and not value.is_integer():
            numbers.add(value)
        elif isinstance(value, dict):
            for item in value.values():
                collect(item)
        elif isinstance(value, list):
            for item in value:
                collect(item)

    collect(_data())
    assert {22.3, 78.06, 95.6, 400.2} <= numbers
    sources = [*Path(santa_bench.__file__).parent.joinpath("plots").glob("*.py"),
               Path(santa_bench.__file__).parent / "anchors.py"]
    for path in sources:
        text = path.read_text()
        for number in numbers:
            pattern = rf"(?<![\d.]){re.escape(f'{number:g}')}0*(?![\d])"
            assert not re.search(pattern, text), (path.name, number)


def test_rendered_tables_print_the_files_numbers(tmp_path):
    data = _data()
    dense = next(r for r in data["dense"]["rows"]
                 if (r["ctx"], r["batch"], r["method"]) == (32768, 1, "sdpa-cudnn"))
    dense["events"], dense["graph"] = [11.1, 12.2], 13.3
    kernel = next(r for r in data["kernels"]["rows"] if (r["ctx"], r["batch"], r["S"]) ==
                  (32768, 1, 128))
    kernel["santa-prop"] = {"us": 123.4, "speedup": 0.12}
    data["ruler"]["rows"][0]["scores"]["FWE"] = 12.34
    data["gsm8k"]["dense"] = 11.11
    data["gsm8k"]["rows"][0]["santa-iid"] = 1.23
    changed = load_anchors(_write(tmp_path, data))

    frame = _kernel_frame()
    before, after = render_tables(frame), render_tables(frame, changed)
    assert "| 32k | 1 | sdpa-cudnn | 49.6–50.3 | 40.0 | 37.1 | – |" in before.markdown
    assert "| 32k | 1 | sdpa-cudnn | 11.1–12.2 | 40.0 | 13.3 | – |" in after.markdown
    prop = _row(after.frames["kernels"], ctx="32k", B=1, S=128, kernel="S²ANTA-prop")
    assert (prop["anchor (µs)"], prop["anchor speedup"]) == ("123.4", "0.12×")
    assert _row(after.frames["ruler"], kernel="SDPA")["FWE anchor"] == "12.34"
    gsm8k = after.frames["gsm8k"]
    assert gsm8k.loc[0, "santa-sys anchor"] == "11.11"
    assert gsm8k.loc[1, "santa-iid anchor"] == "1.23"
    assert "SDPA 11.11 in the first row" in after.markdown
    assert "SDPA 78.06 in the first row" in before.markdown


def test_the_cli_tables_read_the_loader(monkeypatch, tmp_path):
    """`render_tables` with no anchors given takes the loader's (the packaged file)."""
    data = _data()
    data["gsm8k"]["model"] = "Some Model"
    data["ruler"]["ctx"] = 8192
    monkeypatch.setattr(tables, "packaged_anchors", lambda: load_anchors(_write(tmp_path, data)))
    markdown = render_tables(_kernel_frame()).markdown
    assert "### GSM8K (Some Model), accuracy (%)" in markdown
    assert "### RULER 8k (Llama-3.1-8B-Instruct), score (%)" in markdown


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d.pop("ruler"), "table 'ruler' is missing"),
        (lambda d: d["dense"].pop("setup"), "table 'dense' lacks 'setup'"),
        (lambda d: d["kernels"]["rows"][2].pop("best_dense_us"), "row 2 lacks 'best_dense_us'"),
        (lambda d: d["ruler"]["rows"][1]["scores"].pop("QA2"), "table 'ruler': row 1 scores"),
        (lambda d: d["kernels"]["rows"][0].pop("santa-flash"), "'santa-flash' needs us and"),
    ],
)
def test_a_malformed_file_names_its_fault(tmp_path, edit, message):
    data = _data()
    edit(data)
    with pytest.raises(AnchorError, match=re.escape(message)):
        load_anchors(_write(tmp_path, data))


def test_tables_compare_ours_at_the_anchors_shape():
    """A row of another attention shape (a smaller model's) never fills an anchor's cell."""
    small = {"heads": 14, "kv_heads": 2, "head_dim": 64, "value": 12.0}
    frame = pd.concat([_kernel_frame().assign(**small), _kernel_frame()], ignore_index=True)
    dense = render_tables(frame).frames["dense"]
    row = _row(dense, ctx="32k", B=1, baseline="sdpa-cudnn")
    assert row["ours events (µs)"] == "40.0"
    only_small = render_tables(
        pd.concat([_kernel_frame().assign(**small), _kernel_frame().assign(method="sdpa-flash")],
                  ignore_index=True)).frames["dense"]
    assert _row(only_small, ctx="32k", B=1, baseline="sdpa-cudnn")["ours events (µs)"] == "–"
