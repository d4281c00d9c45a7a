"""scripts/profile_santa.py: its byte model, and one shape end to end through the Triton
interpreter with a stand-in timer (the GPU timing itself runs on a GPU only)."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import math

import pytest

from conftest import load_script


def _script():
    return load_script("profile_santa")


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                    reason="the kernels on a CPU need the interpreter")
def test_one_shape_through_the_interpreter():
    """Every stage row is there; bytes follow the byte model (K dominates the score pass;
    prop's two passes add to its total; flash reads K plus its rows); the stand-in timer's
    1 us per call gives bandwidth = bytes / 1 us."""
    ps = _script()
    rows = ps.profile_shape(1, 2048, 4, 2, 32, 16, 64, copy_tbps=1.0, device="cpu",
                            timer=lambda calls: 1.0, dense="sdpa-math")
    by = {(r.method, r.stage): r for r in rows}
    k_mb = 2048 * 2 * 32 * 2 / 1e6
    assert by[("prop", "score pass, no stores (K read)")].mbytes == pytest.approx(k_mb)
    score, sample = by[("prop", "score pass")], by[("prop", "sample pass (call - score)")]
    total = by[("prop", "total")]
    assert score.mbytes > k_mb and total.mbytes == pytest.approx(score.mbytes + sample.mbytes)
    assert by[("flash", "total")].mbytes > k_mb
    assert by[("sdpa-math", "total")].mbytes > 2 * k_mb
    for r in rows:
        if r is not sample:  # the call's time minus the score pass's: 0 with this timer
            assert r.tbps == pytest.approx(r.mbytes)  # bytes / 1 us, in TB/s
        assert r.floor_us == pytest.approx(r.mbytes)  # MB at 1 TB/s = us
    assert math.isnan(total.target) and total.speedup == pytest.approx(1.0)
