"""The environment record's git SHA: read only from the package's own checkout, and never by
running a repository's fsmonitor hook."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from santa_bench import environment

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def _hostile_repo(root: Path, marker: Path) -> None:
    """Make `root` a git repo with one commit whose core.fsmonitor hook creates `marker`."""
    root.mkdir(parents=True, exist_ok=True)
    hook = root / "monitor.sh"
    hook.write_text(f"#!/bin/sh\ntouch '{marker}'\n")
    hook.chmod(hook.stat().st_mode | stat.S_IXUSR)
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    for args in (["init", "-q"], ["add", "monitor.sh"], ["commit", "-q", "-m", "x"],
                 ["config", "core.fsmonitor", str(hook)]):
        subprocess.run(["git", "-C", str(root), *args], check=True, env=env,
                       capture_output=True)
    marker.unlink(missing_ok=True)


def test_git_sha_never_runs_the_current_folders_fsmonitor(tmp_path, monkeypatch):
    marker = tmp_path / "pwned"
    repo = tmp_path / "untrusted"
    _hostile_repo(repo, marker)
    # The package installed outside any git checkout (as from a wheel into site-packages).
    installed = tmp_path / "site-packages" / "santa_bench" / "environment.py"
    installed.parent.mkdir(parents=True)
    monkeypatch.setattr(environment, "__file__", str(installed))
    monkeypatch.delenv("SANTA_BENCH_GIT_SHA", raising=False)
    monkeypatch.chdir(repo)
    env = environment.collect_environment("santa-bench env")
    assert not marker.exists()
    assert env["git_sha"] is None


def test_git_sha_of_own_checkout_runs_no_fsmonitor(tmp_path, monkeypatch):
    marker = tmp_path / "pwned"
    repo = tmp_path / "checkout"
    _hostile_repo(repo, marker)
    monkeypatch.setattr(environment, "__file__", str(repo / "santa_bench" / "environment.py"))
    monkeypatch.delenv("SANTA_BENCH_GIT_SHA", raising=False)
    monkeypatch.chdir(tmp_path)
    sha = environment.collect_environment("santa-bench env")["git_sha"]
    assert not marker.exists()
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], check=True,
                          capture_output=True, text=True).stdout.strip()
    assert sha in (head, f"{head}-dirty")
