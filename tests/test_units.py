"""santa_bench.units: sizes, comma lists and BATCHxCTX shapes."""

import pytest

from santa_bench.units import parse_shapes, parse_size, parse_size_list


def test_sizes():
    assert parse_size("32k") == 32768 and parse_size(" 1m ") == 1 << 20 and parse_size(7) == 7
    assert parse_size_list("8k, 32k") == [8192, 32768]
    for bad in ("0", "1.5", "k", "-4", "2g"):
        with pytest.raises(ValueError):
            parse_size(bad)


def test_shapes():
    assert parse_shapes("1x32k, 8x4k") == [(1, 32768), (8, 4096)]
    for bad in ("32k", "", "ax32k", "0x4k", "2x0"):
        with pytest.raises(ValueError):
            parse_shapes(bad)
