"""The engine's event loop: take messages, run scheduler steps, send results and heartbeats.

The same loop serves an engine in its own process (over ZMQ) and one in a thread of the
frontend (over in-process queues). What runs the steps is an ``EngineCore``
(``engine_core``).

Nothing the frontend sends ends the loop: a frame the codec refuses, or a message that is not
for the engine, is logged (at a bounded rate), counted and dropped, and the count goes out in
every ``EngineStats`` (``num_bad_frames_received``); a step whose ``submit`` raises is
answered with a ``StepFailure`` (``internal_error``) for that step.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from vla_sched.engine.bad_frames import MAX_REASON_CHARS, BadFrames
from vla_sched.ipc.channel import Channel, ChannelClosedError
from vla_sched.ipc.codec import CodecError
from vla_sched.ipc.heartbeat import HeartbeatTracker
from vla_sched.ipc.messages import (
    CloseSession,
    FailureReason,
    Heartbeat,
    StepFailure,
    StepRequest,
)

if TYPE_CHECKING:
    from vla_sched.engine.core import EngineCore

logger = logging.getLogger(__name__)


class _Pulse:
    """Sends the engine's heartbeats from a thread of their own, so a long step (a slow
    prefill on a CPU, a model load) does not read as death; a loop that has made no
    progress for ``max_step_s`` stops the beats, so a hung engine still reads as dead."""

    def __init__(
        self,
        send: Callable[[object], None],
        heartbeat: HeartbeatTracker,
        *,
        max_step_s: float,
        clock: Callable[[], float],
    ) -> None:
        self._send = send
        self._heartbeat = heartbeat
        self._max_step_s = max_step_s
        self._clock = clock
        self._progress_s = clock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name='vla_sched-pulse', daemon=True)

    def progress(self) -> None:
        self._progress_s = self._clock()

    def __enter__(self) -> _Pulse:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self._heartbeat.period_s / 2):
            now_s = self._clock()
            if now_s - self._progress_s > self._max_step_s:
                continue  # stuck: let the frontend's timeout notice
            beat = self._heartbeat.due(now_s)
            if beat is not None:
                self._send(beat)


def serve(
    channel: Channel,
    core: EngineCore,
    *,
    heartbeat: HeartbeatTracker,
    stats_period_s: float,
    stop: threading.Event,
    max_step_s: float = 30.0,
    clock: Callable[[], float] = time.monotonic,
    wall_ns: Callable[[], int] = time.time_ns,
) -> str:
    """Serve until ``stop`` is set or the frontend goes silent; returns why it ended."""
    send_lock = threading.Lock()
    bad_frames = BadFrames('the node', logger=logger, clock=clock)

    def send(msg: object) -> None:
        # If the frontend is gone or busy, its heartbeat timeout decides what happens next.
        with send_lock, contextlib.suppress(ChannelClosedError):
            channel.send(msg)

    # Handshake: the first message from the frontend proves that its sockets reach us, so
    # nothing it sends after our EngineInfo can be lost to a half-open connection.
    heartbeat.seen(clock())  # the frontend gets one timeout to say hello
    while _receive(channel, heartbeat.period_s, bad_frames) is None:
        if stop.is_set():
            return 'stopped'
        if not heartbeat.alive(clock()):
            return 'frontend_lost'
    heartbeat.seen(clock())
    send(core.info)
    with _Pulse(send, heartbeat, max_step_s=max_step_s, clock=clock) as pulse:
        return _serve_loop(channel, core, send, heartbeat=heartbeat, pulse=pulse,
                           bad_frames=bad_frames, stats_period_s=stats_period_s, stop=stop,
                           clock=clock, wall_ns=wall_ns)  # fmt: skip


def _receive(channel: Channel, timeout_s: float, bad_frames: BadFrames) -> Any | None:
    """The next message, or None: none came, or the frame that came was refused."""
    try:
        return channel.recv(timeout_s)
    except CodecError as exc:
        bad_frames.refuse(str(exc))
        return None


def _submit(core: EngineCore, request: StepRequest, now_ns: int) -> list[StepFailure]:
    """``core.submit``; a step it raises on is refused with ``internal_error``."""
    try:
        return core.submit(request, now_ns)
    except Exception as exc:
        logger.exception('step %s#%s could not be taken', request.robot_id, request.step_seq)
        detail = f'the engine could not take this step: {type(exc).__name__}: {exc}'
        return [
            StepFailure(
                request.robot_id,
                request.step_seq,
                request.stamp_ns,
                FailureReason.INTERNAL_ERROR,
                detail[:MAX_REASON_CHARS],
            )
        ]


def _serve_loop(
    channel: Channel,
    core: EngineCore,
    send: Callable[[object], None],
    *,
    heartbeat: HeartbeatTracker,
    pulse: _Pulse,
    bad_frames: BadFrames,
    stats_period_s: float,
    stop: threading.Event,
    clock: Callable[[], float],
    wall_ns: Callable[[], int],
) -> str:
    next_stats_s = clock()
    while not stop.is_set():
        pulse.progress()
        now_s = clock()
        if now_s >= next_stats_s:
            stats = core.stats(wall_ns())
            send(dataclasses.replace(stats, num_bad_frames_received=bad_frames.num_refused))
            next_stats_s = now_s + stats_period_s
        wait_s = 0.0 if core.has_work() else min(heartbeat.period_s, next_stats_s - now_s)
        msg = _receive(channel, max(0.0, wait_s), bad_frames)
        while msg is not None:
            heartbeat.seen(clock())
            if isinstance(msg, StepRequest):
                for failure in _submit(core, msg, wall_ns()):
                    send(failure)
            elif isinstance(msg, CloseSession):
                core.close_session(msg.robot_id)
            elif not isinstance(msg, Heartbeat):
                bad_frames.refuse(f'a {type(msg).__name__} is not a message for the engine')
            msg = _receive(channel, 0.0, bad_frames)
        # Judged after draining the inbox: a long step must not hide the frontend's beats.
        if not heartbeat.alive(clock()):
            return 'frontend_lost'
        if core.has_work():
            for out in core.step(wall_ns()):
                send(out)
    return 'stopped'
