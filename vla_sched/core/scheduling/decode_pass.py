"""The decode step (SGLang's ``update_running_batch``): memory check, retract, allocate.

Drop finished rows; if the next decode step does not fit the pool (after evicting
unlocked cache), retract requests (``ScheduleBatch.retract_decode``) and set the
new-token ratio to its after-retract estimate, else decay the ratio one step; clear the
full flag when the batch shrank; allocate one KV slot per remaining row, or ``k`` for a
decode burst (``decode_burst_steps``). Each retract is logged with the pool state and
counted for its robot; a request that does not fit even alone is aborted (out of memory).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Protocol

from vla_sched.core.scheduling.request import AbortReason, FinishReason

if TYPE_CHECKING:
    from vla_sched.core.memory.kv_memory import KVMemory
    from vla_sched.core.scheduling.metrics import SchedulerMetrics
    from vla_sched.core.scheduling.new_token_ratio import NewTokenRatioTracker
    from vla_sched.core.scheduling.request import Req
    from vla_sched.core.scheduling.robot_rules import RobotRules
    from vla_sched.core.scheduling.schedule_batch import ScheduleBatch
    from vla_sched.core.scheduling.scheduler_config import SchedulerConfig

logger = logging.getLogger(__name__)


class DecodeHost(Protocol):
    """The scheduler as seen by the decode step, which rebinds none of these attributes:
    it changes the running batch, the ratio and the metrics in place, and hands retracted
    and failed requests back through the two methods."""

    config: SchedulerConfig
    memory: KVMemory
    metrics: SchedulerMetrics
    new_token_ratio: NewTokenRatioTracker
    robots: RobotRules
    running_batch: ScheduleBatch
    waiting_queue: list[Req]
    chunked_req: Req | None

    def add_to_queue(self, req: Req, *, is_new: bool) -> FinishReason | None: ...

    def finish(self, req: Req, reason: FinishReason, *, insert: bool = ...) -> None: ...


def update_running_batch(s: DecodeHost, now: int) -> None:
    """Prepare the running batch's next decode step (it may end up empty)."""
    batch = s.running_batch
    initial_size = len(batch)
    batch.filter_batch()
    if batch.is_empty():
        batch.batch_is_full = False
        return
    if not batch.check_decode_mem(s.memory):
        _retract(s, batch, now)
    else:
        s.new_token_ratio.decay_step()
    if len(batch) < initial_size:
        batch.batch_is_full = False
    if not batch.is_empty():
        batch.prepare_for_decode(s.memory, num_steps=decode_burst_steps(s, now))


def decode_burst_steps(s: DecodeHost, now: int) -> int:
    """Decode steps the next pass runs: 1, or a burst of up to
    ``num_continuous_decode_steps`` when nothing needs a decision between them.

    A burst needs the normal loop (the overlap loop allocates the next step before the
    last one's tokens are known), no request waiting for prefill (a new robot waits at
    most one burst), no running request asked to finish or past its deadline (expiry
    decides those first), and the pool free for every step's KV. It never runs a request
    past its ``max_new_tokens``.
    """
    steps = s.config.num_continuous_decode_steps
    if steps <= 1 or s.config.enable_overlap or s.waiting_queue or s.chunked_req is not None:
        return 1
    batch = s.running_batch
    for req in batch.reqs:
        if req.to_finish is not None or (req.deadline_ns is not None and now >= req.deadline_ns):
            return 1
        steps = min(steps, req.max_new_tokens - len(req.output_ids))
    if steps <= 1 or not batch.check_decode_mem(s.memory, num_steps=steps):
        return 1
    return steps


def _retract(s: DecodeHost, batch: ScheduleBatch, now: int) -> None:
    old_ratio = s.new_token_ratio.current
    result = batch.retract_decode(
        s.memory,
        retraction_policy=s.config.retraction_policy,
        priority_sign=s.config.priority_sign,
        retract_decode_steps=s.config.retract_decode_steps,
    )
    new_ratio = s.new_token_ratio.set_after_retract(batch.reqs)
    logger.warning(
        'KV pool full: retracted %s, out of memory %s; new_token_ratio %.4f -> %.4f; '
        'free %d, evictable %d, protected %d tokens',
        [r.rid for r in result.retracted],
        [r.rid for r in result.to_abort],
        old_ratio,
        new_ratio,
        s.memory.num_free_tokens(),
        s.memory.evictable_size(),
        s.memory.protected_size(),
    )
    for req in result.retracted:
        s.robots.stop(req)
        s.metrics.record_retract(req.robot_id, now)
        s.add_to_queue(req, is_new=False)
    for req in result.to_abort:
        text = f'{req.describe()}: out of memory even after retracting all other requests'
        s.finish(req, FinishReason.aborted(AbortReason.OUT_OF_MEMORY, text), insert=False)
