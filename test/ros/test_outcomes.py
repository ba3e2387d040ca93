"""A finished step's outcome, without a node: its chunk is published whole, the arm gets only
actions due at least the robot's minimum lead ahead, and a chunk that arrives with nothing
left to execute is counted with its cause and turns the robot's status WARN."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest

from vla_sched.ipc.messages import StepResult
from vla_sched.ros import diagnostics
from vla_sched.ros.camera_sync import CameraFrame
from vla_sched.ros.conversions import stamp_to_ns
from vla_sched.ros.node_config import DiagnosticsConfig, RobotConfig
from vla_sched.ros.outcomes import Outcomes
from vla_sched.ros.outputs import ArmCommands
from vla_sched.ros.robot_slot import RobotSlot

MS = 1_000_000
STAMP = 50_000 * MS
JOINTS = ('j0', 'j1')


@dataclass
class _Publisher:
    sent: list = field(default_factory=list)

    def publish(self, msg) -> None:
        self.sent.append(msg)


@dataclass
class _Topics:
    """The part of RobotTopics that Outcomes uses."""

    drives_arm: bool
    chunks: _Publisher = field(default_factory=_Publisher)
    rejected: _Publisher = field(default_factory=_Publisher)
    arm: list[ArmCommands] = field(default_factory=list)

    def publish_arm(self, commands: ArmCommands) -> None:
        self.arm.append(commands)


class _Logger:
    def debug(self, line: str) -> None:
        pass

    def warning(self, line: str) -> None:
        pass


def _robot(*, trajectory: bool) -> RobotConfig:
    return RobotConfig(
        'r1',
        instruction='pick it up',
        action_space='joint_position',
        action_joint_names=JOINTS,
        publish_joint_trajectory=trajectory,
        trigger='on_image',
        dt=0.1,
    )


def _publish(robot: RobotConfig, *, latency_ms: float) -> tuple[RobotSlot, _Topics]:
    """One step of a horizon-1 chunk stamped ``STAMP`` whose result comes ``latency_ms``
    later."""
    slot = RobotSlot(robot, window_s=5.0, created_ns=0)
    topics = _Topics(drives_arm=robot.publish_joint_trajectory)
    outcomes = Outcomes({'r1': slot}, {'r1': topics}, late_policy='deliver_late', logger=_Logger())
    slot.offer_image(CameraFrame(np.zeros((2, 2, 3), np.uint8), STAMP, STAMP))
    step = slot.take_step(STAMP, budget_ns=10_000 * MS, num_state=0, num_images=1, priority=0)
    slot.mark_sent(step)
    result = StepResult(
        robot_id='r1',
        step_seq=step.step_seq,
        stamp_ns=STAMP,
        actions=np.ones((1, 2), np.float32),
        queue_ms=0.0,
        prefill_ms=0.0,
        decode_ms=0.0,
        late=False,
        num_cached_prefix_tokens=0,
    )
    outcomes.result(result, STAMP + round(latency_ms * MS), None)
    return slot, topics


def _status(slot: RobotSlot, latency_ms: float) -> diagnostics.StatusData:
    view = slot.view(STAMP + round(latency_ms * MS))
    return diagnostics.robot_data(view, None, DiagnosticsConfig(), node_name='/vla_sched')


@pytest.mark.parametrize('trajectory', [True, False])
def test_a_chunk_arriving_after_its_end_is_published_counted_and_warned_with_its_cause(
    trajectory,
):
    # tiny OpenVLA: 118 ms from image to chunk, one action of dt 100 ms
    slot, topics = _publish(_robot(trajectory=trajectory), latency_ms=118)
    assert len(topics.chunks.sent) == 1 and topics.arm == []  # the chunk, nothing for the arm
    assert slot.num_chunks == 1 and slot.num_chunks_all_past == 1
    status = _status(slot, 118)
    assert status.level == diagnostics.WARN
    assert status.message.startswith('latency 118.0 ms > horizon x dt 100 ms: 1 chunks')


def test_a_chunk_whose_last_action_is_within_the_lead_sends_nothing_and_says_so():
    slot, topics = _publish(_robot(trajectory=True), latency_ms=90)
    assert topics.arm == [] and slot.num_chunks_all_past == 1
    assert _status(slot, 90).message.startswith(
        'latency 90.0 ms + min_lead_s 15 ms > horizon x dt 100 ms'
    )


def test_a_chunk_with_an_action_beyond_the_lead_reaches_the_arm_and_the_robot_is_ok():
    slot, topics = _publish(_robot(trajectory=True), latency_ms=80)
    (commands,) = topics.arm
    assert [stamp_to_ns(p.time_from_start) for p in commands.trajectory.points] == [20 * MS]
    assert slot.num_chunks_all_past == 0
    assert _status(slot, 80).level == diagnostics.OK
