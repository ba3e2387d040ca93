"""Under ``drop``, a waiting step that cannot finish before its deadline is not started."""

from __future__ import annotations

from sched_testing import make_req, make_scheduler, run_until_idle

from vla_sched.core.scheduling.expiry import MIN_SERVICE_SAMPLES
from vla_sched.core.scheduling.request import AbortReason
from vla_sched.testing.sim_runner import CostModel

MS = 1_000_000


def _warm_up(sched) -> float:
    """Complete enough steps for a service-time estimate; return its median (ms)."""
    for i in range(MIN_SERVICE_SAMPLES):
        sched.add_request(make_req(f'warm-{i}', [1, 2, 3, 4], 3, robot_id='w', step_seq=i + 1))
        run_until_idle(sched)
    assert len(sched.metrics.admitted_to_finish) == MIN_SERVICE_SAMPLES
    return sched.metrics.admitted_to_finish.percentile_ms(50)


def test_a_step_with_less_time_left_than_a_step_takes_is_dropped_before_admission():
    sched = make_scheduler(late_policy='drop', drop_unmeetable_steps=True, cost_model=CostModel())
    service_ms = _warm_up(sched)
    assert service_ms > 1
    busy = make_req('busy', [9, 9, 9], 40, robot_id='b', step_seq=1)
    sched.add_request(busy)
    sched.run_once()  # another robot's step is running: the doomed one would compete
    now = sched.clock()
    doomed = make_req('doomed', [5, 6, 7], 3, robot_id='r', step_seq=1,
                      deadline_ns=now + int(service_ms * MS / 2))  # fmt: skip
    fine = make_req('fine', [5, 6, 8], 3, robot_id='q', step_seq=1,
                    deadline_ns=now + int(service_ms * MS * 4))  # fmt: skip
    sched.add_request(doomed)
    sched.add_request(fine)
    done = run_until_idle(sched)
    sched.check_integrity()
    assert doomed.finished_reason.abort is AbortReason.DEADLINE_MISSED
    assert 'cannot meet its deadline' in doomed.finished_reason.message
    assert doomed.times.admitted_ns is None  # never took compute
    assert not fine.finished_reason.is_abort and len(fine.output_ids) == 3
    assert sched.metrics.robot('r').num_deadline_misses == 1
    assert {r.rid for r in done} == {'doomed', 'fine', 'busy'}


def test_without_the_rule_or_without_samples_the_step_is_admitted():
    sched = make_scheduler(late_policy='drop', drop_unmeetable_steps=False, cost_model=CostModel())
    service_ms = _warm_up(sched)
    tight = make_req('tight', [5, 6, 7], 3, robot_id='r', step_seq=1,
                     deadline_ns=sched.clock() + int(service_ms * MS / 2))  # fmt: skip
    sched.add_request(tight)
    run_until_idle(sched)
    assert tight.times.admitted_ns is not None

    cold = make_scheduler(late_policy='drop', drop_unmeetable_steps=True)
    early = make_req('early', [5, 6, 7], 3, robot_id='r', step_seq=1,
                     deadline_ns=cold.clock() + 1)  # fmt: skip
    cold.add_request(early)
    cold.run_once()
    assert early.times.admitted_ns is not None  # no service samples yet: no prediction


def test_a_step_that_would_run_alone_is_tried_even_with_little_time_left():
    sched = make_scheduler(late_policy='drop', drop_unmeetable_steps=True, cost_model=CostModel())
    service_ms = _warm_up(sched)
    alone = make_req('alone', [5, 6, 7], 3, robot_id='r', step_seq=1,
                     deadline_ns=sched.clock() + int(service_ms * MS / 2))  # fmt: skip
    sched.add_request(alone)
    sched.run_once()
    assert alone.times.admitted_ns is not None  # a stale estimate must not starve a robot
