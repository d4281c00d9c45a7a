"""The committed tree a reader sees: result folders that load as stores, links that resolve,
docs of a readable size, scripts that still parse."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from urllib.parse import unquote

import pytest

from santa_bench.stores import StoreSet

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"
RUN_NAME = re.compile(r"^\d{4}-\d{2}-\d{2}-[a-z0-9.-]+$")
DEVICES = ("h200", "h100", "cpu")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def _tracked(*patterns: str) -> list[Path]:
    out = subprocess.run(["git", "ls-files", *patterns], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout
    return [ROOT / line for line in out.splitlines() if (ROOT / line).exists()]


def test_result_folders_are_dated_runs_by_device():
    """The committed results/ holds a folder a device, each holding dated run folders only
    (local runs, results/<run-id>/, are not committed)."""
    tracked = [path.relative_to(RESULTS).parts for path in _tracked("results")]
    assert {parts[0] for parts in tracked} == set(DEVICES)
    assert all(len(parts) == 3 for parts in tracked), "a file outside a run folder"
    for device, run in {parts[:2] for parts in tracked}:
        assert RUN_NAME.match(run) and f"-{device}-" in run, (device, run)
        assert (RESULTS / device / run / "README.md").is_file(), (device, run)


@pytest.mark.parametrize("device", DEVICES)
def test_every_result_folder_loads_as_a_store_with_rows(device):
    store = StoreSet(RESULTS / device)
    frame = store.load()
    counts = frame.groupby("run_id").size()
    runs = sorted({path.parent.name for path in _tracked(f"results/{device}")})
    assert sorted(counts.index) == runs
    assert (counts > 0).all()
    assert sorted(r["run_id"] for r in store.runs()) == runs


def _links(path: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)  # code is not linked
    text = re.sub(r"`[^`\n]*`", "", text)
    return [m.group(1) for m in LINK.finditer(text)]


def test_relative_links_in_markdown_resolve():
    broken = []
    for md in _tracked("*.md"):
        for target in _links(md):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                continue  # a URL or an anchor of the same page
            path = unquote(target.split("#", 1)[0])
            if path and not (md.parent / path).exists():
                broken.append(f"{md.relative_to(ROOT)}: {target}")
    assert not broken, "\n".join(broken)


def test_the_link_check_sees_a_broken_link(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("[gone](missing.md) [ok](page.md) `[code](x.md)` [web](https://x.org)\n")
    assert _links(page) == ["missing.md", "page.md", "https://x.org"]


def test_benchmarks_doc_is_a_readable_size():
    assert (ROOT / "docs" / "benchmarks.md").stat().st_size < 20_000


@pytest.mark.parametrize("script", sorted(p.name for p in (ROOT / "scripts").glob("*.sh")))
def test_shell_scripts_parse(script):
    subprocess.run(["bash", "-n", str(ROOT / "scripts" / script)], check=True)


TOOLS = {
    "accuracy_table.py": "tests/test_engine.py",
    "check_compile.py": "tests/test_compile.py",
    "profile_kernels.py": "tests/test_profile_kernels.py",
    "profile_quest.py": "tests/test_profile_quest.py",
    "profile_santa.py": "tests/test_profile_santa.py",
    "profile_santapp.py": "tests/test_profile_santapp.py",
    "profile_topk.py": "tests/test_profile_topk.py",
    "fidelity_one_index.py": "tests/test_santapp_draws.py",
    "team_stats.py": "tests/test_team_stats.py",
    "timing_check.py": "tests/test_timing_gpu.py",
    "top_key_inclusion.py": "tests/test_top_key_inclusion.py",
    "h200_accuracy.sh": "test_shell_scripts_parse",
    "h200_setup.sh": "test_shell_scripts_parse",
}
"""The scripts kept beside the package, each with the test that exercises it."""


def test_scripts_are_the_tested_tools():
    assert sorted(p.name for p in (ROOT / "scripts").iterdir()
                  if p.is_file() and p.suffix in {".py", ".sh"}) == sorted(TOOLS)
    for script, test in TOOLS.items():
        if test.startswith("tests/"):
            assert script.removesuffix(".py") in (ROOT / test).read_text(), (script, test)


@pytest.mark.parametrize("script", sorted(s.removesuffix(".py") for s in TOOLS
                                          if s.endswith(".py") and s != "check_compile.py"))
def test_python_scripts_import(script):
    """Each Python tool imports on a CPU (its main guarded), so its --help is reachable."""
    from conftest import load_script

    assert callable(load_script(script).main)
