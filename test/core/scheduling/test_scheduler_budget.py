"""Prefill budgets, chunking and the new-token ratio, with SGLang's numbers."""

from __future__ import annotations

import pytest
from sched_testing import (
    expected_outputs,
    launched,
    make_req,
    make_scheduler,
    run_until_idle,
)

from vla_sched.core.memory.kv_config import KVMemoryConfig
from vla_sched.core.memory.kv_memory import KVMemory
from vla_sched.core.scheduling.new_token_ratio import NewTokenRatioTracker
from vla_sched.core.scheduling.prefill_adder import AddReqResult, PrefillAdder
from vla_sched.core.scheduling.scheduler_config import SchedulerConfig


def _adder(memory: KVMemory, *, running=(), ratio=0.7, max_prefill=16384, chunk=None):
    return PrefillAdder(
        memory=memory,
        running_reqs=list(running),
        new_token_ratio=ratio,
        max_prefill_tokens=max_prefill,
        chunk_size=chunk,
        clip_max_new_tokens=4096,
    )


def _memory(num_pages: int = 64, page_size: int = 1) -> KVMemory:
    return KVMemory(
        KVMemoryConfig(
            num_pages=num_pages, page_size=page_size, num_req_slots=8, max_context_len=128
        )
    )


def _offer(adder: PrefillAdder, memory: KVMemory, req) -> AddReqResult:
    memory.match_prefix(req.kv)
    return adder.add_one_req(req)


def test_new_token_ratio_uses_sglangs_defaults() -> None:
    tracker = NewTokenRatioTracker(SchedulerConfig())
    assert tracker.current == tracker.init == 0.7
    assert tracker.floor == pytest.approx(0.098)
    assert tracker.decay == pytest.approx((0.7 - 0.098) / 600)
    tracker.decay_step()
    assert tracker.current == pytest.approx(0.7 - tracker.decay)
    for _ in range(700):
        tracker.decay_step()
    assert tracker.current == pytest.approx(0.098)
    tracker.reset()
    assert tracker.current == 0.7
    assert NewTokenRatioTracker(SchedulerConfig(schedule_conservativeness=2.0)).init == 1.0


def test_ratio_after_retract_estimates_from_the_remaining_requests() -> None:
    tracker = NewTokenRatioTracker(SchedulerConfig())
    few = make_req('a', [1, 2], 100)
    few.output_ids.extend([1000] * 3)
    assert tracker.set_after_retract([few]) == pytest.approx((3 + 20) / 101)
    many = make_req('b', [1, 2], 10)
    assert tracker.set_after_retract([few, many]) == pytest.approx((3 + 40) / 111)
    nearly_done = make_req('c', [1, 2], 5)
    nearly_done.output_ids.extend([1000] * 4)
    assert tracker.set_after_retract([nearly_done]) == 1.0  # (4 + 20) / 6, clipped


def test_a_request_is_refused_when_prompt_new_tokens_and_a_page_reach_the_total_budget() -> None:
    memory = _memory(num_pages=64)
    adder = _adder(memory)
    assert _offer(adder, memory, make_req('a', range(10, 30), 10)) is AddReqResult.CONTINUE
    # 64 - (20 + 10 + 1) = 33 left: 22 + 10 + 1 = 33 does not fit, 21 + 10 + 1 does.
    assert _offer(adder, memory, make_req('b', range(40, 62), 10)) is AddReqResult.NO_TOKEN
    assert [r.rid for r in adder.can_run_list] == ['a']
    _offer(adder, memory, make_req('c', range(40, 61), 10))
    assert [r.rid for r in adder.can_run_list] == ['a', 'c']


def test_running_requests_reserve_their_remaining_tokens_scaled_by_the_ratio() -> None:
    memory = _memory(num_pages=64)
    running = make_req('run', [1, 2, 3], 100)  # reserves 100 * 0.5 = 50
    adder = _adder(memory, running=[running], ratio=0.5)
    assert adder.rem_total_tokens == 14
    assert _offer(adder, memory, make_req('big', range(10, 14), 9)) is AddReqResult.NO_TOKEN
    assert _offer(adder, memory, make_req('ok', range(10, 13), 9)) is AddReqResult.CONTINUE
    assert adder.rem_total_tokens == 1
    assert _offer(adder, memory, make_req('one', [20], 1)) is AddReqResult.NO_TOKEN
    assert [r.rid for r in adder.can_run_list] == ['ok']


