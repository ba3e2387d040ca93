"""What the engine sends, received as it arrives by a thread of its own.

``EngineInbox`` blocks on the frontend's end of the channel, so nobody has to poll it: each
message for the frontend is queued and ``on_arrival`` is called (from the inbox's thread)
once a burst of them has been received, e.g. to wake an executor, which then ``take``s
them. The inbox also records the engine's signs of life in the heartbeat tracker (a
heartbeat alone wakes nobody) and refuses what the frontend cannot use: a frame the codec
rejects, or a message meant for the engine, is counted in ``bad_frames`` and dropped.

While nothing arrives the thread wakes every ``wait_s`` only to see whether it should stop
or whether the engine has ended (``engine_ended``); an ended engine is reported through
``on_arrival`` too, and the thread ends with it. One inbox serves one engine: ``close``
stops and joins its thread, after which the channel may be closed; queued messages die with
the inbox, so nothing of an engine reaches the frontend after its restart.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from vla_sched.engine.bad_frames import BadFrames
from vla_sched.ipc.channel import Channel, ChannelClosedError
from vla_sched.ipc.codec import CodecError
from vla_sched.ipc.heartbeat import HeartbeatTracker
from vla_sched.ipc.messages import EngineInfo, EngineStats, Heartbeat, StepFailure, StepResult

logger = logging.getLogger(__name__)
# What an engine sends that the frontend uses; heartbeats only count as signs of life.
FROM_ENGINE = EngineInfo | StepResult | StepFailure | EngineStats
JOIN_TIMEOUT_S = 10.0  # far beyond one ``wait_s``: only a thread stuck in ``on_arrival``
MAX_BURST = 64  # messages queued before the consumer is woken even if more are coming


class EngineInbox:
    """The receiving thread of one engine connection (see the module docstring)."""

    def __init__(
        self,
        channel: Channel,
        *,
        heartbeat: HeartbeatTracker,
        bad_frames: BadFrames,
        engine_ended: Callable[[], bool],
        on_arrival: Callable[[], Any],
        wait_s: float,
        clock: Callable[[], float] = time.monotonic,
        name: str = 'vla_sched-engine-inbox',
    ) -> None:
        if not wait_s > 0:
            raise ValueError(f'wait_s must be > 0, got {wait_s}')
        self._channel = channel
        self._heartbeat = heartbeat
        self._bad_frames = bad_frames
        self._engine_ended = engine_ended
        self._on_arrival = on_arrival
        self._wait_s = wait_s
        self._clock = clock
        self._messages: queue.SimpleQueue = queue.SimpleQueue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def take(self, timeout_s: float = 0.0) -> list[Any]:
        """Every queued message, in arrival order; waits up to ``timeout_s`` for the first."""
        out: list[Any] = []
        try:
            if timeout_s > 0:
                out.append(self._messages.get(timeout=timeout_s))
            while True:
                out.append(self._messages.get_nowait())
        except queue.Empty:
            return out

    def close(self) -> None:
        """Stop the thread and wait for it (at most about ``wait_s``); its channel is then
        free to close."""
        self._stop.set()
        if self._thread is threading.current_thread():
            return  # closed from ``on_arrival``: the loop ends when it returns
        self._thread.join(JOIN_TIMEOUT_S)
        if self._thread.is_alive():
            logger.error('the engine inbox thread did not stop within %.0f s', JOIN_TIMEOUT_S)

    def _run(self) -> None:
        num_unannounced = 0
        while not self._stop.is_set():
            try:
                # Once something is queued, only what is already there is taken before the
                # wake-up, so a burst wakes the consumer once.
                msg = self._channel.recv(0.0 if num_unannounced else self._wait_s)
            except CodecError as exc:
                self._bad_frames.refuse(str(exc))
                continue
            except ChannelClosedError:
                break
            if msg is not None:
                num_unannounced += self._sort(msg)
                if num_unannounced < MAX_BURST:
                    continue
            if num_unannounced:
                num_unannounced = 0
                self._on_arrival()
            elif self._engine_ended():
                self._on_arrival()
                break

    def _sort(self, msg: Any) -> int:
        """Queue ``msg`` if it is for the frontend (1), else count or refuse it (0)."""
        if isinstance(msg, FROM_ENGINE | Heartbeat):
            self._heartbeat.seen(self._clock())
        if isinstance(msg, FROM_ENGINE):
            self._messages.put(msg)
            return 1
        if not isinstance(msg, Heartbeat):
            self._bad_frames.refuse(f'a {type(msg).__name__} is not a message for the node')
        return 0
