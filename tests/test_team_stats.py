"""scripts/team_stats.py: the team-size summary of an index."""

import pytest

from conftest import load_script
from santa_bench.inputs import DecodeShape, make_decode_inputs


def _script():
    return load_script("team_stats")


def test_contiguous_teams_are_full_and_kmeans_teams_many_and_uneven():
    stats = _script().team_stats
    _, kv = make_decode_inputs(DecodeShape(batch=1, ctx=1024 + 68, heads=4, kv_heads=2,
                                           head_dim=32))
    spans = stats(kv, "contiguous", 16, 4, sink=4, window=64)
    assert spans["teams_per_head"] == pytest.approx(1024 / 16)
    assert spans["mean"] == spans["p50"] == spans["max"] == 16
    kmeans = stats(kv, "kmeans", 16, 4, sink=4, window=64)
    # about N / P parents of up to 4 leaders each: more, smaller teams, the longest longer
    assert kmeans["teams_per_head"] > 1.5 * spans["teams_per_head"]
    assert kmeans["p50"] < 16 < kmeans["max"]
    assert kmeans["mean"] * kmeans["teams_per_head"] == pytest.approx(1024)


def test_a_missing_file_is_one_line_and_exit_2(capsys, tmp_path):
    assert _script().main([str(tmp_path / "none.safetensors")]) == 2
    assert "not found" in capsys.readouterr().err
