"""The benchmarks' shared statistics and tables."""

from __future__ import annotations

import math

import pytest

from bench.lib.stats import mean, percentile
from bench.lib.tables import markdown_table


def test_an_empty_window_has_no_percentile_and_no_mean():
    assert math.isnan(percentile([], 50))
    assert math.isnan(mean([]))


def test_percentiles_interpolate_between_samples():
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == pytest.approx(2.5)
    assert percentile([5.0], 99) == 5.0


def test_a_percentile_outside_0_to_100_is_refused():
    with pytest.raises(ValueError, match='q must be'):
        percentile([1.0], 101)


def test_tables_show_nan_as_na_and_refuse_ragged_rows():
    table = markdown_table(['robots', 'p99 ms'], [[1, 2.345], [2, math.nan]])
    assert table.splitlines() == [
        '| robots | p99 ms |',
        '|---|---|',
        '| 1 | 2.35 |',
        '| 2 | n/a |',
    ]
    with pytest.raises(ValueError, match='2 headers'):
        markdown_table(['a', 'b'], [[1]])
