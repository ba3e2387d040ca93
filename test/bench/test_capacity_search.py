"""The one capacity rule and search (bench/lib/capacity.py), and how the control loop's points
are judged by it (bench/control_loop_report.py)."""

from __future__ import annotations

import math

import pytest

from bench import control_loop_report as report
from bench.lib import capacity
from bench.lib.capacity import StepEnd, judge
from bench.lib.ros_fleet import FleetWindow


def _measure(num_robots: int, *, rate: float = 1.0, on_time: float = 1.0, p99: float = 100.0):
    return capacity.CapacityMeasure(num_robots, rate, on_time, p99 / 2, p99)


def _search(passing: set[int], counts, **kwargs):
    measured = []

    def measure(n: int):
        measured.append(n)
        return _measure(n, rate=1.0 if n in passing else 0.5)

    search = capacity.search_capacity(
        'sys', counts, measure, capacity.CapacityCriteria(), **kwargs
    )
    return search, measured


def test_the_search_stops_after_two_failures_in_a_row_and_keeps_the_largest_pass():
    search, measured = _search({1, 2, 6}, (1, 2, 4, 6, 8, 10, 12, 14))
    assert measured == [1, 2, 4, 6, 8, 10]  # 4 failed alone; 8 and 10 in a row
    assert search.capacity == 6
    assert [s.passed for s in search.steps] == [True, True, False, True, False, False]
    assert search.one_robot.latency_ms_p99 == 100.0


def test_one_failure_stops_the_search_when_asked_and_no_pass_is_capacity_zero():
    search, measured = _search(set(), (1, 2, 4), max_failures_in_row=1)
    assert measured == [1]
    assert search.capacity == 0


def test_refining_measures_the_skipped_counts_up_to_the_first_failure():
    search, measured = _search(set(range(1, 22)), (1, 2, 4, 8, 16, 24, 32), refine=True)
    assert measured == [1, 2, 4, 8, 16, 24, 32, 17, 18, 19, 20, 21, 22]
    assert search.capacity == 21
    search, measured = _search(set(range(1, 14)), (12, 14, 16), refine=True)
    assert measured == [12, 14, 16, 13]
    assert search.capacity == 13


def test_a_count_passes_on_its_action_rate_and_on_time_share_alone():
    criteria = capacity.CapacityCriteria()
    assert criteria.failures(_measure(3, rate=0.99, on_time=0.99, p99=5000.0)) == ()
    failures = criteria.failures(_measure(3, rate=0.98, on_time=0.5))
    assert [f.split()[0] for f in failures] == ['rate', 'on']
    nan = criteria.failures(_measure(3, rate=math.nan, on_time=math.nan, p99=math.nan))
    assert len(nan) == 2
    with pytest.raises(ValueError, match='min_rate_share'):
        capacity.CapacityCriteria(min_rate_share=1.5)


def test_the_ladder_steps_up_to_the_maximum_and_ends_on_it():
    ladder = capacity.robot_ladder
    assert ladder(15) == (1, 2, 4, 6, 8, 10, 12, 14, 15)
    assert ladder(24)[-3:] == (18, 20, 24)
    with pytest.raises(ValueError):
        ladder(0)


def test_the_headline_gives_each_systems_capacity_and_one_robot_latency():
    ours, _ = _search({1, 2, 4}, (1, 2, 4, 6, 8))
    base, _ = _search({1}, (2, 4))
    table = capacity.headline_table([ours, base])
    assert '| sys | 4 | 50 | 100 | 6: rate 50.0% < 99.0% |' in table
    assert '| sys | 0 | n/a | n/a | 2: rate 50.0% < 99.0% |' in table
    steps = capacity.steps_table([ours])
    assert steps.count('| sys |') == 5 and '| sys | 6 | 50.0% |' in steps


def _window(chunks: int, latencies: list[float], *, late: int = 0, refused: int = 0, s=2.0):
    robot = {
        'num_chunks': chunks,
        'misses': late + refused,
        'rejected': {'5': refused} if refused else {},
        'first_chunk': {'horizon': 2},
    }
    return FleetWindow(duration_s=s, robots=[robot], latencies_ms=latencies, num_late_chunks=late)


def test_a_loop_point_is_judged_on_every_windows_chunks_and_every_ended_step():
    plan = report.LoopPlan(robot_counts=(1,), period_s=0.1)
    windows = [_window(20, [50.0] * 20, late=1), _window(19, [60.0] * 19, refused=1, s=2.0)]
    point = report.summarize('scheduled', 1, plan, windows, retracts=[0, 0])
    measure = point.capacity_measure()
    assert measure.num_robots == 1
    assert measure.rate_share == pytest.approx(39 / 40)  # 39 chunks x 2 over 4 s, target 20/s
    assert measure.on_time_share == pytest.approx(38 / 40)  # one late chunk, one refusal
    assert measure.latency_ms_p99 == pytest.approx(point.latency_ms_p99)


def test_a_window_is_judged_on_its_images_steps_that_ended_and_delivered_latencies():
    ms = 1_000_000
    ends = [
        StepEnd(0, stamp_ns=0, end_ns=50 * ms, delivered=True, deadline_ns=500 * ms),  # warm-up
        StepEnd(0, stamp_ns=100 * ms, end_ns=150 * ms, delivered=True, deadline_ns=600 * ms),
        StepEnd(0, stamp_ns=200 * ms, end_ns=800 * ms, delivered=True, deadline_ns=700 * ms),
        StepEnd(1, stamp_ns=300 * ms, end_ns=900 * ms, delivered=False, deadline_ns=800 * ms),
    ]
    measure = judge(ends, 2, (100 * ms, 400 * ms), num_images=4)
    assert measure.rate_share == pytest.approx(2 / 4)  # 2 delivered of 4 images stamped
    assert measure.on_time_share == pytest.approx(1 / 3)  # one late, one refused
    assert measure.latency_ms_p50 == pytest.approx(325.0)  # of 50 and 600 ms
    empty = judge([], 1, (0, 1), num_images=0)
    assert math.isnan(empty.rate_share) and math.isnan(empty.latency_ms_p99)
