"""The engine loop keeps beating through a long step, and stops beating when it hangs."""

from __future__ import annotations

import threading
import time

import numpy as np

from vla_sched.engine.message_server import serve
from vla_sched.ipc.channel import in_process_pair
from vla_sched.ipc.heartbeat import HeartbeatTracker
from vla_sched.ipc.messages import (
    EngineInfo,
    EngineStats,
    Heartbeat,
    StepRequest,
    StepResult,
)


class BlockingCore:
    """A core whose one step blocks until the test releases it (a long model step)."""

    info = EngineInfo('blocking', 0, 1, 1, 8, 16, True)

    def __init__(self) -> None:
        self.release = threading.Event()
        self.stepping = threading.Event()
        self.pending: list[StepRequest] = []

    def submit(self, request, now_ns):
        self.pending.append(request)
        return []

    def close_session(self, robot_id):
        pass

    def has_work(self):
        return bool(self.pending)

    def step(self, now_ns):
        self.stepping.set()
        self.release.wait(timeout=30)
        req = self.pending.pop()
        actions = np.zeros((1, 1), np.float32)
        return [StepResult(req.robot_id, req.step_seq, req.stamp_ns, actions, 0, 0, 0, False, 0)]

    def stats(self, now_ns):
        return EngineStats(now_ns, 0, 0, '', 0, 0, 0, 0.0, 0.0, 0, 0, 0, 0)

    def close(self):
        pass


def _start(core, *, max_step_s):
    frontend, engine = in_process_pair()
    stop = threading.Event()
    beat = HeartbeatTracker(sender='engine', period_s=0.05, timeout_s=5.0)
    thread = threading.Thread(
        target=serve,
        args=(engine, core),
        kwargs=dict(heartbeat=beat, stats_period_s=10.0, stop=stop, max_step_s=max_step_s),
        daemon=True,
    )
    thread.start()
    frontend.send(Heartbeat('frontend', 1, 0))
    assert isinstance(frontend.recv(5.0), EngineInfo)
    request = StepRequest('r', 1, 0, 10**18, 0, (np.zeros((2, 2, 3), np.uint8),),
                          np.zeros(0, np.float32), 'go', 1)  # fmt: skip
    frontend.send(request)
    assert core.stepping.wait(5.0)
    return frontend, stop, thread


def _beats_during(frontend, seconds: float) -> list:
    end = time.monotonic() + seconds
    got = []
    while time.monotonic() < end:
        msg = frontend.recv(0.02)
        if msg is not None:
            got.append(msg)
    return [m for m in got if isinstance(m, Heartbeat)]


def test_heartbeats_continue_while_a_long_step_runs():
    core = BlockingCore()
    frontend, stop, thread = _start(core, max_step_s=30.0)
    try:
        assert len(_beats_during(frontend, 0.5)) >= 3
        core.release.set()
        msg = frontend.recv(5.0)
        while isinstance(msg, Heartbeat | EngineStats):
            msg = frontend.recv(5.0)
        assert isinstance(msg, StepResult)
    finally:
        core.release.set()
        stop.set()
        thread.join(5)


def test_heartbeats_stop_when_a_step_hangs_past_the_limit():
    core = BlockingCore()
    frontend, stop, thread = _start(core, max_step_s=0.2)
    try:
        _beats_during(frontend, 0.4)  # the limit passes
        assert _beats_during(frontend, 0.5) == []
    finally:
        core.release.set()
        stop.set()
        thread.join(5)
