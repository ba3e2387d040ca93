"""The engine inbox receives as messages arrive and says so: results wake the consumer,
heartbeats only keep the engine alive, what is not for the frontend is refused, and an engine
that ends is announced."""

from __future__ import annotations

import logging
import threading
import time

import numpy as np
import pytest

from vla_sched.engine.bad_frames import BadFrames
from vla_sched.engine.inbox import EngineInbox
from vla_sched.ipc.channel import in_process_pair
from vla_sched.ipc.heartbeat import HeartbeatTracker
from vla_sched.ipc.messages import CloseSession, EngineInfo, Heartbeat, StepResult

WAIT_S = 30.0  # only a hang reaches this
INFO = EngineInfo('fake', 0, 2, 7, 8, 16, True)


class Wakes:
    """Counts ``on_arrival`` calls; ``wait`` returns once a new one came."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.count = 0

    def __call__(self) -> None:
        with self._cond:
            self.count += 1
            self._cond.notify_all()

    def wait_beyond(self, count: int) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self.count > count, WAIT_S)


def _result(step_seq: int) -> StepResult:
    actions = np.zeros((2, 7), np.float32)
    return StepResult('arm_a', step_seq, 1, actions, 0.0, 0.0, 0.0, False, 0)


def _take_until(inbox: EngineInbox, wakes: Wakes, num_wanted: int) -> list:
    got: list = []
    while len(got) < num_wanted:
        seen = wakes.count
        got += inbox.take()
        if len(got) < num_wanted:
            assert wakes.wait_beyond(seen), got
    return got


@pytest.fixture
def link():
    frontend_end, engine_end = in_process_pair()
    wakes = Wakes()
    ended = threading.Event()
    heartbeat = HeartbeatTracker(sender='frontend', period_s=0.2, timeout_s=1.0)
    bad = BadFrames('the engine', logger=logging.getLogger('inbox-test'))
    inbox = EngineInbox(
        frontend_end,
        heartbeat=heartbeat,
        bad_frames=bad,
        engine_ended=ended.is_set,
        on_arrival=wakes,
        wait_s=0.05,
    )
    yield inbox, engine_end, wakes, ended, heartbeat, bad
    inbox.close()
    assert not inbox.running


def test_results_are_taken_in_arrival_order_after_a_wake(link):
    inbox, engine_end, wakes, *_ = link
    for seq in (1, 2, 3):
        engine_end.send(_result(seq))
    got = _take_until(inbox, wakes, 3)
    assert [m.step_seq for m in got] == [1, 2, 3]
    assert 1 <= wakes.count <= 3  # a burst wakes the consumer once, or once per gap in it


def test_heartbeats_keep_the_engine_alive_but_wake_nobody(link):
    inbox, engine_end, wakes, _, heartbeat, _ = link
    assert not heartbeat.alive(time.monotonic())
    engine_end.send(Heartbeat('engine', 1, 0))
    engine_end.send(Heartbeat('engine', 2, 0))
    engine_end.send(INFO)
    (got,) = _take_until(inbox, wakes, 1)
    assert got == INFO
    assert heartbeat.alive(time.monotonic())
    assert wakes.count == 1


def test_a_message_meant_for_the_engine_is_refused_and_later_ones_arrive(link):
    inbox, engine_end, wakes, _, _, bad = link
    engine_end.send(CloseSession(robot_id='arm_a'))
    engine_end.send(_result(7))
    (got,) = _take_until(inbox, wakes, 1)
    assert got.step_seq == 7
    assert bad.num_refused == 1


def test_an_engine_that_ends_is_announced(link):
    inbox, _, wakes, ended, *_ = link
    seen = wakes.count
    ended.set()
    assert wakes.wait_beyond(seen)
    assert inbox.take() == []


def test_take_waits_for_the_first_message(link):
    inbox, engine_end, *_ = link
    threading.Timer(0.05, lambda: engine_end.send(_result(4))).start()
    (got,) = inbox.take(timeout_s=WAIT_S)
    assert got.step_seq == 4
