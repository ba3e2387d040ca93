"""A latency window keeps the newest samples in memory fixed from its creation on."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from vla_sched.core.scheduling.metrics import LatencyWindow, SchedulerMetrics


def test_a_full_window_keeps_the_newest_samples_and_their_percentiles():
    window = LatencyWindow(4)
    assert len(window) == 0 and np.isnan(window.percentile_ms(50)) and np.isnan(window.max_ms())
    for ns in (1, 2, 3):
        window.add(ns * 10**6)
    assert window.samples().tolist() == [10**6, 2 * 10**6, 3 * 10**6]
    for ns in (4, 5, 6, 7, 8, 9):
        window.add(ns * 10**6)
    assert len(window) == 4
    assert window.samples().tolist() == [6 * 10**6, 7 * 10**6, 8 * 10**6, 9 * 10**6]
    assert window.percentile_ms(50) == pytest.approx(7.5)
    assert window.max_ms() == pytest.approx(9.0)


def test_adding_samples_to_a_window_allocates_nothing_that_stays():
    """An engine adds samples for as long as it runs: its windows must not grow while they
    fill (a deque of Python ints kept about 40 bytes per sample until it was full)."""
    window = LatencyWindow(2048)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(3 * 2048):
            window.add(10**12 + 7919 * i)  # large values: no cached small ints
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(window) == 2048
    assert grown < 2048  # under one byte per kept sample


def test_retract_stamps_are_bounded_by_the_window_without_a_stats_reader():
    metrics = SchedulerMetrics(window_size=8, retract_window_ns=1_000)
    for now in range(0, 100_000, 10):
        metrics.record_retract('r1', now)
    assert metrics.num_retracts_total == 10_000
    assert len(metrics._retract_stamps) <= 1_000 // 10 + 1
    assert metrics.num_retracts_in_window(100_000) == 99
