"""Integrity check of the scheduler's containers on top of the KV memory's own check.

* Every live request is in exactly one place: the waiting queue (holding no KV), or
  admitted (holding KV) as the chunked request, a running row or a row of the last
  prefill batch. A live request is unfinished; waiting requests have no extend range.
* At most one chunked request, never in the running batch.
* Each robot has at most one admitted step, and it is the one the robot rules track.
* KV memory: pools, tree, locks, rows and sessions agree with the live requests.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Protocol

from vla_sched.core.memory.kv_errors import IntegrityError

if TYPE_CHECKING:
    from vla_sched.core.memory.kv_memory import KVMemory
    from vla_sched.core.scheduling.request import Req
    from vla_sched.core.scheduling.robot_rules import RobotRules
    from vla_sched.core.scheduling.schedule_batch import ScheduleBatch


class IntegrityHost(Protocol):
    """The scheduler as seen by the integrity check, which only reads it."""

    memory: KVMemory
    robots: RobotRules
    waiting_queue: list[Req]
    running_batch: ScheduleBatch
    chunked_req: Req | None
    last_batch: ScheduleBatch | None

    def live_reqs(self) -> list[Req]: ...


def check_scheduler_integrity(s: IntegrityHost) -> None:
    """Raise ``IntegrityError`` at the first inconsistency (see the module docstring)."""
    live = s.live_reqs()
    s.memory.check_integrity([r.kv for r in live])
    waiting_ids = _check_waiting(s, {r.rid: r for r in live})
    placed = _admitted_places(s)
    for req in live:
        if req.finished:
            raise IntegrityError(f'{req.describe()} is live but finished')
        if id(req) in waiting_ids:
            continue
        if not req.kv.holds_memory:
            raise IntegrityError(f'{req.describe()} is live, not waiting and holds no KV')
        if placed[id(req)] != 1:
            raise IntegrityError(
                f'{req.describe()} holds KV but is in {placed[id(req)]} of running batch, '
                f'last prefill batch and chunked request'
            )
    live_ids = {id(r) for r in live}
    for req in s.running_batch.reqs:
        if not req.finished and id(req) not in live_ids:
            raise IntegrityError(f'{req.describe()} runs but is not live')
    _check_robots(s, live)


def _check_waiting(s: IntegrityHost, live_by_rid: dict[str, Req]) -> set[int]:
    ids = Counter(id(r) for r in s.waiting_queue)
    for req in s.waiting_queue:
        if ids[id(req)] > 1:
            raise IntegrityError(f'{req.describe()} is in the waiting queue twice')
        if req.finished or req.kv.holds_memory:
            raise IntegrityError(f'{req.describe()} waits but is finished or holds KV')
        if live_by_rid.get(req.rid) is not req:
            raise IntegrityError(f'{req.describe()} waits but is not live')
    return set(ids)


def _admitted_places(s: IntegrityHost) -> Counter[int]:
    places: Counter[int] = Counter()
    chunked = s.chunked_req
    running = [r for r in s.running_batch.reqs if not r.finished]
    if chunked is not None:
        places[id(chunked)] += 1
        if any(r is chunked for r in running):
            raise IntegrityError(f'chunked {chunked.describe()} is also in the running batch')
    for req in running:
        places[id(req)] += 1
    last = s.last_batch
    if last is not None and last.is_extend and last is not s.running_batch:
        for req in last.reqs:
            if not req.finished and req is not chunked:
                places[id(req)] += 1
    return places


def _check_robots(s: IntegrityHost, live: list[Req]) -> None:
    admitted: dict[str, Req] = {}
    for req in live:
        if req.robot_id is None or not req.kv.holds_memory:
            continue
        other = admitted.setdefault(req.robot_id, req)
        if other is not req:
            raise IntegrityError(
                f'robot {req.robot_id!r} has two steps in flight: {other.rid!r} and {req.rid!r}'
            )
    for robot_id, req in admitted.items():
        if s.robots.in_flight(robot_id) is not req:
            raise IntegrityError(f'robot {robot_id!r}: in-flight step {req.rid!r} is not tracked')
    for req in s.robots.in_flight_steps():
        if admitted.get(req.robot_id) is not req:
            raise IntegrityError(f'{req.describe()} is tracked in flight but is not admitted')
