"""The kernel command's summary on a CPU: error and KV reads sorted by reads, a reading
guide, inaccurate rows flagged, identical rows explained, 80 columns, the GPU command."""

from __future__ import annotations

import re

from rich.console import Console
from typer.testing import CliRunner

from santa_bench import cli

# a shape where SANTA++ with M=32 errs far from dense at 1k (as at the README's 4k)
SHAPE = ["--heads", "8", "--kv-heads", "2", "--head-dim", "64", "--cpu-budget", "0.01"]
WIDTH = 80  # what COLUMNS=80 gives the console


def _run(monkeypatch, tmp_path, *args: str) -> str:
    console = Console(width=WIDTH, force_terminal=False, color_system=None)
    monkeypatch.setattr(cli, "console", console)
    monkeypatch.setattr("sys.argv", ["santa-bench", *args])
    result = CliRunner().invoke(cli.app, list(args), env={"COLUMNS": str(WIDTH)},
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def test_cpu_summary_shows_error_and_reads_in_80_columns(monkeypatch, tmp_path):
    args = ["kernel", "--ctx", "1k", "--S", "128", "--methods",
            "dense,santa-iid,santa-sys,santa-prop,santapp:M=32", "--results", str(tmp_path),
            "--device", "cpu", *SHAPE]
    text = _run(monkeypatch, tmp_path, *args)
    lines = text.splitlines()
    command = [line for line in lines if line.strip().startswith("santa-bench kernel")]
    assert len(command) == 1 and "--device" not in command[0]  # the GPU command, last
    assert lines[-1] == command[0]
    assert all(len(line) <= WIDTH for line in lines if line is not command[0])
    assert "…" not in text  # no number or label cut
    rows = {m.group(1): m for m in re.finditer(
        r"^ ?(dense|santa-iid S=128|santa-sys S=128|santa-prop S=128|santapp M=32,P=16)\s+"
        r"1k\s+1\s+(\d\.\d\de[+-]\d\d)\s+(\d\.\d{3})\s+([\d.]+)%[ \t]*(\S*)", text, re.M)}
    assert set(rows) == {"dense", "santa-iid S=128", "santa-sys S=128", "santa-prop S=128",
                         "santapp M=32,P=16"}, text
    reads = [float(m.group(4)) for m in sorted(rows.values(), key=lambda m: m.start())]
    assert reads == sorted(reads)  # sorted by KV read, not by CPU wall time
    assert "CPU wall" not in text and " us " not in text
    # santapp:M=32 errs far from dense here: flagged; the samplers are not
    assert float(rows["santapp M=32,P=16"].group(3)) < cli.COSINE_FLOOR
    assert rows["santapp M=32,P=16"].group(5) == "inaccurate"
    assert rows["santa-sys S=128"].group(5) == "" and rows["dense"].group(5) == ""
    # the identical rows are explained; the guide says how to read them
    assert rows["santa-sys S=128"].group(2, 3, 4) == rows["santa-prop S=128"].group(2, 3, 4)
    flat = " ".join(text.split())
    assert "santa-sys and santa-prop (alloc=systematic) print identical rows" in flat
    assert "global systematic sampling" in flat
    assert "reading: rel L2" in flat and "1/sqrt(S)" in flat and "not kernel speed" in flat


def test_gpu_summary_keeps_the_latency_table(monkeypatch):
    console = Console(width=200, color_system=None)
    monkeypatch.setattr(cli, "console", console)
    case = {"method": "santa-prop", "S": 128, "ctx": 4096, "batch": 1, "device": "cuda",
            "timing": "graph", "l2": "cold"}
    rows = [{"metric": "latency", "value": 25.0, "status": "ok", "l2_state": "cold"},
            {"metric": "rel_l2_vs_dense", "value": 0.2, "status": "ok"}]
    dense = {**case, "method": "dense", "S": None}
    with console.capture() as captured:
        cli._print_summary([(case, rows), (dense, [{**rows[0], "value": 30.0}])])
    text = captured.get()
    assert "sorted by latency" in text and "25.0 us" in text
    assert text.index("santa-prop") < text.index("dense")
