"""The sequential baseline keeps the robot rules as the scheduled core does, through the same
``RobotRules``: a newer step supersedes the waiting one, an older one is refused, and a step
past its deadline is dropped, or delivered marked late."""

from __future__ import annotations

import time

import numpy as np
import pytest

from vla_sched.engine.config import EngineConfig
from vla_sched.engine.sequential_core import SequentialCore
from vla_sched.ipc.messages import FailureReason, StepFailure, StepRequest, StepResult

pytestmark = pytest.mark.slow


def _request(robot_id: str, step_seq: int, **overrides) -> StepRequest:
    now = time.time_ns()
    fields = dict(
        robot_id=robot_id, step_seq=step_seq, stamp_ns=now, deadline_ns=now + 120 * 10**9,
        received_ns=now, images=(np.full((20, 30, 3), step_seq, np.uint8),),
        state=np.zeros(0, np.float32), instruction='pick up the cup', instruction_version=1,
    )  # fmt: skip
    fields.update(overrides)
    return StepRequest(**fields)


def _drain(core: SequentialCore) -> list:
    out: list = []
    while core.has_work():
        out += core.step(time.time_ns())
    return out


@pytest.fixture(scope='module', params=['drop', 'deliver_late'])
def core(request):
    c = SequentialCore.from_config(EngineConfig(core='sequential', late_policy=request.param))
    yield c
    c.close()


def test_a_newer_step_supersedes_the_waiting_one(core):
    assert core.submit(_request('r1', 1), time.time_ns()) == []
    (superseded,) = core.submit(_request('r1', 2), time.time_ns())
    assert (superseded.step_seq, superseded.reason) == (1, FailureReason.SUPERSEDED)
    (out,) = _drain(core)
    assert isinstance(out, StepResult) and out.step_seq == 2
    assert core.metrics.robot('r1').num_superseded == 1


def test_an_older_step_than_the_waiting_one_is_refused_and_the_newer_one_runs(core):
    assert core.submit(_request('r2', 5), time.time_ns()) == []
    (refused,) = core.submit(_request('r2', 4), time.time_ns())
    assert (refused.step_seq, refused.reason) == (4, FailureReason.SUPERSEDED)
    assert 'not newer' in refused.detail
    (out,) = _drain(core)
    assert isinstance(out, StepResult) and out.step_seq == 5


def test_a_step_past_its_deadline_is_dropped_or_delivered_late_by_the_policy(core):
    now = time.time_ns()
    late = _request('r3', 1, stamp_ns=now - 10**9, received_ns=now - 10**9, deadline_ns=now - 1)
    assert core.submit(late, now) == []
    (out,) = _drain(core)
    if core.rules.drops_late_steps:
        assert isinstance(out, StepFailure) and out.reason is FailureReason.DEADLINE_MISSED
    else:
        assert isinstance(out, StepResult) and out.late
    assert core.metrics.robot('r3').num_deadline_misses == 1
