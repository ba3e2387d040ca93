"""Timeouts and deadlines, checked at the top of every scheduling step.

SGLang's waiting timeout (since the last queue entry) and running timeout (since the
first admission) abort a request; both are off by default. A robot step past its
deadline is counted as a miss once and, with ``late_policy='drop'``, aborted: a waiting
step leaves the queue at once, an admitted one finishes at its next result (a chunked one
at the next step). With ``deliver_late`` it runs on, marked late.

Not in SGLang: with ``drop_unmeetable_steps``, a waiting step whose deadline comes before
``now`` plus the median service time (admission to finish) of recent completed steps is
dropped as a deadline miss before it is admitted, unless nothing else runs (so a stale
estimate cannot starve a robot). Under overload this keeps the compute for steps that
can still be on time; without it every step runs until its deadline passes one or two
tokens short of done, and no robot gets an action at all.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from vla_sched.core.scheduling.request import AbortReason, FinishReason
from vla_sched.core.scheduling.scheduler_config import ms_to_ns

MIN_SERVICE_SAMPLES = 8  # completed steps before service times are trusted

if TYPE_CHECKING:
    from vla_sched.core.scheduling.metrics import SchedulerMetrics
    from vla_sched.core.scheduling.request import Req
    from vla_sched.core.scheduling.robot_rules import RobotRules
    from vla_sched.core.scheduling.scheduler_config import SchedulerConfig


class ExpiryHost(Protocol):
    """The scheduler as seen by the expiry check, which rebinds none of these attributes:
    it aborts requests and counts misses only through the three methods."""

    config: SchedulerConfig
    metrics: SchedulerMetrics
    robots: RobotRules
    waiting_queue: list[Req]

    def admitted_reqs(self) -> list[Req]: ...

    def abort_req(self, req: Req, reason: FinishReason) -> None: ...

    def count_deadline_miss(self, req: Req) -> None: ...


def expire_requests(s: ExpiryHost, now: int) -> None:
    """Abort or mark the requests whose time is up."""
    waiting_timeout = ms_to_ns(s.config.waiting_timeout_ms)
    running_timeout = ms_to_ns(s.config.running_timeout_ms)
    others_admitted = bool(s.admitted_reqs())
    for req in list(s.waiting_queue):
        entry = req.times.wait_queue_entry_ns
        if waiting_timeout is not None and now - entry > waiting_timeout:
            text = f'{req.describe()} waited more than {s.config.waiting_timeout_ms} ms'
            s.abort_req(req, FinishReason.aborted(AbortReason.WAITING_TIMEOUT, text))
        elif _past_deadline(s, req, now) and s.robots.drops_late_steps:
            s.abort_req(req, deadline_reason(req, now))
        elif others_admitted and (reason := _unmeetable(s, req, now)) is not None:
            s.count_deadline_miss(req)
            s.abort_req(req, reason)
    for req in s.admitted_reqs():
        admitted = req.times.admitted_ns
        if running_timeout is not None and now - admitted > running_timeout:
            text = f'{req.describe()} ran more than {s.config.running_timeout_ms} ms'
            s.abort_req(req, FinishReason.aborted(AbortReason.RUNNING_TIMEOUT, text))
        elif _past_deadline(s, req, now) and s.robots.drops_late_steps:
            s.abort_req(req, deadline_reason(req, now))


def _past_deadline(s: ExpiryHost, req: Req, now: int) -> bool:
    if not s.robots.is_overdue(req, now):
        return False
    s.count_deadline_miss(req)
    return True


def _unmeetable(s: ExpiryHost, req: Req, now: int) -> FinishReason | None:
    """The abort reason if ``req`` would finish after its deadline, judged by the median
    service time of recent steps; None when it may make it (or nothing is known yet).

    Only asked while other steps hold the engine: a step that would run alone is always
    tried, so a stale estimate cannot starve a robot and fresh samples keep coming.
    """
    if not (s.config.drop_unmeetable_steps and s.robots.drops_late_steps):
        return None
    if req.deadline_ns is None or len(s.metrics.admitted_to_finish) < MIN_SERVICE_SAMPLES:
        return None
    service_ms = s.metrics.admitted_to_finish.percentile_ms(50)
    left_ms = (req.deadline_ns - now) / 1e6
    if left_ms >= service_ms:
        return None
    text = (
        f'{req.describe()} cannot meet its deadline: {left_ms:.1f} ms left, '
        f'steps take {service_ms:.1f} ms (median)'
    )
    return FinishReason.aborted(AbortReason.DEADLINE_MISSED, text)


def deadline_reason(req: Req, now: int) -> FinishReason:
    late_ms = (now - req.deadline_ns) / 1e6
    text = f'{req.describe()} is {late_ms:.3f} ms past its deadline'
    return FinishReason.aborted(AbortReason.DEADLINE_MISSED, text)
