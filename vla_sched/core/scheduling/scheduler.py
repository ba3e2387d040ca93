"""The scheduler: SGLang's containers and step order, with robot rules on top.

Containers: ``waiting_queue`` (not admitted: new, retracted, preempted), ``running_batch``
(decoding), ``chunked_req`` (the one request being prefilled in chunks), ``last_batch``
(the batch launched last iteration; a prefill batch joins ``running_batch`` at the start
of the next step). ``get_next_batch_to_run`` runs, in SGLang's order:

1. idle sessions close; the pending abort of the chunked request; timeouts and deadlines;
2. the chunked request's computed prefix enters the tree; the last prefill batch (minus
   finished and chunked rows) merges into the running batch;
3. a new prefill batch (``prefill_pass``: chunked request first, then the sorted queue
   through the ``PrefillAdder``, the prefill delayer and priority preemption), unless
   ``prefill_decode_interval`` passes of decoding are due after the last prefill that
   left the running requests waiting; with ``enable_mixed_chunk`` the running requests
   decode in the prefill pass itself (SGLang's mixed chunk) and no decode pass is due;
4. else a decode step of the running batch (``decode_pass``: the decode memory check and
   retract).

A caller (the engine core) uses: ``open_or_update_session`` and ``close_session`` (the
robot sessions, on the scheduler's clock), ``add_request``, ``abort``, ``run_once`` (one
loop iteration; returns the requests that ended), ``has_work``, ``metrics``,
``check_integrity``. Sessions idle past the memory's ``session_idle_timeout_s`` (no step
in flight) are closed at the start of each iteration, so a robot that went away stops
holding its prefix locked; its next step opens the session again.

Differences from SGLang, on purpose (robot rules are in ``robot_rules``):
    * Requests refused at intake (validation, unknown session, queue full, stale step)
      are returned by ``add_request`` instead of flowing through a one-token prefill.
    * Aborts match request ids exactly (SGLang matches prefixes).
    * A retracted or preempted request already asked to finish is finished at once
      instead of being re-queued; one that a newer step of its robot supersedes is
      dropped.
    * When nothing runs and the head of the queue still does not fit the KV pool (other
      robots' session prefixes hold it), that request is aborted (out of memory) instead
      of blocking the queue forever.
"""

from __future__ import annotations

from collections.abc import Callable

from vla_sched.core.forward_batch import BatchRunner
from vla_sched.core.memory.kv_memory import KVMemory
from vla_sched.core.memory.radix_key import RadixKey
from vla_sched.core.memory.sessions import Session
from vla_sched.core.scheduling.batch_results import ResultProcessor
from vla_sched.core.scheduling.decode_pass import update_running_batch
from vla_sched.core.scheduling.expiry import expire_requests
from vla_sched.core.scheduling.intake import (
    RequestLimits,
    begin_session_step,
    queue_limit_victim,
    validate_new_request,
)
from vla_sched.core.scheduling.metrics import SchedulerMetrics
from vla_sched.core.scheduling.new_token_ratio import NewTokenRatioTracker
from vla_sched.core.scheduling.policy import SchedulePolicy
from vla_sched.core.scheduling.prefill_delayer import PrefillDelayer
from vla_sched.core.scheduling.prefill_pass import PrefillPass
from vla_sched.core.scheduling.request import AbortReason, FinishReason, Req
from vla_sched.core.scheduling.robot_rules import RobotRules
from vla_sched.core.scheduling.schedule_batch import ScheduleBatch
from vla_sched.core.scheduling.scheduler_config import SchedulerConfig, ms_to_ns
from vla_sched.core.scheduling.scheduler_integrity import check_scheduler_integrity
from vla_sched.core.scheduling.step_loops import NormalLoop, OverlapLoop