def test_without_chunking_only_the_first_request_may_exceed_the_input_budget() -> None:
    memory = _memory(num_pages=128)
    adder = _adder(memory, max_prefill=10)
    assert _offer(adder, memory, make_req('a', range(10, 40), 2)) is AddReqResult.OTHER
    assert [r.rid for r in adder.can_run_list] == ['a']
    adder = _adder(memory, max_prefill=10)
    assert _offer(adder, memory, make_req('b', range(50, 54), 2)) is AddReqResult.CONTINUE
    assert _offer(adder, memory, make_req('c', range(60, 66), 2)) is AddReqResult.OTHER
    assert [r.rid for r in adder.can_run_list] == ['b']


def test_a_long_prompt_is_cut_at_a_page_boundary_and_charged_without_decode_headroom() -> None:
    memory = _memory(num_pages=32, page_size=4)
    adder = _adder(memory, chunk=10)
    req = make_req('long', range(10, 31), 50)
    assert _offer(adder, memory, req) is AddReqResult.CONTINUE
    assert (req.extend_start, req.extend_end) == (0, 8)  # floor to the page: 2 tokens left
    assert adder.new_chunked_req is req
    assert adder.rem_total_token_offset == 8 + 0 + 4
    assert _offer(adder, memory, make_req('next', range(40, 50), 2)) is AddReqResult.OTHER
    assert adder.can_run_list == [req]  # less than a page left: no second chunked request


def test_chunks_are_page_aligned_and_the_chunked_request_is_always_resumed_first() -> None:
    sched = make_scheduler(page_size=4, num_pages=64, chunked_prefill_size=12)
    long = make_req('long', range(10, 40), 3)  # 30 tokens
    short = make_req('short', range(50, 55), 2)  # 5 tokens
    sched.add_request(long)
    sched.add_request(short)
    run_until_idle(sched)
    assert launched(sched)[:4] == [
        ('extend', [('long', 0, 12)]),
        ('extend', [('long', 12, 24)]),  # the chunk budget is spent: short waits
        ('extend', [('long', 24, 30), ('short', 0, 4)]),  # 6 left: short's first page
        ('extend', [('short', 4, 5)]),  # resumed first, before any decode
    ]
    assert long.output_ids == expected_outputs(long)
    assert short.output_ids == expected_outputs(short)


def test_the_ratio_decays_per_decode_step_and_resets_when_idle() -> None:
    sched = make_scheduler(num_pages=64)
    tracker = sched.new_token_ratio
    sched.add_request(make_req('a', range(10, 15), 4))
    sched.run_once()  # prefill
    sched.run_once()  # first decode
    sched.run_once()
    assert tracker.current == pytest.approx(tracker.init - 2 * tracker.decay)
    run_until_idle(sched)
    sched.run_once()  # nothing to run: idle
    assert tracker.current == tracker.init


@pytest.mark.parametrize(
    ('interval', 'modes'),
    [
        (0, ['extend', 'extend', 'extend', 'extend', 'decode', 'decode']),
        (1, ['extend', 'decode', 'extend', 'decode', 'extend', 'decode']),
    ],
)
def test_a_prefill_decode_interval_lets_running_requests_decode_between_chunks(
    interval: int, modes: list[str]
) -> None:
    sched = make_scheduler(chunked_prefill_size=4, prefill_decode_interval=interval)
    running = make_req('run', range(10, 13), 6)
    sched.add_request(running)
    sched.run_once()
    long = make_req('long', range(20, 32), 2)
    sched.add_request(long)
    run_until_idle(sched)
    assert [mode for mode, _ in launched(sched)][:6] == modes
    assert running.output_ids == expected_outputs(running)
    assert long.output_ids == expected_outputs(long)
