"""Periodic robots fire on their own phases of the period, and return to them after a stall
instead of firing together from then on (ROS-free, on a fake clock)."""

from __future__ import annotations

import numpy as np
import pytest

from vla_sched.ipc.messages import StepRequest, StepResult
from vla_sched.ros.camera_sync import CameraFrame
from vla_sched.ros.node_config import RobotConfig
from vla_sched.ros.period_phase import PeriodSchedule
from vla_sched.ros.robot_slot import RobotSlot

MS = 1_000_000
PERIOD = 100 * MS
SERVICE = 20 * MS  # the engine answers every step this long after it was sent
NUM_ROBOTS = 4


def _slots() -> list[RobotSlot]:
    return [
        RobotSlot(
            RobotConfig(robot_id=f'r{i}', period_s=PERIOD / 1e9, instruction='pick it up'),
            window_s=1.0, created_ns=0, phase=i / NUM_ROBOTS,
        )
        for i in range(NUM_ROBOTS)
    ]  # fmt: skip


def _result(step: StepRequest) -> StepResult:
    return StepResult(
        robot_id=step.robot_id, step_seq=step.step_seq, stamp_ns=step.stamp_ns,
        actions=np.zeros((2, 7), np.float32), queue_ms=0.0, prefill_ms=0.0, decode_ms=0.0,
        late=False, num_cached_prefix_tokens=0,
    )  # fmt: skip


def _run(slots, *, until_ns: int, stall=(0, 0)) -> dict[str, list[int]]:
    """Drive the robots as the node does, 1 ms at a time: a new image every ms, due robots
    send, each step answered ``SERVICE`` later. During ``stall`` (start, end) the node does not
    run; what came due meanwhile is handled at its end. Returns each robot's send times."""
    sent: dict[str, list[int]] = {s.robot_id: [] for s in slots}
    answers: dict[str, tuple[int, StepRequest]] = {}
    for now in range(0, until_ns, MS):
        if stall[0] <= now < stall[1]:
            continue
        for slot in slots:
            answer = answers.get(slot.robot_id)
            if answer is not None and answer[0] <= now:
                del answers[slot.robot_id]
                step = answer[1]
                slot.finish(_result(step), now)
            image = np.zeros((2, 2, 3), np.uint8)
            slot.offer_image(CameraFrame(image=image, stamp_ns=now, received_ns=now))
            if slot.is_due(now):
                step = slot.take_step(now, budget_ns=500 * MS, num_state=0, num_images=1,
                                      priority=0)  # fmt: skip
                assert isinstance(step, StepRequest), step
                slot.mark_sent(step)
                sent[slot.robot_id].append(now)
                answers[slot.robot_id] = (now + SERVICE, step)
    return sent


def _phases_ms(sent: dict[str, list[int]], after_ns: int) -> list[set[int]]:
    return [{(t % PERIOD) // MS for t in times if t >= after_ns} for times in sent.values()]


def test_robots_fire_on_phases_spread_across_the_period():
    sent = _run(_slots(), until_ns=1000 * MS)
    assert _phases_ms(sent, after_ns=PERIOD) == [{0}, {25}, {50}, {75}]
    assert all(len(times) >= 9 for times in sent.values())


def test_after_a_stall_the_robots_return_to_distinct_phases():
    sent = _run(_slots(), until_ns=6000 * MS, stall=(1000 * MS, 3000 * MS))
    after = _phases_ms(sent, after_ns=3000 * MS + PERIOD)
    assert after == [{0}, {25}, {50}, {75}]  # not one phase for all, as firing at once gives
    for times in sent.values():  # and a step every period again
        later = [t for t in times if t >= 3000 * MS + PERIOD]
        assert set(np.diff(later)) == {PERIOD}


def test_a_step_a_little_late_keeps_the_phase_and_a_stalled_one_waits_for_it():
    schedule = PeriodSchedule(PERIOD, phase=0.25)
    assert schedule.is_due(3 * MS)  # the first step: at once
    schedule.advance(3 * MS)
    assert schedule.next_due_ns == 25 * MS
    assert not schedule.is_due(24 * MS) and schedule.is_due(40 * MS)  # 15 ms late: fires
    schedule.advance(40 * MS)
    assert schedule.next_due_ns == 125 * MS
    assert not schedule.is_due(460 * MS)  # a stall: back to the phase, not now
    assert schedule.next_due_ns == 525 * MS and schedule.num_realigned == 1
    assert schedule.is_due(2 * PERIOD * 10 + 30 * MS)  # 5 ms past a phase time: fires
    assert schedule.next_due_ns == 2025 * MS


def test_a_phase_outside_the_period_is_refused():
    with pytest.raises(ValueError, match='phase'):
        PeriodSchedule(PERIOD, phase=1.0)
