"""Priority scheduling: preemption of running requests, the queue limit, defaults."""

from __future__ import annotations

import sys

from sched_testing import (
    expected_outputs,
    make_req,
    make_scheduler,
    run_until_idle,
)

from vla_sched.core.scheduling.request import AbortReason, FinishKind


def _prio_scheduler(**config: object):
    config.setdefault('enable_priority_scheduling', True)
    return make_scheduler(num_pages=256, **config)


def _start_two_low(sched) -> tuple:
    low1 = make_req('low1', range(10, 16), 6, priority=0)
    low2 = make_req('low2', range(20, 26), 6, priority=0)
    sched.add_request(low1)
    sched.clock.advance(1)
    sched.add_request(low2)
    sched.run_once()  # both prefilled
    sched.run_once()  # both decoding
    assert [r.rid for r in sched.running_batch.reqs] == ['low1', 'low2']
    return low1, low2


def test_a_much_more_important_request_preempts_the_newest_least_important_one() -> None:
    sched = _prio_scheduler(max_running_requests=2)
    low1, low2 = _start_two_low(sched)
    vip = make_req('vip', range(30, 36), 3, priority=11)
    sched.add_request(vip)
    sched.run_once()
    assert [r.rid for r in sched.running_batch.reqs] == ['low1']
    assert sched.waiting_queue == [low2]
    assert (low2.is_retracted, low2.kv.holds_memory) == (True, False)
    assert sched.metrics.num_preemptions == 1
    done = run_until_idle(sched)
    assert {r.rid for r in done} == {'low1', 'low2', 'vip'}
    for req in (low1, low2, vip):
        assert req.finished_reason.kind is FinishKind.LENGTH
        assert req.output_ids == expected_outputs(req)


def test_a_priority_margin_equal_to_the_threshold_does_not_preempt() -> None:
    sched = _prio_scheduler(max_running_requests=2)
    _start_two_low(sched)
    sched.add_request(make_req('vip', range(30, 36), 3, priority=10))
    sched.run_once()
    assert [r.rid for r in sched.running_batch.reqs] == ['low1', 'low2']
    assert [r.rid for r in sched.waiting_queue] == ['vip']
    assert sched.metrics.num_preemptions == 0


def test_preemption_can_be_disabled_while_priority_still_orders_the_queue() -> None:
    sched = _prio_scheduler(max_running_requests=2, disable_priority_preemption=True)
    _start_two_low(sched)
    sched.add_request(make_req('vip', range(30, 36), 3, priority=50))
    sched.run_once()
    assert sched.metrics.num_preemptions == 0


def test_a_full_queue_rejects_the_newcomer_without_priority() -> None:
    sched = make_scheduler(max_queued_requests=2)
    assert sched.add_request(make_req('a', [1, 2], 1)) is None
    assert sched.add_request(make_req('b', [3, 4], 1)) is None
    reason = sched.add_request(make_req('c', [5, 6], 1))
    assert reason.abort is AbortReason.QUEUE_FULL
    assert "request 'c'" in reason.message
    assert [r.rid for r in sched.waiting_queue] == ['a', 'b']
    assert sched.metrics.aborts_by_reason['queue_full'] == 1


def test_a_full_queue_drops_its_least_important_request_for_a_strictly_better_one() -> None:
    sched = _prio_scheduler(max_queued_requests=2)
    sched.add_request(make_req('p1', [1, 2], 1, priority=1))
    sched.add_request(make_req('p5', [3, 4], 1, priority=5))
    assert sched.add_request(make_req('p3', [5, 6], 1, priority=3)) is None
    assert [r.rid for r in sched.waiting_queue] == ['p5', 'p3']
    assert sched.add_request(make_req('again3', [7, 8], 1, priority=3)).abort is (
        AbortReason.QUEUE_FULL
    )
    dropped = sched.run_once()[0]
    assert dropped.rid == 'p1'
    assert dropped.finished_reason.abort is AbortReason.PREEMPTED_BY_PRIORITY


def test_a_priority_while_priority_scheduling_is_off_aborts_only_that_request() -> None:
    sched = make_scheduler()
    reason = sched.add_request(make_req('bad', [1, 2, 3], 2, priority=4))
    assert reason.abort is AbortReason.PRIORITY_DISABLED
    good = make_req('good', [4, 5, 6], 2)
    assert sched.add_request(good) is None
    done = run_until_idle(sched)
    assert [r.rid for r in done] == ['good']
    assert good.output_ids == expected_outputs(good)


def test_missing_priorities_come_from_the_robot_or_are_the_least_important() -> None:
    sched = _prio_scheduler(robot_priorities=(('arm', 7),))
    arm = make_req('arm-1', [1, 2], 1, robot_id='arm')
    anon = make_req('anon', [3, 4], 1)
    given = make_req('given', [5, 6], 1, robot_id='arm', step_seq=2, priority=2)
    for req in (arm, anon):
        sched.add_request(req)
    assert (arm.priority, anon.priority) == (7, -sys.maxsize - 1)
    low_first = _prio_scheduler(schedule_low_priority_values_first=True)
    other = make_req('other', [3, 4], 1)
    low_first.add_request(other)
    low_first.add_request(given)
    assert (other.priority, given.priority) == (sys.maxsize, 2)
