"""What robots add to SGLang's scheduling: one step in flight, freshness, deadlines.

* At most one step per robot is in flight (admitted: prefilling or decoding). A robot's
  next step waits in the queue, skipped by the prefill pass, until the previous one ends.
* Freshness: a robot's waiting step is superseded by a newer observation (larger
  ``step_seq``); the older one is dropped and counted. A step not newer than the robot's
  waiting or in-flight step is stale and refused the same way.
* Deadlines: each step may carry ``deadline_ns``. Past it, ``late_policy`` ``drop``
  aborts the step (a waiting one at once, a running one at its next result, as SGLang's
  running timeout), ``deliver_late`` lets it run on and marks it late. A step is counted
  as a deadline miss once.

These rules have one owner on the engine's side: both cores ask ``RobotRules`` (the
sequential baseline for freshness and deadlines; it runs one step at a time by
construction). Freshness and deadlines read only what ``RobotStep`` names, so a core may
pass its ``StepRequest`` as it is.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, TypeVar

if TYPE_CHECKING:
    from collections.abc import Iterable

    from vla_sched.core.scheduling.request import Req


class RobotStep(Protocol):
    """What freshness and deadlines read of a step (a ``Req``, or a core's ``StepRequest``)."""

    @property
    def robot_id(self) -> str | None: ...

    @property
    def step_seq(self) -> int: ...

    @property
    def deadline_ns(self) -> int | None: ...


StepT = TypeVar('StepT', bound=RobotStep)


class RobotRules:
    """Tracks each robot's in-flight step and applies the rules above."""

    def __init__(self, *, late_policy: str) -> None:
        self.late_policy = late_policy
        self._in_flight: dict[str, Req] = {}

    # ---- one step in flight ------------------------------------------------------------

    def is_busy(self, req: Req) -> bool:
        """Whether ``req``'s robot already has another step in flight."""
        if req.robot_id is None:
            return False
        current = self._in_flight.get(req.robot_id)
        return current is not None and current is not req

    def in_flight(self, robot_id: str) -> Req | None:
        return self._in_flight.get(robot_id)

    def start(self, req: Req) -> None:
        """``req`` was admitted.

        Raises:
            RuntimeError: its robot has another step in flight.
        """
        if req.robot_id is None:
            return
        if self.is_busy(req):
            other = self._in_flight[req.robot_id]
            raise RuntimeError(f'{req.describe()} admitted while {other.describe()} is in flight')
        self._in_flight[req.robot_id] = req

    def stop(self, req: Req) -> None:
        """``req`` finished or went back to waiting."""
        if req.robot_id is not None and self._in_flight.get(req.robot_id) is req:
            del self._in_flight[req.robot_id]

    def in_flight_steps(self) -> list[Req]:
        return list(self._in_flight.values())

    # ---- freshness ---------------------------------------------------------------------

    def superseded(self, req: StepT, waiting_queue: Iterable[StepT]) -> tuple[list[StepT], bool]:
        """Waiting steps that ``req`` supersedes, and whether ``req`` itself is stale.

        Returns:
            ``(older_waiting_steps, req_is_stale)``.
        """
        if req.robot_id is None:
            return [], False
        same_robot = [w for w in waiting_queue if w.robot_id == req.robot_id and w is not req]
        running = self._in_flight.get(req.robot_id)
        newer = [w for w in same_robot if w.step_seq >= req.step_seq]
        if newer or (running is not None and running.step_seq >= req.step_seq):
            return [], True
        return same_robot, False

    # ---- deadlines ---------------------------------------------------------------------

    @staticmethod
    def is_overdue(req: RobotStep, now_ns: int) -> bool:
        """Whether ``req``'s deadline has passed at ``now_ns`` (the engine's clock)."""
        return req.deadline_ns is not None and now_ns > req.deadline_ns

    @property
    def drops_late_steps(self) -> bool:
        return self.late_policy == 'drop'
