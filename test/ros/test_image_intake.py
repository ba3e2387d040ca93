"""Image conversions on worker threads: newest image per robot, robots never wait on another."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from vla_sched.ros.conversions import ImageError
from vla_sched.ros.image_intake import Converted, ImageIntake, run_conversion

WAIT_S = 30.0  # only a hang reaches this


class Results:
    """Collects an intake's results as its workers report them."""

    def __init__(self) -> None:
        self.ready = threading.Condition()
        self.items: list[Converted] = []
        self.intake: ImageIntake | None = None

    def on_ready(self) -> None:
        assert self.intake is not None
        with self.ready:
            self.items.extend(self.intake.take())
            self.ready.notify_all()

    def wait_for(self, count: int) -> list[Converted]:
        with self.ready:
            assert self.ready.wait_for(lambda: len(self.items) >= count, WAIT_S), self.items
            return list(self.items)


def _intake(num_workers: int) -> tuple[ImageIntake, Results]:
    results = Results()
    results.intake = ImageIntake(on_ready=results.on_ready, num_workers=num_workers)
    return results.intake, results


def _image(value: int) -> np.ndarray:
    return np.full((2, 2, 3), value, dtype=np.uint8)


def _blocked(started: threading.Event, release: threading.Event, value: int):
    def convert() -> np.ndarray:
        started.set()
        assert release.wait(WAIT_S)
        return _image(value)

    return convert


def test_a_newer_image_replaces_the_waiting_one_of_the_same_robot():
    intake, results = _intake(num_workers=1)
    started, release = threading.Event(), threading.Event()
    try:
        intake.submit('a', _blocked(started, release, 1), stamp_ns=1, received_ns=1)
        assert started.wait(WAIT_S)  # the worker is busy with a's first image
        assert not intake.submit('a', lambda: _image(2), stamp_ns=2, received_ns=2)
        assert intake.submit('a', lambda: _image(3), stamp_ns=3, received_ns=3)
        assert intake.num_waiting == 1
        release.set()
        done = results.wait_for(2)
    finally:
        intake.close()
    assert [(c.robot_id, c.stamp_ns, int(c.image[0, 0, 0])) for c in done] == [
        ('a', 1, 1),
        ('a', 3, 3),
    ]


def test_each_camera_of_a_robot_keeps_its_own_newest_image():
    intake, results = _intake(num_workers=1)
    started, release = threading.Event(), threading.Event()
    try:
        intake.submit('a', _blocked(started, release, 1), stamp_ns=1, received_ns=1)
        assert started.wait(WAIT_S)  # the worker is busy with the primary's first image
        assert intake.holds('a', 0) and not intake.holds('a', 1)
        assert not intake.submit('a', lambda: _image(2), stamp_ns=2, received_ns=2, camera=1)
        assert not intake.submit('a', lambda: _image(3), stamp_ns=3, received_ns=3)
        assert intake.submit('a', lambda: _image(4), stamp_ns=4, received_ns=4, camera=1)
        assert intake.num_waiting == 2
        release.set()
        done = results.wait_for(3)
    finally:
        intake.close()
    got = sorted((c.camera, c.stamp_ns, int(c.image[0, 0, 0])) for c in done)
    assert got == [(0, 1, 1), (0, 3, 3), (1, 4, 4)]


def test_a_robot_whose_image_is_slow_does_not_hold_another_robots_image():
    intake, results = _intake(num_workers=2)
    started, release = threading.Event(), threading.Event()
    try:
        intake.submit('slow', _blocked(started, release, 1), stamp_ns=1, received_ns=1)
        assert started.wait(WAIT_S)
        # the slow robot's next image waits for its first; the other robot's does not
        intake.submit('slow', lambda: _image(2), stamp_ns=2, received_ns=2)
        intake.submit('fast', lambda: _image(9), stamp_ns=5, received_ns=5)
        first = results.wait_for(1)
        assert [(c.robot_id, c.stamp_ns) for c in first] == [('fast', 5)]
        release.set()
        done = results.wait_for(3)
    finally:
        intake.close()
    assert [(c.robot_id, c.stamp_ns) for c in done[1:]] == [('slow', 1), ('slow', 2)]


