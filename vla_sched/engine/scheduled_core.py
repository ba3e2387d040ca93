"""The engine core that batches every robot's steps: scheduler + paged KV + model runner.

It serves whatever ``assembly.assemble_core`` built, through the checkpoint family's
``ServedModel``: a well-formed ``StepRequest`` becomes a scheduler ``Req`` (``translate``),
the robot's session is opened on its first step and its prefix swapped when the
instruction version changes (for a family whose steps continue a session), each ``step``
runs one scheduler iteration, and requests that end become ``StepResult`` (the family's
``actions_of``) or ``StepFailure`` (the abort reason mapped to the frontend's reasons). A
prefill-only request's result has the pass as ``prefill_ms`` and ``decode_ms`` 0.
"""

from __future__ import annotations

import logging

from vla_sched.core.scheduling.request import AbortReason, Req
from vla_sched.engine.assembly import CoreParts, assemble_core
from vla_sched.engine.config import EngineConfig
from vla_sched.engine.core_stats import engine_stats
from vla_sched.engine.step_checks import InstructionTokenLimit, refuse_malformed
from vla_sched.ipc.messages import (
    EngineInfo,
    EngineStats,
    FailureReason,
    StepFailure,
    StepRequest,
    StepResult,
)

logger = logging.getLogger(__name__)

# Scheduler abort reasons as the frontend reports them; the rest are internal errors.
FAILURE_OF_ABORT = {
    AbortReason.OUT_OF_MEMORY: FailureReason.KV_POOL_FULL,
    AbortReason.SUPERSEDED: FailureReason.SUPERSEDED,
    AbortReason.DEADLINE_MISSED: FailureReason.DEADLINE_MISSED,
    AbortReason.WAITING_TIMEOUT: FailureReason.DEADLINE_MISSED,
    AbortReason.RUNNING_TIMEOUT: FailureReason.DEADLINE_MISSED,
    AbortReason.PROMPT_TOO_LONG: FailureReason.INVALID_INSTRUCTION,
    AbortReason.MAX_NEW_TOKENS_UNFIT: FailureReason.KV_POOL_FULL,
    AbortReason.QUEUE_FULL: FailureReason.QUEUE_FULL,
    AbortReason.PREEMPTED_BY_PRIORITY: FailureReason.QUEUE_FULL,
    AbortReason.CLIENT: FailureReason.CANCELLED,
    AbortReason.SESSION_CLOSED: FailureReason.CANCELLED,
}


class ScheduledCore:
    """Serves every robot's steps through one ``Scheduler`` (see the module docstring).

    Args:
        parts: what it serves with (``assembly.assemble_core``).
    """

    def __init__(self, parts: CoreParts) -> None:
        self.config = parts.config
        self.served = parts.served
        self.memory = parts.memory
        self.scheduler = parts.build_scheduler()
        self._info = parts.info
        self._token_limit = InstructionTokenLimit(
            parts.config.max_instruction_tokens, parts.served.instruction_tokens
        )

    @classmethod
    def from_config(cls, config: EngineConfig) -> ScheduledCore:
        """The core of ``config.model_path`` (checked first; empty: the built-in tiny
        checkpoint)."""
        return cls(assemble_core(config))

    @property
    def info(self) -> EngineInfo:
        return self._info

    # ---- steps -------------------------------------------------------------------------

    def submit(self, request: StepRequest, now_ns: int) -> list[StepFailure]:
        refused = refuse_malformed(
            request, self._info, self.scheduler.metrics, token_limit=self._token_limit
        )
        if refused:
            return refused
        step = self.served.translate(request)
        if step.session_prefix is not None:
            self.scheduler.open_or_update_session(
                request.robot_id, step.session_prefix, instruction_version=step.instruction_version
            )
        reason = self.scheduler.add_request(step.req)
        if reason is None:
            return []
        return [self._failure(step.req)]

    def close_session(self, robot_id: str) -> None:
        self.scheduler.close_session(robot_id)

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    def step(self, now_ns: int) -> list[StepResult | StepFailure]:
        out: list[StepResult | StepFailure] = []
        for req in self.scheduler.run_once():
            if req.finished_reason is not None and not req.finished_reason.is_abort:
                out.append(self._result(req))
            else:
                out.append(self._failure(req))
        return out

    def _result(self, req: Req) -> StepResult:
        times = req.times
        received = times.received_ns if times.received_ns is not None else times.arrival_ns
        admitted = times.admitted_ns or received
        first = times.first_token_ns or admitted
        last = times.finished_ns or times.last_token_ns or first
        if req.prefill_only:  # the chunk of the step's one pass, nothing decoded
            last = first
        actions = self.served.actions_of(req)
        return StepResult(
            robot_id=req.robot_id,
            step_seq=req.step_seq,
            stamp_ns=req.stamp_ns,
            actions=actions,
            queue_ms=(admitted - received) / 1e6,
            prefill_ms=(first - admitted) / 1e6,
            decode_ms=(last - first) / 1e6,
            late=req.late,
            num_cached_prefix_tokens=req.num_cached_tokens,
        )

    def _failure(self, req: Req) -> StepFailure:
        finish = req.finished_reason
        abort = finish.abort if finish is not None else None
        # The scheduler has counted this abort already.
        reason = FAILURE_OF_ABORT.get(abort, FailureReason.INTERNAL_ERROR)
        too_long = len(req.origin_input_ids) + req.max_new_tokens
        if abort is AbortReason.PROMPT_TOO_LONG and too_long <= self.memory.config.max_context_len:
            reason = FailureReason.KV_POOL_FULL  # it fits the context, not the pool
        detail = finish.message if finish is not None and finish.message else str(abort)
        if reason is FailureReason.KV_POOL_FULL:
            detail += (
                f' (KV pool: {self.memory.num_free_tokens()} free, '
                f'{self.memory.evictable_size()} evictable, '
                f'{self.memory.protected_size()} protected tokens)'
            )
            logger.warning('%s', detail)
        return StepFailure(req.robot_id, req.step_seq, req.stamp_ns or 0, reason, detail)

    def stats(self, now_ns: int) -> EngineStats:
        """The scheduler's counters, and its queue, batch and KV use read now."""
        chunked = self.scheduler.chunked_req
        return engine_stats(
            self.scheduler.metrics,
            now_ns,
            num_waiting=len(self.scheduler.waiting_queue),
            num_running=len(self.scheduler.running_batch.reqs),
            chunked_rid=chunked.rid if chunked is not None else '',
            kv_use_percent=100.0 * self.scheduler.token_usage(),
            session_prefix_tokens={s.robot_id: s.locked_len for s in self.scheduler.sessions()},
        )

    def check_integrity(self) -> None:
        self.scheduler.check_integrity()

    def close(self) -> None:
        for session in self.scheduler.sessions():
            self.scheduler.close_session(session.robot_id)
