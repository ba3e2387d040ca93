"""The node's view of the engine: starting, ready, dead, restarting, with a clock passed in.

``EngineLink`` wraps an ``EngineClient`` with the life cycle the node needs. An engine is
ready once its ``EngineInfo`` came and its heartbeats keep coming; it is dead when they stop
(or it was not ready within ``start_timeout_s``), and a dead engine is restarted after
``restart_delay_s``; so is one that failed while starting. ``poll`` reports each death once,
so the node can end the steps that were in flight and never publish their results.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from vla_sched.ipc.messages import EngineInfo, EngineStats
from vla_sched.serving.engine_config import EngineLinkConfig

STARTING = 'starting'
READY = 'ready'
DEAD = 'dead'


class EngineClientLike(Protocol):
    """The part of ``vla_sched.serving.engine_client.EngineClient`` the link uses."""

    info: EngineInfo | None

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
    since_restart_s: float  # seconds since the last restart; NaN if it never restarted
    uptime_s: float  # seconds since it became ready; NaN unless it is ready
    last_error: str
    restart_in_s: float | None  # for a dead engine: seconds until the next start
    stats: EngineStats | None
    stats_age_s: float


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
        elif self.state == DEAD and now - self._state_since_s >= self.config.restart_delay_s:
            self.num_restarts += 1
            self._restarted_at_s = now
            self.client.restart()
            self._enter(STARTING)
        if died:
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
            restart_in = max(0.0, self._state_since_s + self.config.restart_delay_s - now)
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
            since_restart_s=now - self._restarted_at_s,
            uptime_s=now - self._state_since_s if self.state == READY else float('nan'),
            last_error=self.last_error,
            restart_in_s=restart_in,
            stats=self.stats,
            stats_age_s=now - self._stats_at_s,
        )

    def _enter(self, state: str) -> None:
        self.state = state
        self._state_since_s = self._clock()
