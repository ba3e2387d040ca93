"""A prefill pass is sized from the measured cost per token so one long step never makes the
others late: it waits for a pass of its own, or is refused when even that would be late."""

from __future__ import annotations

import pytest
from sched_testing import make_req, make_scheduler

from vla_sched.core.scheduling.pass_cost import PassCostModel
from vla_sched.core.scheduling.request import AbortReason, Req
from vla_sched.testing.sim_runner import CostModel

MS = 1_000_000
# A pass costs 2 ms plus 0.1 ms per token: 8 short steps 34 ms, a long one 102 ms, both 134 ms.
COST = CostModel(prefill_base_ns=2 * MS, prefill_ns_per_token=MS // 10)
SHORT_TOKENS, LONG_TOKENS = 40, 1000


def _step(rid: str, num_tokens: int, *, robot: str, deadline_ns: int | None = None) -> Req:
    prompt = [hash((rid, i)) % 900 + 1 for i in range(num_tokens)]
    return make_req(rid, prompt, 0, prefill_only=True, robot_id=robot, step_seq=1,
                    deadline_ns=deadline_ns)  # fmt: skip


def _scheduler(*, sizing: bool, late_policy: str = 'drop'):
    sched = make_scheduler(
        cost_model=COST, num_pages=8192, num_req_slots=16, max_context_len=1024,
        chunked_prefill_size=None, max_prefill_tokens=16384, late_policy=late_policy,
        size_passes_by_deadline=sizing,
    )  # fmt: skip
    for i, size in enumerate((10, 20, 30, 40)):  # measured passes of four sizes
        sched.add_request(_step(f'warm{i}', size, robot=f'w{i}'))
        _run(sched)
    return sched


def _run(sched, max_iters: int = 100) -> list[Req]:
    done: list[Req] = []
    for _ in range(max_iters):
        if not sched.has_work():
            return done
        done += sched.run_once()
        sched.check_integrity()
    raise AssertionError('the scheduler did not go idle')


def _workload(sched, *, long_deadline_ms: float) -> tuple[Req, list[Req]]:
    """The long step first in the queue, then eight short ones due sooner."""
    now = sched.clock()
    long = _step('long', LONG_TOKENS, robot='L', deadline_ns=now + int(long_deadline_ms * MS))
    shorts = [_step(f's{i}', SHORT_TOKENS, robot=f'r{i}', deadline_ns=now + 60 * MS)
              for i in range(8)]  # fmt: skip
    for req in (long, *shorts):
        assert sched.add_request(req) is None
    return long, shorts


def _on_time(req: Req) -> bool:
    return not req.finished_reason.is_abort and req.times.finished_ns <= req.deadline_ns


def test_the_cost_per_token_is_learned_from_the_passes_that_ran():
    sched = _scheduler(sizing=True)
    base, per_token = sched.metrics.pass_cost.prefill_line()
    assert base == pytest.approx(2 * MS) and per_token == pytest.approx(MS / 10)


def test_without_sizing_the_long_step_makes_every_short_one_late():
    sched = _scheduler(sizing=False)
    _, shorts = _workload(sched, long_deadline_ms=200)
    _run(sched)
    assert not any(_on_time(r) for r in shorts)
    assert len(sched.runner.batches[-1].rids) == 9  # one pass of 1320 tokens: 134 ms


def test_a_long_step_waits_for_a_pass_of_its_own_and_every_step_is_on_time():
    sched = _scheduler(sizing=True)
    long, shorts = _workload(sched, long_deadline_ms=200)
    _run(sched)
    assert all(_on_time(r) for r in (long, *shorts))
    passes = [list(fb.rids) for fb in sched.runner.batches[4:]]
    assert passes == [[r.rid for r in shorts], ['long']]  # the short ones first, all together
    assert sched.metrics.num_deadline_waits >= 1
    assert sum(r.num_deadline_misses for r in sched.metrics.robots.values()) == 0


def test_a_step_that_cannot_fit_even_alone_is_refused_and_the_others_are_on_time():
    sched = _scheduler(sizing=True)
    long, shorts = _workload(sched, long_deadline_ms=50)  # its own pass alone takes 102 ms
    done = _run(sched)
    assert long.finished_reason.abort is AbortReason.DEADLINE_MISSED
    assert 'cannot meet its deadline: a pass of its 1000 tokens takes 102.0 ms' in (
        long.finished_reason.message
    )
    assert long.times.admitted_ns is None and long in done
    assert all(_on_time(r) for r in shorts)
    assert sched.metrics.robot('L').num_deadline_misses == 1


def test_a_step_too_long_for_its_deadline_is_still_tried_when_nothing_else_waits():
    sched = _scheduler(sizing=True)
    alone = _step('alone', LONG_TOKENS, robot='L', deadline_ns=sched.clock() + 50 * MS)
    sched.add_request(alone)
    _run(sched)
    assert alone.times.admitted_ns is not None  # a stale estimate must not starve a robot


def test_under_deliver_late_a_step_too_long_for_its_deadline_is_served_alone():
    sched = _scheduler(sizing=True, late_policy='deliver_late')
    long, shorts = _workload(sched, long_deadline_ms=50)
    _run(sched)
    assert not long.finished_reason.is_abort and long.late
    assert all(_on_time(r) for r in shorts)
    assert [len(fb.rids) for fb in sched.runner.batches[4:]] == [8, 1]


def test_a_cost_model_predicts_nothing_before_its_samples_and_then_the_line():
    cost = PassCostModel(min_samples=2)
    assert cost.prefill_ns(100) is None and cost.decode_step_ns() is None
    cost.record_prefill(100, 12 * MS)
    assert cost.prefill_ns(100) is None
    cost.record_prefill(300, 32 * MS)
    assert cost.prefill_ns(200) == pytest.approx(22 * MS)
    cost.record_decode(4, 8 * MS)
    cost.record_decode(1, 2 * MS)
    assert cost.decode_step_ns() == pytest.approx(2 * MS)
