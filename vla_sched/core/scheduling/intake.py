"""Checks a request passes before it may wait: lengths, priority, the queue limit.

Lengths follow SGLang's worker limits::

    max_req_len       = min(max_context_len - 1, pool_tokens - 1)
    max_req_input_len = max_req_len - 5
    max_new_tokens   <= min(max_req_len - input_len - 1,
                            pool_tokens - ceil_P(input_len) - P - 1)

Differences from SGLang, on purpose: SGLang clamps ``max_new_tokens`` to that bound; a
robot's step needs all of its H*D action tokens, so a step that can never get them is
aborted instead (``max_new_tokens_unfit``). A priority given while priority scheduling
is off aborts the request by default (``abort_on_priority_when_disabled``), so a robot
configured for priority is never silently served without it. A prefill-only request runs
whole in one pass, so its prompt must fit one chunk (``chunked_prefill_size``).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

from vla_sched.core.memory.kv_errors import SessionError
from vla_sched.core.memory.pages import round_up_to_page
from vla_sched.core.scheduling.request import AbortReason, FinishReason

if TYPE_CHECKING:
    from vla_sched.core.memory.kv_memory import KVMemory
    from vla_sched.core.scheduling.request import Req
    from vla_sched.core.scheduling.scheduler_config import SchedulerConfig


@dataclass(frozen=True, slots=True)
class RequestLimits:
    """Length limits derived from the KV memory's sizes."""

    max_req_len: int
    max_req_input_len: int
    pool_tokens: int
    page_size: int

    @classmethod
    def of(cls, memory: KVMemory) -> RequestLimits:
        pool_tokens = memory.config.num_tokens
        max_req_len = min(memory.config.max_context_len - 1, pool_tokens - 1)
        return cls(max_req_len, max_req_len - 5, pool_tokens, memory.page_size)

    def max_new_tokens_bound(self, input_len: int) -> int:
        p = self.page_size
        ceil_input = round_up_to_page(input_len, p)
        return min(self.max_req_len - input_len - 1, self.pool_tokens - ceil_input - p - 1)


def validate_new_request(
    req: Req, *, config: SchedulerConfig, limits: RequestLimits
) -> FinishReason | None:
    """The abort reason of a request that must not wait, else None.

    Also gives the request its priority (its robot's, else the least important one) when
    priority scheduling is on.
    """
    input_len = len(req.origin_input_ids)
    if input_len >= limits.max_req_input_len:
        return FinishReason.aborted(
            AbortReason.PROMPT_TOO_LONG,
            f'{req.describe()} has {input_len} prompt tokens; at most '
            f'{limits.max_req_input_len - 1} fit the context and the KV pool',
        )
    chunk = config.chunked_prefill_size
    pass_len = round_up_to_page(input_len, limits.page_size)
    if req.whole_prompt and chunk is not None and pass_len > chunk:
        return FinishReason.aborted(
            AbortReason.PROMPT_TOO_LONG,
            f'{req.describe()} attends both ways over its {input_len} prompt tokens; it runs '
            f'whole in one pass, and a pass holds at most {chunk} (chunked_prefill_size)',
        )
    bound = limits.max_new_tokens_bound(input_len)
    if req.max_new_tokens > bound:
        return FinishReason.aborted(
            AbortReason.MAX_NEW_TOKENS_UNFIT,
            f'{req.describe()} asks for {req.max_new_tokens} new tokens; with its '
            f'{input_len} prompt tokens at most {max(bound, 0)} can ever fit',
        )
    if config.enable_priority_scheduling:
        if req.priority is None:
            robot_priority = config.robot_priority(req.robot_id)
            req.priority = (
                robot_priority if robot_priority is not None else least_important(config)
            )
    elif req.priority is not None and config.abort_on_priority_when_disabled:
        return FinishReason.aborted(
            AbortReason.PRIORITY_DISABLED,
            f'{req.describe()} carries priority {req.priority} but priority scheduling is off',
        )
    return None


def least_important(config: SchedulerConfig) -> int:
    return sys.maxsize if config.schedule_low_priority_values_first else -sys.maxsize - 1


def queue_limit_victim(req: Req, waiting_queue: list[Req], config: SchedulerConfig) -> Req | None:
    """Who leaves when ``req`` joins a full queue: ``req`` itself, a waiting request, or
    nobody (room left).

    With priority scheduling the least preferred waiting request (least important, newest
    on ties) leaves instead of ``req`` if ``req`` is strictly more important.
    """
    limit = config.max_queued_requests
    if limit is None or len(waiting_queue) + 1 <= limit:
        return None
    if not config.enable_priority_scheduling or not waiting_queue:
        return req
    direction = config.priority_sign
    candidate = max(
        waiting_queue,
        key=lambda r: (direction * r.priority, r.times.wait_queue_entry_ns or 0),
    )
    if direction * req.priority < direction * candidate.priority:
        return candidate
    return req


def begin_session_step(memory: KVMemory, req: Req, now_ns: int) -> FinishReason | None:
    """Bind ``req`` to its robot's open session; the abort reason if that fails."""
    if req.session_id not in memory.sessions:
        return FinishReason.aborted(
            AbortReason.UNKNOWN_SESSION,
            f'{req.describe()} names session {req.session_id!r}, which is not open',
        )
    try:
        memory.sessions.begin_step(req.session_id, req.kv, now_ns=now_ns)
    except SessionError as exc:
        return FinishReason.aborted(AbortReason.SESSION_MISMATCH, f'{req.describe()}: {exc}')
    return None