class Scheduler:
    """Schedules requests onto one model runner.

    Args:
        config: scheduling settings.
        memory: KV pools, radix cache and robot sessions.
        runner: executes ``ForwardBatch`` steps (real or simulated).
        clock: integer nanoseconds (the clock of request deadlines); read, never slept on.
    """

    def __init__(
        self,
        config: SchedulerConfig,
        memory: KVMemory,
        runner: BatchRunner,
        *,
        clock: Callable[[], int],
    ) -> None:
        chunk = config.chunked_prefill_size
        if chunk is not None and chunk % memory.page_size:
            raise ValueError(
                f'chunked_prefill_size {chunk} is not a multiple of the page size '
                f'{memory.page_size}'
            )
        self.config = config
        self.memory = memory
        self.runner = runner
        self.clock = clock
        self.limits = RequestLimits.of(memory)
        self.max_running_requests = config.max_running_requests or memory.config.num_req_slots
        self.waiting_queue: list[Req] = []
        self.running_batch = ScheduleBatch()
        self.chunked_req: Req | None = None
        self.last_batch: ScheduleBatch | None = None
        self.pending_chunked_abort: FinishReason | None = None
        self._prefill_skips_left = 0
        self.new_token_ratio = NewTokenRatioTracker(config)
        self.robots = RobotRules(late_policy=config.late_policy)
        self.metrics = SchedulerMetrics(
            window_size=config.latency_window_size,
            retract_window_ns=ms_to_ns(config.retract_window_ms),
        )
        self.prefill = PrefillPass(
            self, SchedulePolicy(config, memory), PrefillDelayer(config.prefill_delayer)
        )
        self._live: dict[str, Req] = {}
        self._outbox: list[Req] = []
        results = ResultProcessor(
            memory=memory, metrics=self.metrics, clock=clock, finish=self.finish
        )
        if config.enable_overlap:
            self.loop: NormalLoop | OverlapLoop = OverlapLoop(
                self,
                runner,
                results,
                disable_consecutive_prefill_overlap=config.disable_consecutive_prefill_overlap,
            )
        else:
            self.loop = NormalLoop(self, runner, results)

    # ---- public API ------------------------------------------------------------------

    def add_request(self, req: Req) -> FinishReason | None:
        """Queue a new request, or refuse it.

        Returns:
            None when queued; else the abort reason (the request is finished and is not
            reported again by ``run_once``). Requests that this one pushes out (an older
            waiting step of its robot, a less important request of a full queue) are
            reported by the next ``run_once``.
        """
        now = self.clock()
        req.times.arrival_ns = now
        if req.rid in self._live:
            req.finished_reason = FinishReason.aborted(
                AbortReason.DUPLICATE_RID, f'request id {req.rid!r} is already live'
            )
            self.metrics.record_abort(req.robot_id, AbortReason.DUPLICATE_RID.value)
            return req.finished_reason
        reason = validate_new_request(req, config=self.config, limits=self.limits)
        if reason is None and req.session_id is not None:
            reason = begin_session_step(self.memory, req, now)
        if reason is not None:
            self.finish(req, reason, report=False)
            return reason
        self._live[req.rid] = req
        return self.add_to_queue(req, is_new=True)

    def abort(self, rid: str, message: str = '') -> bool:
        """Abort a live request (``client`` reason); False if no such request is live."""
        req = self._live.get(rid)
        if req is None:
            return False
        text = message or f'{req.describe()} was aborted by its client'
        self.abort_req(req, FinishReason.aborted(AbortReason.CLIENT, text))
        return True

    def open_or_update_session(
        self, robot_id: str, prefix: RadixKey, *, instruction_version: int = 0
    ) -> None:
        """Open the robot's session on ``prefix``, or swap the open session's prefix when
        ``instruction_version`` differs from the one it was built from (same version:
        nothing changes). The robot's steps (``Req.session_id``) must extend the prefix."""
        sessions, now = self.memory.sessions, self.clock()
        if robot_id not in sessions:
            sessions.open(robot_id, prefix, now_ns=now, instruction_version=instruction_version)
        elif sessions.get(robot_id).instruction_version != instruction_version:
            sessions.change_prefix(
                robot_id, prefix, now_ns=now, instruction_version=instruction_version
            )

    def sessions(self) -> list[Session]:
        """The open sessions (to read: change them through this scheduler's methods)."""
        return self.memory.sessions.sessions()

    def close_session(self, robot_id: str) -> list[str]:
        """Close the robot's session; its steps in flight are aborted. Returns their ids
        (none when the robot has no open session)."""
        if robot_id not in self.memory.sessions:
            return []
        rids = self.memory.sessions.close(robot_id)
        for rid in rids:
            req = self._live.get(rid)
            if req is not None:
                text = f'{req.describe()}: the session of robot {robot_id!r} was closed'
                self.abort_req(req, FinishReason.aborted(AbortReason.SESSION_CLOSED, text))
        return list(rids)

    def run_once(self) -> list[Req]:
        """One iteration of the configured loop; returns the requests that ended in it
        (finished, aborted or dropped; see ``Req.finished_reason``)."""
        self.loop.run_once()
        done, self._outbox = self._outbox, []
        return done

    def has_work(self) -> bool:
        return bool(
            self.waiting_queue
            or not self.running_batch.is_empty()
            or self.chunked_req is not None
            or (self.last_batch is not None and self.last_batch.is_extend and self.last_batch.reqs)
            or self.loop.has_pending_results()
            or self._outbox
        )

    def is_fully_idle(self) -> bool:
        return not self.has_work()

    def live_reqs(self) -> list[Req]:
        """Every request not finished yet, in arrival order."""
        return list(self._live.values())

    def check_integrity(self) -> None:
        """Raise unless containers, robots, pools, tree and sessions agree."""
        check_scheduler_integrity(self)

    # ---- one scheduling step ---------------------------------------------------------

    def get_next_batch_to_run(self) -> ScheduleBatch | None:
        """The batch of this step (prefill first, else decode), or None when idle."""
        now = self.clock()
        self.memory.sessions.reap_idle(now_ns=now)
        self._process_pending_chunked_abort()
        expire_requests(self, now)
        self._merge_last_prefill()
        if self.running_batch.is_empty():
            self.running_batch.batch_is_full = False
        batch = None if self._defer_prefill() else self.prefill.build(now)
        if batch is not None and not batch.num_decoding_rows:
            self._prefill_skips_left = self.config.prefill_decode_interval
        elif not self.running_batch.is_empty():
            update_running_batch(self, now)
            if not self.running_batch.is_empty():
                batch = self.running_batch
        if batch is None:
            self._abort_unservable_head()
        return batch

    def _defer_prefill(self) -> bool:
        """Whether this pass decodes instead of prefilling (``prefill_decode_interval``)."""
        if self._prefill_skips_left <= 0:
            return False
        self._prefill_skips_left -= 1
        return not self.running_batch.is_empty()

    def on_idle(self) -> None:
        if self.is_fully_idle():
            self.new_token_ratio.reset()

    def _process_pending_chunked_abort(self) -> None:
        reason, self.pending_chunked_abort = self.pending_chunked_abort, None
        if reason is not None and self.chunked_req is not None:
            req, self.chunked_req = self.chunked_req, None
            self.finish(req, reason, insert=False)

    def count_deadline_miss(self, req: Req) -> None:
        """Mark ``req`` late; its robot's miss is counted once per step."""
        req.late = True
        if not req.deadline_counted:
            req.deadline_counted = True
            self.metrics.record_deadline_miss(req.robot_id)

    def _merge_last_prefill(self) -> None:
        exclude: list[Req] = []
        chunked = self.chunked_req
        if chunked is not None:
            exclude.append(chunked)
            if chunked.kv.kv_committed_len > chunked.kv.prefix_len:
                self.memory.cache_unfinished_req(chunked.kv)
        last = self.last_batch
        if last is None or not last.is_extend or last.is_empty():
            return
        if last.chunked_req is not None:
            exclude.append(last.chunked_req)
        if last.forward_batch is not None and last.forward_batch.prefill_only:
            last.reqs = []  # they never decode: their results finish them
            return
        num_rows = len(last)
        last.filter_batch(exclude=tuple(exclude))
        if len(last) < num_rows:
            self.running_batch.batch_is_full = False
        self.running_batch.merge_batch(last)
        last.reqs = []

    def _abort_unservable_head(self) -> None:
        head = self.prefill.refused_head
        if (
            head is None
            or head not in self.waiting_queue
            or not self.running_batch.is_empty()
            or self.chunked_req is not None
            or self.loop.has_pending_results()
        ):
            return
        text = (
            f'{head.describe()} does not fit the KV pool even with nothing running '
            f'({self.memory.num_free_tokens()} free, {self.memory.evictable_size()} '
            f'evictable, {self.memory.protected_size()} locked tokens)'
        )
        self.abort_req(head, FinishReason.aborted(AbortReason.OUT_OF_MEMORY, text))

    def token_usage(self) -> float:
        """KV in use that cannot be evicted: ``1 - (free + evictable) / total``."""
        return 1.0 - self.memory.available_size() / self.memory.config.num_tokens

    # ---- queue, abort, finish --------------------------------------------------------

    def admitted_reqs(self) -> list[Req]:
        """Live requests holding KV (running, chunked, or in the last prefill batch)."""
        return [r for r in self._live.values() if r.kv.holds_memory]

    def add_to_queue(self, req: Req, *, is_new: bool) -> FinishReason | None:
        """SGLang's ``_add_request_to_queue`` for new, retracted and preempted requests."""
        report = not is_new
        if req.to_finish is not None:
            self.finish(req, req.to_finish, report=report)
            return req.to_finish
        older, stale = self.robots.superseded(req, self.waiting_queue)
        if stale:
            text = f'{req.describe()} is not newer than the step its robot already has'
            reason = FinishReason.aborted(AbortReason.SUPERSEDED, text)
            self.finish(req, reason, report=report)
            return reason
        for old in older:
            text = f'{old.describe()} was superseded by step {req.step_seq}'
            self.abort_req(old, FinishReason.aborted(AbortReason.SUPERSEDED, text))
        victim = queue_limit_victim(req, self.waiting_queue, self.config)
        if victim is req:
            text = f'{req.describe()}: the request queue is full'
            reason = FinishReason.aborted(AbortReason.QUEUE_FULL, text)
            self.finish(req, reason, report=report)
            return reason
        if victim is not None:
            text = f'{victim.describe()} was aborted by a higher priority request'
            self.abort_req(victim, FinishReason.aborted(AbortReason.PREEMPTED_BY_PRIORITY, text))
        self.waiting_queue.append(req)
        req.times.wait_queue_entry_ns = self.clock()
        return None

    def abort_req(self, req: Req, reason: FinishReason) -> None:
        """Abort a live request wherever it is (SGLang's three methods)."""
        if any(w is req for w in self.waiting_queue):
            self.waiting_queue = [w for w in self.waiting_queue if w is not req]
            self.finish(req, reason)
        elif req is self.chunked_req:
            if self.pending_chunked_abort is None:
                self.pending_chunked_abort = reason
        elif not req.finished and req.to_finish is None:
            req.to_finish = reason

    def finish(
        self, req: Req, reason: FinishReason, *, insert: bool = True, report: bool = True
    ) -> None:
        """The one exit path: release memory, forget the request, count, report."""
        now = self.clock()
        if req.finished_reason is None:
            req.finished_reason = reason
        reason = req.finished_reason
        req.times.finished_ns = now
        if req.kv.holds_memory:
            # A whole-prompt request's KV attended both ways: no other sequence may reuse it.
            self.memory.release(req.kv, insert=insert and not req.whole_prompt, now_ns=now)
        else:
            self.memory.sessions.end_step(req.kv, now_ns=now)
        if req is self.chunked_req:
            self.chunked_req = None
        self.robots.stop(req)
        if self._live.get(req.rid) is req:
            del self._live[req.rid]
        if reason.is_abort:
            self.metrics.record_abort(req.robot_id, reason.abort.value)
        else:
            if self.robots.is_overdue(req, now):
                self.count_deadline_miss(req)
            arrival = req.times.arrival_ns if req.times.arrival_ns is not None else now
            self.metrics.record_step_done(req.robot_id, now - arrival)
            if req.times.admitted_ns is not None:
                self.metrics.record_admitted_to_finish(now - req.times.admitted_ns)
        if report:
            self._outbox.append(req)
