"""The node's view of the engine: starting, ready, dead, restarting, with a clock passed in.

``EngineLink`` wraps an ``EngineClient`` with the life cycle the node needs. An engine is
ready once its ``EngineInfo`` came and its heartbeats keep coming; it is dead when they stop
(or it was not ready within ``start_timeout_s``), and a dead engine is restarted after a
delay; so is one that failed while starting. ``poll`` reports each death once, so the node
can end the steps that were in flight and never publish their results.

Restarts back off: the k-th restart in a row waits ``restart_delay_s * 2**(k - 1)``, at most
``restart_max_delay_s`` (``restart_delay``); an engine that stayed ready for
``restart_max_delay_s`` ends the row, so its next death waits ``restart_delay_s`` again
(``restart_attempt``). An engine that can never load is then started a few times a minute,
not every second.

Steps go to the engine with their deadline and receipt time on the engine's wall clock
(``engine_clock``), whatever the ROS clock says.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from vla_sched.engine.config import EngineLinkConfig
from vla_sched.ipc.messages import EngineInfo, EngineStats, StepRequest

STARTING = 'starting'
READY = 'ready'
DEAD = 'dead'


def engine_clock(step: StepRequest, *, now_ns: int) -> StepRequest:
    """``step`` with its deadline and receipt time on the engine's clock (wall time).

    The node's clock is the ROS clock, which runs on simulated time under use_sim_time;
    the engine judges deadlines by wall time. The time left stays what it is on the ROS
    clock. The stamp is the robot's and travels unchanged.
    """
    offset = time.time_ns() - now_ns
    return dataclasses.replace(
        step, deadline_ns=step.deadline_ns + offset, received_ns=step.received_ns + offset
    )


def restart_attempt(previous_attempt: int, ready_s: float, *, stable_s: float) -> int:
    """The number in its row of the restart after a death (1: the first of a new row).

    ``previous_attempt`` is the number of the restart that started the engine that died (0:
    none yet), ``ready_s`` how long that engine was ready (0 if never); one ready for
    ``stable_s`` or more starts a new row.
    """
    return 1 if ready_s >= stable_s else previous_attempt + 1


def restart_delay(attempt: int, *, first_s: float, max_s: float) -> float:
    """Seconds to wait before restart ``attempt`` of a row: ``first_s`` doubled for each
    attempt after the first, capped at ``max_s``."""
    doublings = min(max(attempt - 1, 0), 64)  # 2**64 * first_s is past any cap
    return min(max_s, first_s * 2.0**doublings)


class EngineClientLike(Protocol):
    """The part of ``vla_sched.engine.client.EngineClient`` the link and the node
    use. ``on_arrival`` is called (from any thread) when ``poll`` has messages to return or
    the engine has ended; nothing needs to poll in between."""

    info: EngineInfo | None
    on_arrival: Callable[[], object]

    def start(self) -> None: ...
    def restart(self) -> None: ...
    def close(self) -> None: ...
    def send(self, msg: Any) -> None: ...
    def poll(self, timeout_s: float = 0.0) -> list[Any]: ...

    @property
    def alive(self) -> bool: ...
    @property
    def heartbeat_age_s(self) -> float: ...
    @property
    def pid(self) -> int | None: ...
    @property
    def failure(self) -> str: ...
    @property
    def num_bad_frames(self) -> int: ...


@dataclass(frozen=True, slots=True)
class EngineView:
    """The engine as /diagnostics reports it."""

    state: str  # starting, ready or dead
    mode: str
    pid: int | None
    model_name: str
    random_weights: bool
    prompt_layout: str
    heartbeat_age_s: float
    state_age_s: float  # seconds in the current state
    num_restarts: int
    restart_attempt: int  # the restart's number in its row of restarts (0: none in a row)
    since_restart_s: float  # seconds since the last restart; NaN if it never restarted
    uptime_s: float  # seconds since it became ready; NaN unless it is ready
    last_error: str
    restart_in_s: float | None  # for a dead engine: seconds until the next start
    stats: EngineStats | None
    stats_age_s: float
    num_bad_frames: int = 0  # frames from the engine the node refused, over every engine


@dataclass(frozen=True, slots=True)
class LinkPoll:
    """What one poll brought: engine messages, and whether the engine just died."""

    messages: list[Any]
    died: str  # why the engine was declared dead in this poll, or ''


class EngineLink:
    """Life cycle of the engine connection (see the module docstring)."""

    def __init__(
        self,
        client: EngineClientLike,
        config: EngineLinkConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.config = config
        self._clock = clock
        self.state = STARTING
        self._state_since_s = clock()
        self.num_restarts = 0
        self.restart_attempt = 0
        self.restart_delay_s = config.restart_delay_s  # before the next restart once dead
        self._restarted_at_s = float('nan')
        self.last_error = ''
        self.stats: EngineStats | None = None
        self._stats_at_s = float('-inf')

    @property
    def ready(self) -> bool:
        return self.state == READY

    @property
    def info(self) -> EngineInfo | None:
        return self.client.info if self.state == READY else None

    def start(self) -> None:
        self.client.start()
        self._enter(STARTING)

    def close(self) -> None:
        self.client.close()

    def send(self, msg: Any) -> None:
        """Send to a ready engine; raises ``EngineUnavailable`` (from the client) otherwise."""
        self.client.send(msg)

    def poll(self) -> LinkPoll:
        """Collect messages, update the state, restart a dead engine when its delay is over."""
        now = self._clock()
        messages = [] if self.state == DEAD else self.client.poll(0.0)
        for msg in messages:
            if isinstance(msg, EngineStats):
                self.stats = msg
                self._stats_at_s = now
        died = ''
        if self.state == STARTING:
            if self.client.info is not None and self.client.alive:
                self._enter(READY)
            elif self.client.failure:
                died = f'failed to start: {self.client.failure}'
            elif now - self._state_since_s > self.config.start_timeout_s:
                died = f'not ready {self.config.start_timeout_s:.0f} s after start'
        elif self.state == READY and not self.client.alive:
            died = self.client.failure or f'no heartbeat for {self.client.heartbeat_age_s:.2f} s'
        elif self.state == DEAD and now - self._state_since_s >= self.restart_delay_s:
            self.num_restarts += 1
            self._restarted_at_s = now
            self.client.restart()
            self._enter(STARTING)
        elif self.state == READY and now - self._state_since_s >= self._stable_s:
            self.restart_attempt = 0  # the row of restarts is over
        if died:
            ready_s = now - self._state_since_s if self.state == READY else 0.0
            self.restart_attempt = restart_attempt(
                self.restart_attempt, ready_s, stable_s=self._stable_s
            )
            self.restart_delay_s = restart_delay(
                self.restart_attempt,
                first_s=self.config.restart_delay_s,
                max_s=self.config.restart_max_delay_s,
            )
            self.last_error = died
            self.stats = None
            self._enter(DEAD)
            messages = [m for m in messages if isinstance(m, EngineStats | EngineInfo)]
        return LinkPoll(messages=messages, died=died)

    def view(self) -> EngineView:
        now = self._clock()
        info = self.client.info
        restart_in = None
        if self.state == DEAD:
            restart_in = max(0.0, self._state_since_s + self.restart_delay_s - now)
        return EngineView(
            state=self.state,
            mode=self.config.mode,
            pid=self.client.pid,
            model_name=info.model_name if info is not None else '',
            random_weights=bool(info.random_weights) if info is not None else False,
            prompt_layout=info.prompt_layout if info is not None else '',
            heartbeat_age_s=self.client.heartbeat_age_s,
            state_age_s=now - self._state_since_s,
            num_restarts=self.num_restarts,
            restart_attempt=self.restart_attempt,
            since_restart_s=now - self._restarted_at_s,
            uptime_s=now - self._state_since_s if self.state == READY else float('nan'),
            last_error=self.last_error,
            restart_in_s=restart_in,
            stats=self.stats,
            stats_age_s=now - self._stats_at_s,
            num_bad_frames=self.client.num_bad_frames,
        )

    @property
    def _stable_s(self) -> float:
        """How long an engine must stay ready to end a row of restarts."""
        return self.config.restart_max_delay_s

    def _enter(self, state: str) -> None:
        self.state = state
        self._state_since_s = self._clock()
