"""Robot rules (freshness, one step in flight, deadlines), sessions, aborts and bad input."""

from __future__ import annotations

import numpy as np
import torch
from sched_testing import (
    expected_outputs,
    launched,
    make_req,
    make_scheduler,
    run_until_idle,
)

from vla_sched.core.forward_batch import ImageInput
from vla_sched.core.memory.radix_key import RadixKey
from vla_sched.core.scheduling.request import AbortReason, FinishKind

MS = 1_000_000
PREFIX = list(range(300, 310))  # system prompt + instruction
IMAGE_TOKEN = 77


def _step(robot: str, seq: int, *, max_new: int = 3, session: bool = False, **fields):
    prompt = [*PREFIX, *[IMAGE_TOKEN] * 4, 40 + seq, 41]
    image = ImageInput(
        content_hash=1000 + seq,
        token_offset=len(PREFIX),
        num_tokens=4,
        pixels=np.zeros((2, 2, 3), dtype=np.uint8),
    )
    return make_req(
        f'{robot}-{seq}',
        prompt,
        max_new,
        images=[image],
        robot_id=robot,
        step_seq=seq,
        session_id=robot if session else None,
        **fields,
    )


def _reasons(done) -> dict[str, str]:
    return {r.rid: r.finished_reason.abort.value for r in done if r.finished_reason.is_abort}


def test_a_newer_observation_supersedes_the_waiting_step_and_is_counted() -> None:
    sched = make_scheduler()
    assert sched.add_request(_step('r1', 1)) is None
    assert sched.add_request(_step('r1', 2)) is None
    stale = sched.add_request(_step('r1', 0))
    assert stale.abort is AbortReason.SUPERSEDED
    assert [r.rid for r in sched.waiting_queue] == ['r1-2']
    done = run_until_idle(sched)
    assert _reasons(done) == {'r1-1': 'superseded'}
    assert sched.metrics.robot('r1').num_superseded == 2
    assert sched.metrics.robot('r1').num_steps_done == 1


def test_a_robot_has_at_most_one_step_in_flight() -> None:
    sched = make_scheduler()
    first, other = _step('r1', 1), _step('r2', 1)
    sched.add_request(first)
    sched.run_once()
    second = _step('r1', 2)
    sched.add_request(second)
    sched.add_request(other)
    sched.run_once()
    assert launched(sched)[1][1][0][0] == 'r2-1'  # r2 is admitted, r1's next step waits
    assert second in sched.waiting_queue
    run_until_idle(sched)
    prefills = [rid for mode, rows in launched(sched) if mode == 'extend' for rid, *_ in rows]
    assert prefills == ['r1-1', 'r2-1', 'r1-2']
    assert second.times.admitted_ns >= first.times.finished_ns
    for req in (first, second, other):
        assert req.output_ids == expected_outputs(req)


def test_a_waiting_step_past_its_deadline_is_dropped_and_counted() -> None:
    sched = make_scheduler(late_policy='drop')
    sched.add_request(_step('r1', 1, deadline_ns=5 * MS))
    sched.clock.advance(6 * MS)
    done = sched.run_once()
    assert _reasons(done) == {'r1-1': 'deadline_missed'}
    assert 'past its deadline' in done[0].finished_reason.message
    assert sched.metrics.robot('r1').num_deadline_misses == 1
    assert not sched.has_work()


def test_a_running_step_past_its_deadline_ends_at_its_next_result() -> None:
    sched = make_scheduler(late_policy='drop')
    step = _step('r1', 1, max_new=10, deadline_ns=5 * MS)
    sched.add_request(step)
    sched.run_once()
    sched.run_once()
    sched.clock.advance(6 * MS)
    done = sched.run_once()
    assert done == [step]
    assert step.finished_reason.abort is AbortReason.DEADLINE_MISSED
    assert len(step.output_ids) == 3  # prefill, one decode, and the step that was running
    sched.check_integrity()
    assert sched.metrics.robot('r1').num_deadline_misses == 1


def test_deliver_late_finishes_the_step_marked_late_and_counts_it_once() -> None:
    sched = make_scheduler(late_policy='deliver_late')
    step = _step('r1', 1, max_new=4, deadline_ns=5 * MS)
    sched.add_request(step)
    sched.run_once()
    sched.clock.advance(6 * MS)
    run_until_idle(sched)
    assert step.finished_reason.kind is FinishKind.LENGTH
    assert step.late
    assert step.output_ids == expected_outputs(step)
    assert sched.metrics.robot('r1').num_deadline_misses == 1


