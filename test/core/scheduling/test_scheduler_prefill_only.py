"""Prefill-only requests (OpenVLA-OFT's steps): one whole pass each, an action chunk out, no
KV kept, never chunked, never mixed with token prefills or decoding rows."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sched_testing import (
    SAMPLING,
    launched,
    make_req,
    make_scheduler,
    run_until_idle,
)

from vla_sched.core.forward_batch import ForwardBatch, ForwardMode
from vla_sched.core.scheduling.request import AbortReason, FinishKind, Req
from vla_sched.testing.sim_runner import reference_action_chunk


def _one_pass(rid: str, prompt, *, robot: str | None = None, proprio=None, **fields) -> Req:
    return make_req(rid, prompt, 0, prefill_only=True, robot_id=robot, proprio=proprio, **fields)


def _expected_chunk(req: Req) -> np.ndarray:
    return reference_action_chunk(req.origin_input_ids, req.images, req.proprio, (8, 7))


@pytest.mark.parametrize('overlap', [False, True])
def test_steps_of_several_robots_run_in_one_pass_and_leave_no_kv(overlap: bool) -> None:
    sched = make_scheduler(enable_overlap=overlap, page_size=4)
    total = sched.memory.num_free_tokens()
    reqs = [
        _one_pass(f'r{i}', range(10 * i + 1, 10 * i + 9), robot=f'robot{i}',
                  proprio=np.full(3, i, np.float32))
        for i in range(3)
    ]  # fmt: skip
    for req in reqs:
        assert sched.add_request(req) is None
    done = run_until_idle(sched)
    assert {r.rid for r in done} == {'r0', 'r1', 'r2'}
    assert launched(sched) == [('extend', [('r0', 0, 8), ('r1', 0, 8), ('r2', 0, 8)])]
    batch = sched.runner.batches[0]
    assert batch.prefill_only and len(batch.proprio) == 3
    for req in reqs:
        assert req.finished_reason.kind is FinishKind.LENGTH
        assert req.output_ids == []
        np.testing.assert_array_equal(req.action_chunk, _expected_chunk(req))
        assert req.times.first_token_ns is not None
    assert sched.memory.num_free_tokens() == total
    assert sched.memory.evictable_size() == 0


def test_a_second_identical_prompt_reuses_nothing() -> None:
    sched = make_scheduler(page_size=4)
    first = _one_pass('a', range(1, 13))
    sched.add_request(first)
    run_until_idle(sched)
    second = _one_pass('b', range(1, 13))
    sched.add_request(second)
    run_until_idle(sched)
    assert launched(sched)[1] == ('extend', [('b', 0, 12)])
    assert second.num_cached_tokens == 0
    np.testing.assert_array_equal(second.action_chunk, _expected_chunk(second))


def test_a_step_is_never_cut_into_chunks_it_waits_for_a_pass_with_room() -> None:
    sched = make_scheduler(page_size=4, chunked_prefill_size=16)
    for i in range(3):
        sched.add_request(_one_pass(f'r{i}', range(20 * i + 1, 20 * i + 11)))
    run_until_idle(sched)
    assert launched(sched) == [
        ('extend', [('r0', 0, 10)]),
        ('extend', [('r1', 0, 10)]),
        ('extend', [('r2', 0, 10)]),
    ]


def test_a_step_longer_than_one_pass_is_refused_at_once() -> None:
    sched = make_scheduler(page_size=4, chunked_prefill_size=16)
    req = _one_pass('long', range(1, 18))
    reason = sched.add_request(req)
    assert reason is not None and reason.abort is AbortReason.PROMPT_TOO_LONG
    assert 'one pass' in reason.message
    sched.check_integrity()


@pytest.mark.parametrize('overlap', [False, True])
def test_token_requests_and_prefill_only_steps_never_share_a_pass(overlap: bool) -> None:
    sched = make_scheduler(enable_overlap=overlap, enable_mixed_chunk=True)
    tokens = make_req('t', range(1, 6), 3)
    sched.add_request(tokens)
    sched.run_once()  # t prefills and starts decoding
    sched.check_integrity()
    one_pass = _one_pass('p', range(50, 58))
    sched.add_request(one_pass)
    run_until_idle(sched)
    for fb in sched.runner.batches:
        rids = set(fb.rids)
        assert not ({'t', 'p'} <= rids), f'{fb.forward_mode}: {fb.rids}'
        assert fb.prefill_only == (rids == {'p'})
    assert len(tokens.output_ids) == 3
    np.testing.assert_array_equal(one_pass.action_chunk, _expected_chunk(one_pass))


def test_a_robot_has_one_prefill_only_step_in_flight_and_a_newer_one_supersedes() -> None:
    sched = make_scheduler()
    older = _one_pass('s1', range(1, 9), robot='arm', step_seq=1)
    newer = _one_pass('s2', range(1, 9), robot='arm', step_seq=2)
    sched.add_request(older)
    sched.add_request(newer)
    done = run_until_idle(sched)
    assert older.finished_reason.abort is AbortReason.SUPERSEDED
    assert newer.finished_reason.kind is FinishKind.LENGTH
    assert {r.rid for r in done} == {'s1', 's2'}


def test_a_prefill_only_request_generates_nothing_and_continues_no_session() -> None:
    with pytest.raises(ValueError, match='prefill-only'):
        Req(rid='x', origin_input_ids=(1, 2), sampling=SAMPLING, max_new_tokens=1,
            prefill_only=True)  # fmt: skip
    with pytest.raises(ValueError, match='prefill-only'):
        Req(rid='x', origin_input_ids=(1, 2), sampling=SAMPLING, max_new_tokens=0,
            prefill_only=True, session_id='arm')  # fmt: skip
    with pytest.raises(ValueError, match='>= 1'):
        Req(rid='x', origin_input_ids=(1, 2), sampling=SAMPLING, max_new_tokens=0)


def _batch(**fields) -> ForwardBatch:
    base = dict(
        forward_mode=ForwardMode.EXTEND,
        rids=('a',),
        req_pool_indices=torch.tensor([0]),
        prefix_lens=torch.tensor([0]),
        extend_lens=torch.tensor([3]),
        seq_lens=torch.tensor([3]),
        input_ids=torch.tensor([1, 2, 3]),
        out_cache_loc=torch.tensor([0, 1, 2]),
        sample=(True,),
        sampling=(SAMPLING,),
        images=((),),
        prefill_only=True,
    )
    base.update(fields)
    return ForwardBatch(**base)


def test_a_prefill_only_batch_is_checked_as_whole_extend_passes() -> None:
    _batch().check()
    with pytest.raises(ValueError, match='no cached prefix'):
        _batch(prefix_lens=torch.tensor([1]), seq_lens=torch.tensor([4])).check()
    with pytest.raises(ValueError, match='no cached prefix'):
        _batch(sample=(False,)).check()
    with pytest.raises(ValueError, match='one entry per request'):
        _batch(proprio=(None, None)).check()