def test_a_frequent_camera_is_not_starved_behind_a_slow_one():
    """One worker, a camera whose every conversion is slow and one whose images come often.
    The frequent camera's newest image keeps its place in the queue when it replaces the
    waiting one, so each time the slow conversion ends the frequent camera is served before
    the slow camera's next image (a replacement sent to the back waited behind it, forever)."""
    intake, results = _intake(num_workers=1)
    gates = [(threading.Event(), threading.Event()) for _ in range(6)]
    try:
        intake.submit('slow', _blocked(*gates[0], 0), stamp_ns=0, received_ns=0)
        assert gates[0][0].wait(WAIT_S)
        for r in range(1, 6):
            stamp = 100 * r
            intake.submit('fast', lambda: _image(1), stamp_ns=stamp, received_ns=stamp)
            intake.submit('slow', _blocked(*gates[r], r), stamp_ns=stamp, received_ns=stamp)
            assert intake.submit('fast', lambda: _image(2), stamp_ns=stamp + 1, received_ns=0)
            gates[r - 1][1].set()  # the slow conversion in progress ends
            assert gates[r][0].wait(WAIT_S)  # the worker has taken the slow camera's next
            served = [(c.robot_id, c.stamp_ns) for c in results.wait_for(2 * r)]
            assert served[-2:] == [('slow', 100 * (r - 1)), ('fast', stamp + 1)], served
        gates[5][1].set()
        results.wait_for(11)
    finally:
        intake.close()


def test_failed_conversions_become_errors_and_the_workers_go_on():
    intake, results = _intake(num_workers=1)

    def refused() -> np.ndarray:
        raise ImageError('png header declares 12000x12000')

    def broken() -> np.ndarray:
        raise MemoryError('cannot allocate')

    try:
        intake.submit('a', refused, stamp_ns=1, received_ns=1)
        results.wait_for(1)
        intake.submit('a', broken, stamp_ns=2, received_ns=2)
        results.wait_for(2)
        intake.submit('a', lambda: _image(7), stamp_ns=3, received_ns=3)
        done = results.wait_for(3)
    finally:
        intake.close()
    assert done[0].image is None and done[0].error == 'png header declares 12000x12000'
    assert done[1].image is None and 'MemoryError: cannot allocate' in done[1].error
    assert done[2].error == '' and int(done[2].image[0, 0, 0]) == 7


def test_after_close_nothing_is_taken_and_the_workers_have_stopped():
    intake, _ = _intake(num_workers=2)
    intake.close()
    assert not any(worker.is_alive() for worker in intake._workers)
    with pytest.raises(RuntimeError, match='closed'):
        intake.submit('a', lambda: _image(1), stamp_ns=1, received_ns=1)


def test_holds_says_whether_a_robots_image_is_waiting_or_in_conversion():
    intake, results = _intake(num_workers=1)
    started, release = threading.Event(), threading.Event()
    try:
        assert not intake.holds('a')
        intake.submit('a', _blocked(started, release, 1), stamp_ns=1, received_ns=1)
        assert started.wait(WAIT_S)
        assert intake.holds('a') and not intake.holds('b')  # in conversion
        intake.submit('a', lambda: _image(2), stamp_ns=2, received_ns=2)
        release.set()
        results.wait_for(2)
        assert not intake.holds('a')
    finally:
        intake.close()


def test_a_conversion_run_at_once_reports_errors_as_the_workers_do():
    def malformed() -> np.ndarray:
        raise ImageError('image step 5 is smaller than width*channels')

    def broken() -> np.ndarray:
        raise KeyError('encoding')

    good = run_conversion('a', lambda: _image(7), stamp_ns=3, received_ns=4)
    assert good.robot_id == 'a' and (good.stamp_ns, good.received_ns) == (3, 4)
    assert int(good.image[0, 0, 0]) == 7 and good.error == ''
    bad = run_conversion('a', malformed, stamp_ns=5, received_ns=6)
    assert bad.image is None and bad.error == 'image step 5 is smaller than width*channels'
    crashed = run_conversion('a', broken, stamp_ns=7, received_ns=8)
    assert crashed.image is None
    assert crashed.error == "image conversion failed: KeyError: 'encoding'"