def test_the_next_step_of_a_session_reuses_the_cached_prefix() -> None:
    sched = make_scheduler(page_size=2)
    prefix = RadixKey(torch.tensor(PREFIX, dtype=torch.int64))
    sched.open_or_update_session('r1', prefix)
    first, second = _step('r1', 1, session=True), _step('r1', 2, session=True)
    sched.add_request(first)
    run_until_idle(sched)
    sched.add_request(second)
    run_until_idle(sched)
    assert (first.num_cached_tokens, second.num_cached_tokens) == (0, len(PREFIX))
    assert sched.metrics.robot('r1').num_cached_tokens == len(PREFIX)
    assert [(s.robot_id, s.locked_len) for s in sched.sessions()] == [('r1', len(PREFIX))]
    assert second.output_ids == expected_outputs(second)


def test_an_unknown_or_mismatched_session_aborts_only_that_step() -> None:
    sched = make_scheduler()
    unknown = sched.add_request(_step('r9', 1, session=True))
    assert unknown.abort is AbortReason.UNKNOWN_SESSION
    sched.open_or_update_session('r1', RadixKey(torch.tensor([1, 2, 3])))
    mismatch = sched.add_request(_step('r1', 1, session=True))
    assert mismatch.abort is AbortReason.SESSION_MISMATCH
    assert "request 'r1-1'" in mismatch.message
    fine = _step('r2', 1)
    sched.add_request(fine)
    assert [r.rid for r in run_until_idle(sched)] == ['r2-1']


def test_closing_a_session_aborts_its_steps_in_flight() -> None:
    sched = make_scheduler()
    sched.open_or_update_session('r1', RadixKey(torch.tensor(PREFIX)))
    running = _step('r1', 1, session=True, max_new=8)
    sched.add_request(running)
    sched.run_once()
    assert sched.close_session('r1') == ['r1-1']
    done = run_until_idle(sched)
    assert _reasons(done) == {'r1-1': 'session_closed'}
    assert sched.sessions() == []


def test_client_aborts_end_waiting_running_and_chunked_requests() -> None:
    sched = make_scheduler(chunked_prefill_size=4, max_running_requests=8)
    waiting = make_req('w', range(10, 14), 2)
    running = make_req('r', range(20, 23), 8)
    sched.add_request(running)
    sched.run_once()
    chunked = make_req('c', range(30, 45), 2)
    sched.add_request(chunked)
    sched.run_once()
    assert sched.chunked_req is chunked
    sched.add_request(waiting)
    assert all(sched.abort(rid) for rid in ('w', 'r', 'c'))
    assert not sched.abort('nobody')
    done = run_until_idle(sched)
    assert _reasons(done) == {'w': 'client', 'r': 'client', 'c': 'client'}
    assert sched.memory.num_free_tokens() + sched.memory.evictable_size() == 256


def test_bad_input_is_aborted_with_its_reason_while_others_are_served() -> None:
    sched = make_scheduler(num_pages=64, max_context_len=32)
    too_long = sched.add_request(make_req('long', range(100, 127), 2))
    assert too_long.abort is AbortReason.PROMPT_TOO_LONG
    unfit = sched.add_request(make_req('greedy', range(100, 110), 40))
    assert unfit.abort is AbortReason.MAX_NEW_TOKENS_UNFIT
    assert 'at most 20' in unfit.message
    fine = make_req('fine', range(100, 110), 20)
    assert sched.add_request(fine) is None
    assert [r.rid for r in run_until_idle(sched)] == ['fine']
    assert fine.output_ids == expected_outputs(fine)
    assert sched.metrics.aborts_by_reason == {'prompt_too_long': 1, 'max_new_tokens_unfit': 1}


def test_a_duplicate_request_id_is_refused_without_touching_the_live_one() -> None:
    sched = make_scheduler()
    first = make_req('same', [1, 2, 3], 2)
    sched.add_request(first)
    assert sched.add_request(make_req('same', [4, 5, 6], 2)).abort is AbortReason.DUPLICATE_RID
    assert [r.rid for r in run_until_idle(sched)] == ['same']
    assert first.output_ids == expected_outputs(first)
