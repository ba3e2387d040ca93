"""Helpers shared by the scheduler tests (not a test module)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from vla_sched.core.forward_batch import ImageInput, SamplingParams
from vla_sched.core.memory.kv_config import KVMemoryConfig
from vla_sched.core.memory.kv_memory import KVMemory
from vla_sched.core.scheduling.request import Req
from vla_sched.core.scheduling.schedule_batch import ScheduleBatch
from vla_sched.core.scheduling.scheduler import Scheduler
from vla_sched.core.scheduling.scheduler_config import SchedulerConfig
from vla_sched.testing.sim_runner import CostModel, SimClock, SimRunner, reference_tokens

SAMPLING = SamplingParams(allowed_token_start=1000, allowed_token_end=1256)


def make_scheduler(
    *,
    page_size: int = 1,
    num_pages: int = 256,
    num_req_slots: int = 8,
    max_context_len: int = 256,
    session_step_kv: str = 'free',
    session_idle_timeout_s: float = 30.0,
    cost_model: CostModel | None = None,
    **config: object,
) -> Scheduler:
    """A scheduler on a fresh memory and a simulated runner; the clock is a ``SimClock``."""
    memory = KVMemory(
        KVMemoryConfig(
            num_pages=num_pages,
            page_size=page_size,
            num_req_slots=num_req_slots,
            max_context_len=max_context_len,
            session_step_kv=session_step_kv,
            session_idle_timeout_s=session_idle_timeout_s,
        )
    )
    clock = SimClock()
    runner = SimRunner(
        req_to_token=memory.req_to_token_pool.req_to_token,
        num_kv_slots=memory.allocator.num_slots,
        cost_model=cost_model,
        clock=clock,
        keep_batches=True,
    )
    config.setdefault('enable_overlap', False)
    return Scheduler(SchedulerConfig(**config), memory, runner, clock=clock)


def make_req(
    rid: str,
    prompt: Sequence[int],
    max_new_tokens: int,
    *,
    images: Sequence[ImageInput] = (),
    **fields: object,
) -> Req:
    return Req(
        rid=rid,
        origin_input_ids=tuple(prompt),
        sampling=SAMPLING,
        max_new_tokens=max_new_tokens,
        images=tuple(images),
        **fields,
    )


def clone_req(req: Req) -> Req:
    """A fresh request with the same inputs (for running one workload twice)."""
    names = [f.name for f in dataclasses.fields(Req) if f.init]
    return Req(**{name: getattr(req, name) for name in names})


def expected_outputs(req: Req) -> list[int]:
    return reference_tokens(req.origin_input_ids, req.images, req.sampling, req.max_new_tokens)


def run_until_idle(
    scheduler: Scheduler, *, max_iters: int = 2000, check: bool = True
) -> list[Req]:
    """Run the loop until there is no work; returns every request that ended."""
    done: list[Req] = []
    for _ in range(max_iters):
        if not scheduler.has_work():
            return done
        done.extend(scheduler.run_once())
        if check:
            scheduler.check_integrity()
    raise AssertionError(f'scheduler still busy after {max_iters} iterations')


def launched(scheduler: Scheduler) -> list[tuple[str, list[tuple[str, int, int]]]]:
    """Every launched step as ``(mode, [(rid, prefix_len, seq_len), ...])``."""
    return [
        (
            fb.forward_mode.value,
            list(zip(fb.rids, fb.prefix_lens.tolist(), fb.seq_lens.tolist(), strict=True)),
        )
        for fb in scheduler.runner.batches
    ]


def tick(scheduler: Scheduler, ns: int = 1_000_000) -> None:
    """Advance the scheduler's simulated clock."""
    scheduler.clock.advance(ns)


def admit_running(memory: KVMemory, req: Req, num_outputs: int) -> None:
    """Prefill ``req`` whole and decode until it has ``num_outputs`` outputs (token 1000),
    leaving it ready for its next decode step, as a running request is."""
    memory.match_prefix(req.kv)
    memory.admit(req.kv)
    req.set_extend_range(req.kv.prefix_len, req.num_fill_tokens)
    ScheduleBatch([req]).prepare_for_extend(memory)
    for i in range(num_outputs):
        if i:
            ScheduleBatch([req]).prepare_for_decode(memory)
        req.append_output([1000])
