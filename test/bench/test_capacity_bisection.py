"""bench.lib.capacity.bisect_capacity: the ladder search's capacity in fewer measurements."""

from __future__ import annotations

import pytest

from bench.lib import capacity


def _bisect(capacity_of_system: int, max_robots: int, **kwargs):
    measured = []

    def measure(n: int) -> capacity.CapacityMeasure:
        measured.append(n)
        rate = 1.0 if n <= capacity_of_system else 0.9
        return capacity.CapacityMeasure(n, rate, 1.0, 50.0, 80.0)

    criteria = capacity.CapacityCriteria()
    return capacity.bisect_capacity('sys', max_robots, measure, criteria, **kwargs), measured


@pytest.mark.parametrize('true_capacity', [0, 1, 2, 9, 10, 13, 20])
def test_bisection_finds_what_the_ladder_search_finds_when_passing_is_monotone(true_capacity):
    search, measured = _bisect(true_capacity, 20, first_probe=10)
    ladder = capacity.search_capacity(
        'sys', capacity.robot_ladder(20),
        lambda n: capacity.CapacityMeasure(n, 1.0 if n <= true_capacity else 0.9, 1.0, 1, 1),
        capacity.CapacityCriteria(), refine=True,
    )  # fmt: skip
    assert search.capacity == ladder.capacity == true_capacity
    assert len(measured) == len(set(measured)) <= 7  # 1, the probe, log2(20) halvings


def test_one_robot_first_then_the_probe_then_halving_the_span():
    _, measured = _bisect(3, 20, first_probe=10)
    assert measured == [1, 10, 5, 3, 4]
    _, measured = _bisect(0, 20, first_probe=10)
    assert measured == [1]  # nothing passes above a failed robot
    _, measured = _bisect(20, 20)
    assert measured == [1, 11, 16, 18, 19, 20]


def test_a_probe_outside_the_span_is_ignored_and_the_top_is_max_robots():
    search, measured = _bisect(40, 2, first_probe=10)
    assert measured == [1, 2] and search.capacity == 2
    with pytest.raises(ValueError, match='max_robots'):
        _bisect(1, 0)
