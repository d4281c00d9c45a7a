"""One rule resolves ``--device auto|cpu|cuda`` for every command."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from santa_bench.accuracy.engine import resolve_device as engine_device
from santa_bench.cli import app
from santa_bench.devices import resolve_device
from santa_kernels.validate import InputError

PACKAGE = Path(__file__).resolve().parents[1] / "santa_bench"


def test_auto_is_cuda_when_visible(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == "cpu" and resolve_device(None) == "cpu"
    assert resolve_device("CPU") == "cpu"
    assert resolve_device("cuda", visible=False) == "cuda"
    with pytest.raises(InputError, match=r"--device cuda: no CUDA device is visible"):
        resolve_device("cuda")
    with pytest.raises(InputError, match=r"^device: expected auto, cpu or cuda, got 'tpu'"):
        resolve_device("tpu", option="device")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == "cuda" and resolve_device("cuda") == "cuda"
    assert engine_device is resolve_device


def test_the_auto_rule_is_written_once():
    rule = re.compile(r"[\"']cuda[\"'] if torch\.cuda\.is_available\(\)")
    written = [p.relative_to(PACKAGE).as_posix() for p in sorted(PACKAGE.rglob("*.py"))
               if rule.search(p.read_text())]
    assert written == ["devices.py"]


@pytest.mark.parametrize("command", [["kernel"], ["e2e", "--config", "tiny"], ["capture"]])
def test_every_command_names_a_bad_device_alike(command, tmp_path):
    result = CliRunner().invoke(app, [*command, "--device", "tpu", "--results", str(tmp_path)]
                                if command[0] != "capture" else
                                [*command, "--device", "tpu", "--out", str(tmp_path / "c")])
    assert result.exit_code == 2, result.output
    assert "--device: expected auto, cpu or cuda, got 'tpu'" in " ".join(result.output.split())
