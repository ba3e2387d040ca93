"""One prefill pass (SGLang's ``get_new_batch_prefill``), with the robot rules.

Order: early exits (batch full or nothing waiting and no chunked request; no request slot
left) -> sort the queue by policy -> resume the chunked request -> for each waiting
request: skip it while its robot has a step in flight; mark the batch full when the
request slots are spent (then only priority preemption can make room); ask the prefill
delayer (once per pass); match its prefix in the tree; offer it to the adder; stop at the
first refusal -> take the admitted requests out of the queue, re-queue the preempted
ones, install a new chunked request, allocate the batch's KV. With ``enable_mixed_chunk``
the running requests decode one token each in the same pass (``_rows_to_mix``). A pass
holds either prefill-only requests (matched against nothing, never mixed with decoding
rows) or token prefills, never both: the first admitted request decides. With
``size_passes_by_deadline`` (once pass costs are measured) the candidates are offered
earliest deadline first and each also has to fit the pass's time budget (``pass_sizing``):
one that does not waits for a later pass (the others are still tried) or, when it cannot
make its deadline even alone, is refused.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from vla_sched.core.forward_batch import ForwardMode
from vla_sched.core.scheduling.pass_sizing import DeadlinePassBudget, PassVerdict
from vla_sched.core.scheduling.prefill_adder import AddReqResult, ChunkResult, PrefillAdder
from vla_sched.core.scheduling.request import AbortReason, FinishReason
from vla_sched.core.scheduling.schedule_batch import ScheduleBatch

if TYPE_CHECKING:
    from vla_sched.core.memory.kv_memory import KVMemory
    from vla_sched.core.scheduling.metrics import SchedulerMetrics
    from vla_sched.core.scheduling.new_token_ratio import NewTokenRatioTracker
    from vla_sched.core.scheduling.policy import SchedulePolicy
    from vla_sched.core.scheduling.prefill_delayer import PrefillDelayer
    from vla_sched.core.scheduling.request import Req
    from vla_sched.core.scheduling.robot_rules import RobotRules
    from vla_sched.core.scheduling.scheduler_config import SchedulerConfig


class PrefillHost(Protocol):
    """The scheduler as seen by a prefill pass, which rebinds ``waiting_queue`` (admitted
    requests leave it) and ``chunked_req``, changes the running batch's full flag and the
    metrics in place, and re-queues retracted and preempted requests through the method."""

    config: SchedulerConfig
    memory: KVMemory
    metrics: SchedulerMetrics
    new_token_ratio: NewTokenRatioTracker
    robots: RobotRules
    max_running_requests: int
    waiting_queue: list[Req]
    running_batch: ScheduleBatch
    chunked_req: Req | None

    def token_usage(self) -> float: ...

    def add_to_queue(self, req: Req, *, is_new: bool) -> FinishReason | None: ...

    def abort_req(self, req: Req, reason: FinishReason) -> None: ...

    def count_deadline_miss(self, req: Req) -> None: ...


class PrefillPass:
    """Builds the prefill batch of a step from the scheduler's containers.

    Attributes:
        refused_head: the first request refused for lack of KV in the last pass, when
            no new request was admitted before it (None otherwise).
    """

    def __init__(self, host: PrefillHost, policy: SchedulePolicy, delayer: PrefillDelayer) -> None:
        self.host = host
        self.policy = policy
        self.delayer = delayer
        self.refused_head: Req | None = None

    def build(self, now: int) -> ScheduleBatch | None:
        """The prefill batch of this step, or None (then the step decodes)."""
        s = self.host
        self.refused_head = None
        running = s.running_batch
        preemption = s.config.enable_priority_preemption
        if preemption:
            running.batch_is_full = False
        if (running.batch_is_full or not s.waiting_queue) and s.chunked_req is None:
            return None
        if self._num_allocatable(0) <= 0 and s.chunked_req is None and not preemption:
            running.batch_is_full = True
            return None
        if s.waiting_queue:
            self.policy.calc_priority(s.waiting_queue)
        adder = self._new_adder()
        if s.chunked_req is not None:
            self._resume_chunked(adder, now)
        self._admit_waiting(adder, now, self._deadline_budget(adder, now))
        return self._finalize(adder, now)

    def _new_adder(self) -> PrefillAdder:
        s = self.host
        cfg = s.config
        return PrefillAdder(
            memory=s.memory,
            running_reqs=[r for r in s.running_batch.reqs if not r.finished],
            new_token_ratio=s.new_token_ratio.current,
            max_prefill_tokens=cfg.max_prefill_tokens,
            chunk_size=cfg.chunked_prefill_size,
            clip_max_new_tokens=cfg.clip_max_new_tokens_estimation,
            prefill_max_requests=cfg.prefill_max_requests,
            preemption_threshold=cfg.priority_scheduling_preemption_threshold,
            priority_sign=cfg.priority_sign,
            retract_decode_steps=cfg.retract_decode_steps,
            mixed_with_decode_tokens=len(s.running_batch) if cfg.enable_mixed_chunk else 0,
        )

    def _num_allocatable(self, num_rows_taken: int) -> int:
        """SGLang's ``get_num_allocatable_reqs``; rows this pass took count as free, since
        SGLang takes rows only after the pass."""
        s = self.host
        free_rows = s.memory.req_to_token_pool.num_free_slots + num_rows_taken
        return min(s.max_running_requests - len(s.running_batch), free_rows)

    def _resume_chunked(self, adder: PrefillAdder, now: int) -> None:
        s = self.host
        req = s.chunked_req
        result = adder.add_chunked_req(req)
        if result is ChunkResult.MIDDLE:
            return
        s.chunked_req = None
        if result is ChunkResult.NO_MEMORY:
            s.memory.retract(req.kv)
            req.reset_for_retract()
            s.robots.stop(req)
            s.metrics.record_retract(req.robot_id, now)
            s.add_to_queue(req, is_new=False)

    def _deadline_budget(self, adder: PrefillAdder, now: int) -> DeadlinePassBudget | None:
        """The pass's time budget under ``size_passes_by_deadline`` once costs are known."""
        s = self.host
        if not s.config.size_passes_by_deadline:
            return None
        running = [r for r in s.running_batch.reqs if not r.finished]
        waiting = running + ([s.chunked_req] if s.chunked_req is not None else [])
        base = sum(r.extend_end - r.extend_start for r in adder.can_run_list)
        if s.config.enable_mixed_chunk:
            base += len(running)
        budget = DeadlinePassBudget(
            cost=s.metrics.pass_cost, now_ns=now, base_tokens=base, waiting=waiting
        )
        return budget if budget.active else None

    def _sized_out(
        self, req: Req, adder: PrefillAdder, budget: DeadlinePassBudget, extend: int
    ) -> bool:
        """Whether ``req`` stays out of this pass to keep its deadlines (``pass_sizing``):
        it waits for a later pass, or is refused when it cannot make its own even alone."""
        s = self.host
        verdict = budget.verdict(req, extend)
        if verdict is PassVerdict.TOO_LONG:
            others = s.chunked_req is not None or not s.running_batch.is_empty()
            others = others or bool(adder.can_run_list) or len(s.waiting_queue) > 1
            if s.robots.drops_late_steps and others:
                s.count_deadline_miss(req)
                text = budget.too_long_text(req, extend)
                s.abort_req(req, FinishReason.aborted(AbortReason.DEADLINE_MISSED, text))
                return True
            verdict = PassVerdict.WAIT if others else PassVerdict.JOIN  # late, alone
        if verdict is PassVerdict.WAIT:
            s.metrics.num_deadline_waits += 1
            return True
        return False

    @staticmethod
    def _extend_of(req: Req, adder: PrefillAdder) -> int:
        """The tokens ``req`` would add to the pass (a chunkable one at most a chunk)."""
        extend = req.num_fill_tokens - req.kv.prefix_len
        if not req.whole_prompt and adder.rem_chunk_tokens is not None:
            extend = min(extend, max(adder.rem_chunk_tokens, 0))
        return extend

    def _admit_waiting(
        self, adder: PrefillAdder, now: int, budget: DeadlinePassBudget | None
    ) -> None:
        s = self.host
        running = s.running_batch
        preemption = s.config.enable_priority_preemption
        # A resumed chunked request is in can_run_list but has held its row since its first
        # chunk: count it as taken by this pass, or it shrinks the rows left for others.
        num_rows_taken = sum(1 for r in adder.can_run_list if r.kv.holds_memory)
        decided = False
        candidates = list(s.waiting_queue)
        if budget is not None:  # earliest deadline first (the policy's order among equals)
            candidates.sort(key=budget.slack_of)
        for req in candidates:
            if s.robots.is_busy(req):
                continue
            if len(adder.can_run_list) >= self._num_allocatable(num_rows_taken):
                running.batch_is_full = True
            if running.batch_is_full and not (
                preemption and adder.preempt_to_schedule(req, running)
            ):
                return
            if not decided:
                decided = True
                if not self._prefill_allowed(now):
                    return
            if adder.can_run_list and adder.can_run_list[0].prefill_only != req.prefill_only:
                return  # a pass is either prefill-only or token prefill, never both
            s.memory.match_prefix(req.kv, reuse=not req.whole_prompt)
            extend = self._extend_of(req, adder)
            if budget is not None and self._sized_out(req, adder, budget, extend):
                continue
            result = adder.add_one_req(req)
            admitted = bool(adder.can_run_list) and adder.can_run_list[-1] is req
            if admitted:
                num_rows_taken += 1
                s.robots.start(req)
                if budget is not None:
                    budget.join(req, extend)
            if result is not AddReqResult.CONTINUE:
                if result is AddReqResult.NO_TOKEN:
                    running.batch_is_full = True
                    if not admitted and num_rows_taken == 0:
                        self.refused_head = req
                return

    def _prefill_allowed(self, now: int) -> bool:
        s = self.host
        running = [r for r in s.running_batch.reqs if not r.finished]
        decision = self.delayer.decide(now_ns=now, running=running, token_usage=s.token_usage())
        if not decision.allows_prefill:
            s.metrics.num_delayed_prefills += 1
        return decision.allows_prefill

    def _rows_to_mix(self, prefill_reqs: list[Req]) -> list[Req]:
        """The running requests that decode in this prefill pass (SGLang's mixed chunk):
        all of them when ``enable_mixed_chunk`` is on and the pool holds their next token
        besides the prefill (evicting unlocked cache first), else none (they decode in the
        next pass, where a full pool retracts)."""
        s = self.host
        running = s.running_batch
        if not s.config.enable_mixed_chunk or prefill_reqs[0].prefill_only:
            return []
        running.filter_batch()
        if running.is_empty():
            return []
        kvs = [r.kv for r in prefill_reqs] + [r.kv for r in running.reqs]
        lens = [r.extend_end - r.extend_start for r in prefill_reqs] + [1] * len(running)
        need = s.memory.tokens_needed(kvs, lens)
        if s.memory.num_free_tokens() < need:
            s.memory.evict(need)
        if s.memory.num_free_tokens() < need:
            return []
        return list(running.reqs)

    def _finalize(self, adder: PrefillAdder, now: int) -> ScheduleBatch | None:
        s = self.host
        for victim in adder.preempt_list:
            s.robots.stop(victim)
            s.metrics.num_preemptions += 1
        if adder.can_run_list:
            admitted = {id(r) for r in adder.can_run_list}
            s.waiting_queue = [r for r in s.waiting_queue if id(r) not in admitted]
        for victim in adder.preempt_list:
            s.add_to_queue(victim, is_new=False)
        if not adder.can_run_list:
            return None
        if adder.new_chunked_req is not None:
            if s.chunked_req is not None:
                raise RuntimeError(
                    f'{adder.new_chunked_req.describe()} is cut into chunks while '
                    f'{s.chunked_req.describe()} still is'
                )
            s.chunked_req = adder.new_chunked_req
        if s.chunked_req is not None:
            s.chunked_req.inflight_middle_chunks += 1
        batch = ScheduleBatch(
            adder.can_run_list, forward_mode=ForwardMode.EXTEND, chunked_req=s.chunked_req
        )
        decoding = self._rows_to_mix(adder.can_run_list)
        if decoding:
            # They decode in this pass and rejoin the running batch with it (SGLang).
            s.running_batch.filter_batch(keep_indices=[])
        batch.prepare_for_extend(s.memory, decoding=decoding)
        for req in batch.reqs:
            if req.times.admitted_ns is None:
                req.times.admitted_ns = now
                req.num_cached_tokens = req.extend_start
                s.metrics.record_cache_hit(
                    req.robot_id, req.extend_start, len(req.origin_input_ids)
                )
        return batch
