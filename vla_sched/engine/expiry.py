"""Timeouts and deadlines, checked at the top of every scheduling step.

SGLang's waiting timeout (since the last queue entry) and running timeout (since the
first admission) abort a request; both are off by default. A robot step past its
deadline is counted as a miss once and, with ``late_policy='drop'``, aborted: a waiting
step leaves the queue at once, an admitted one finishes at its next result (a chunked one
at the next step). With ``deliver_late`` it runs on, marked late.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vla_sched.engine.request import AbortReason, FinishReason
from vla_sched.engine.scheduler_config import ms_to_ns

if TYPE_CHECKING:
    from vla_sched.engine.request import Req
    from vla_sched.engine.scheduler import Scheduler


def expire_requests(s: Scheduler, now: int) -> None:
    """Abort or mark the requests whose time is up."""
    waiting_timeout = ms_to_ns(s.config.waiting_timeout_ms)
    running_timeout = ms_to_ns(s.config.running_timeout_ms)
    for req in list(s.waiting_queue):
        entry = req.times.wait_queue_entry_ns
        if waiting_timeout is not None and now - entry > waiting_timeout:
            text = f'{req.describe()} waited more than {s.config.waiting_timeout_ms} ms'
            s.abort_req(req, FinishReason.aborted(AbortReason.WAITING_TIMEOUT, text))
        elif _past_deadline(s, req, now) and s.robots.drops_late_steps:
            s.abort_req(req, deadline_reason(req, now))
    for req in s.admitted_reqs():
        admitted = req.times.admitted_ns
        if running_timeout is not None and now - admitted > running_timeout:
            text = f'{req.describe()} ran more than {s.config.running_timeout_ms} ms'
            s.abort_req(req, FinishReason.aborted(AbortReason.RUNNING_TIMEOUT, text))
        elif _past_deadline(s, req, now) and s.robots.drops_late_steps:
            s.abort_req(req, deadline_reason(req, now))


def _past_deadline(s: Scheduler, req: Req, now: int) -> bool:
    if not s.robots.is_overdue(req, now):
        return False
    s.count_deadline_miss(req)
    return True


def deadline_reason(req: Req, now: int) -> FinishReason:
    late_ms = (now - req.deadline_ns) / 1e6
    text = f'{req.describe()} is {late_ms:.3f} ms past its deadline'
    return FinishReason.aborted(AbortReason.DEADLINE_MISSED, text)
