"""One fleet of simulated robots (bench/lib/fleets.py): the node's rules for robots on any
clock, and frames that are ``synthetic_frame``'s byte for byte."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from bench.lib.fleets import Fleet, FleetTiming, FrameSource, robot_index
from vla_sched.synthetic_frames import synthetic_frame

MS = 1_000_000


def _timing(**kwargs) -> FleetTiming:
    values = {'period_s': 0.1, 'budget_s': 0.5, 'warmup_s': 0.0, 'duration_s': 1.0}
    return FleetTiming(**{**values, 'phases': 'spread', **kwargs})


def test_spread_cameras_fire_at_their_phase_and_an_idle_robot_sends_at_once():
    fleet = Fleet(2, _timing())
    (first,) = fleet.images_until(0)
    assert (first.robot, first.seq, first.stamp_ns, first.deadline_ns) == (0, 1, 0, 500 * MS)
    assert fleet.next_image_ns() == 50 * MS  # robot 1's phase: half the period
    (second,) = fleet.images_until(50 * MS)
    assert (second.robot, second.stamp_ns) == (1, 50 * MS)


def test_a_robot_keeps_one_step_in_flight_and_sends_its_newest_image_when_it_ends():
    fleet = Fleet(1, _timing())
    fleet.images_until(0)
    assert fleet.images_until(250 * MS) == []  # images at 100 and 200 ms wait: one in flight
    assert fleet.num_superseded == 1  # the image of 100 ms was replaced by that of 200 ms
    step = fleet.ended(0, 260 * MS, delivered=True)
    assert (step.seq, step.stamp_ns) == (2, 200 * MS)
    assert fleet.ended(0, 270 * MS, delivered=True) is None  # nothing waits
    assert [(e.stamp_ns, e.end_ns, e.on_time) for e in fleet.ends] == [
        (0, 260 * MS, True),
        (200 * MS, 270 * MS, True),
    ]


def test_an_image_past_its_deadline_before_it_could_be_sent_is_refused_unsent():
    fleet = Fleet(1, _timing(budget_s=0.15))
    fleet.images_until(0)
    assert fleet.images_until(100 * MS) == []  # the image of 100 ms waits
    assert fleet.ended(0, 300 * MS, delivered=True) is None  # 100 + 150 ms < 300 ms
    assert [(e.stamp_ns, e.delivered, e.on_time) for e in fleet.ends] == [
        (0, True, False),  # delivered late
        (100 * MS, False, False),  # refused
    ]
    with pytest.raises(ValueError, match='no step in flight'):
        fleet.ended(0, 310 * MS, delivered=True)


def test_the_window_judges_only_its_images_and_the_cameras_stop_at_its_end():
    fleet = Fleet(1, _timing(warmup_s=0.2, duration_s=0.3))
    now = 0
    while not fleet.done():
        for _ in fleet.images_until(now):
            fleet.ended(0, now + 10 * MS, delivered=True)
        now = fleet.next_image_ns() if fleet.next_image_ns() is not None else now
    assert fleet.num_images_judged == 3  # stamps 200, 300 and 400 ms
    measure = fleet.measure()
    assert (measure.rate_share, measure.on_time_share) == (1.0, 1.0)
    assert measure.latency_ms_p99 == pytest.approx(10.0)


def test_random_phases_are_seeded_and_aligned_phases_are_zero():
    def phases(timing: FleetTiming) -> list[int]:
        fleet = Fleet(4, timing)
        return [s.stamp_ns for s in fleet.images_until(100 * MS - 1)]

    assert phases(_timing(phases='random', seed=3)) == phases(_timing(phases='random', seed=3))
    assert phases(_timing(phases='aligned')) == [0, 0, 0, 0]
    with pytest.raises(ValueError, match='phases'):
        _timing(phases='sometimes')


def test_robot_ids_map_back_to_their_index():
    assert robot_index('robot_12') == 12


@pytest.mark.parametrize(('width', 'height'), [(64, 64), (224, 224), (33, 17), (1, 1), (2, 5)])
def test_fleet_frames_are_the_synthetic_frames_byte_for_byte(width, height):
    source = FrameSource(width=width, height=height)
    for index in (*range(40), 255, 256, 1000, 123_457):
        frame = source.frame(index)
        assert frame.dtype == np.uint8 and frame.shape == (height, width, 3)
        assert frame.tobytes() == synthetic_frame(index, width=width, height=height).tobytes()


def test_consecutive_fleet_frames_differ_so_each_is_a_new_image():
    source = FrameSource(width=64, height=64)
    frames = [source.frame(index).tobytes() for index in range(300)]
    assert all(a != b for a, b in itertools.pairwise(frames))
