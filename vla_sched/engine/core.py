"""What the message server needs of an engine core (``ScheduledCore``, ``SequentialCore``).

The server (``message_server.serve``) drives a core from one thread::

    send(core.info)                                  # once, after the handshake
    loop:
        every stats period: send(core.stats(now_ns))
        for each message: core.submit(request, now_ns) -> send each failure
                          core.close_session(robot_id)
        if core.has_work(): send each of core.step(now_ns)
    core.close()                                     # by whoever built the core

``now_ns`` is the server's wall clock (``time.time_ns()`` unless it is given another), the
clock of the messages' stamps and deadlines. ``step`` is called only while ``has_work``.
Everything a core returns is sent to the frontend as it is.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from vla_sched.ipc.messages import (
        EngineInfo,
        EngineStats,
        StepFailure,
        StepRequest,
        StepResult,
    )


class EngineCore(Protocol):
    """Runs control steps for the message server (see the module docstring)."""

    @property
    def info(self) -> EngineInfo: ...

    def submit(self, request: StepRequest, now_ns: int) -> list[StepFailure]:
        """Accept a step, or refuse it at once (bad input, superseded, unknown robot)."""
        ...

    def close_session(self, robot_id: str) -> None: ...

    def has_work(self) -> bool: ...

    def step(self, now_ns: int) -> list[StepResult | StepFailure]:
        """Run one scheduler iteration; return the steps that ended in it."""
        ...

    def stats(self, now_ns: int) -> EngineStats: ...

    def close(self) -> None: ...
