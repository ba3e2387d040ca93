"""A robot's cameras become one observation: the primary's image, each other camera's image
nearest to it within the skew, a bounded wait for the missing ones."""

from __future__ import annotations

import numpy as np
import pytest

from vla_sched.ros.camera_sync import CameraFrame, CameraSync

MS = 1_000_000
CAMERAS = ('camera/image_raw', 'wrist_left/image_raw', 'wrist_right/image_raw')


def _sync(num_cameras: int = 3, *, max_wait_s: float = 0.05) -> CameraSync:
    return CameraSync(
        CAMERAS[:num_cameras], max_skew_s=0.05, max_wait_s=max_wait_s, owner='robots.arm'
    )


def _frame(stamp_ms: float, value: int = 0, *, received_ms: float | None = None) -> CameraFrame:
    received_ms = stamp_ms if received_ms is None else received_ms
    return CameraFrame(
        np.full((2, 2, 3), value, np.uint8), round(stamp_ms * MS), round(received_ms * MS)
    )


def _values(sync: CameraSync) -> list[int]:
    obs, problem = sync.take()
    assert problem is None, problem
    return [int(image[0, 0, 0]) for image in obs.images]


def test_one_camera_makes_a_complete_observation_at_once():
    sync = _sync(1)
    assert not sync.offer(0, _frame(10, value=7))
    assert sync.is_ready(10 * MS) and sync.ready_at_ns() is None
    assert _values(sync) == [7]


def test_the_other_cameras_images_are_bound_whether_they_come_before_or_after_the_primary():
    sync = _sync()
    sync.offer(1, _frame(95, value=1))  # before the primary, within the skew
    sync.offer(0, _frame(100, value=0))
    assert not sync.is_ready(101 * MS)
    sync.offer(2, _frame(120, value=2))  # after it
    assert sync.is_ready(121 * MS)
    obs = sync.pending
    assert obs is not None and obs.stamp_ns == 100 * MS
    assert _values(sync) == [0, 1, 2]


def test_a_closer_image_that_comes_later_replaces_the_bound_one_and_a_farther_one_does_not():
    sync = _sync(2)
    sync.offer(1, _frame(60, value=1))  # 40 ms before the primary
    sync.offer(0, _frame(100, value=0))
    sync.offer(1, _frame(110, value=2))  # 10 ms after: closer
    sync.offer(1, _frame(130, value=3))  # 30 ms after: farther
    assert _values(sync) == [0, 2]


def test_an_image_past_the_skew_is_not_bound_and_the_refusal_says_how_far_it_was():
    sync = _sync()
    sync.offer(1, _frame(40, value=1))  # 60 ms before the primary
    sync.offer(0, _frame(100, received_ms=103))
    sync.offer(2, _frame(101, value=2))
    assert sync.ready_at_ns() == 153 * MS  # the primary's arrival plus the wait
    assert not sync.is_ready(152 * MS) and sync.is_ready(153 * MS)
    obs, problem = sync.take()
    assert obs.stamp_ns == 100 * MS and not obs.is_complete
    assert problem == (
        "no image within robots.arm.max_camera_skew_s = 0.05 s of the primary camera's stamp "
        'arrived in robots.arm.max_camera_wait_s = 0.05 s from wrist_left/image_raw (its newest '
        'is stamped 0.060 s before)'
    )
    assert sync.pending is None


def test_a_silent_camera_is_named_and_an_incomplete_observation_has_no_images():
    sync = _sync()
    sync.offer(0, _frame(100))
    obs, problem = sync.take()
    assert problem is not None
    assert problem.endswith(
        'from wrist_left/image_raw (none received yet), wrist_right/image_raw (none received yet)'
    )
    with pytest.raises(RuntimeError, match='incomplete observation'):
        obs.images  # noqa: B018


def test_a_newer_primary_image_keeps_the_wait_of_the_incomplete_one_it_replaces():
    sync = _sync(2)
    sync.offer(0, _frame(0))
    assert sync.offer(0, _frame(30))  # replaced: its wait still ends at 50 ms
    assert sync.ready_at_ns() == 50 * MS
    sync.offer(1, _frame(35))
    assert sync.offer(0, _frame(40))  # replaces a complete one: a wait of its own
    assert sync.is_ready(40 * MS)  # the wrist's image at 35 ms is within the skew
    sync.offer(0, _frame(100))
    assert sync.ready_at_ns() == 150 * MS


def test_an_image_stamped_as_the_primary_is_bound_however_late_it_arrives_within_the_wait():
    sync = _sync(2, max_wait_s=0.5)
    sync.offer(0, _frame(100, value=0))
    assert sync.ready_at_ns() == 600 * MS  # the wait is its own bound, not the skew
    assert not sync.is_ready(400 * MS)
    sync.offer(1, _frame(100, value=1, received_ms=400))  # 300 ms late, stamped alike
    assert sync.is_ready(400 * MS)
    assert _values(sync) == [0, 1]


def test_the_wait_is_the_skew_unless_given():
    sync = CameraSync(CAMERAS[:2], max_skew_s=0.05, owner='robots.arm')
    sync.offer(0, _frame(100))
    assert sync.ready_at_ns() == 150 * MS


def test_taking_without_an_observation_raises():
    with pytest.raises(RuntimeError, match=r'robots\.arm: no observation to take'):
        _sync().take()
