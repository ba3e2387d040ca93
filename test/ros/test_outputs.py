"""The published messages: a chunk's arm commands hold only what is still to come, never an
action due within the robot's minimum lead, and are accepted by a JointTrajectoryController at
every latency; every refusal reason has its StepRejected value."""

from __future__ import annotations

import numpy as np
import pytest
from rclpy.duration import Duration
from rclpy.qos import DurabilityPolicy, HistoryPolicy, ReliabilityPolicy
from trajectory_controller_rules import controller_refusal

from vla_sched.ipc.messages import FailureReason, StepResult
from vla_sched.msg import ActionChunk, StepRejected
from vla_sched.ros import outputs
from vla_sched.ros.conversions import stamp_to_ns
from vla_sched.ros.node_config import RobotConfig
from vla_sched.ros.robot_slot import Refusal
from vla_sched.ros.robot_topics import control_qos

MS = 1_000_000
S = 1_000_000_000
STAMP = 100 * S  # the image stamp of every chunk here
JOINTS = ('j0', 'j1', 'j2')


def _chunk(robot: RobotConfig, actions: np.ndarray, names: tuple[str, ...]) -> ActionChunk:
    result = StepResult(
        robot_id=robot.robot_id,
        step_seq=4,
        stamp_ns=STAMP,
        actions=actions.astype(np.float32),
        queue_ms=1.0,
        prefill_ms=2.0,
        decode_ms=3.0,
        late=False,
        num_cached_prefix_tokens=0,
    )
    return outputs.action_chunk(
        result, robot, deadline_ns=STAMP + S, published_ns=STAMP, joint_names=names, late=False
    )


def _arm(*, start: str = 'now', dt: float = 0.1, min_lead_s: float = 0.015) -> RobotConfig:
    return RobotConfig(
        'arm',
        action_space='joint_position',
        action_joint_names=JOINTS,
        publish_joint_trajectory=True,
        joint_trajectory_start=start,
        dt=dt,
        min_lead_s=min_lead_s,
        frame_id='arm/base',
    )


def _rows(horizon: int, dof: int) -> np.ndarray:
    return np.arange(horizon * dof, dtype=np.float32).reshape(horizon, dof) / 10


def _trajectory(horizon: int, elapsed_ns: int, **arm) -> outputs.ArmCommands | None:
    robot = _arm(**arm)
    chunk = _chunk(robot, _rows(horizon, len(JOINTS)), JOINTS)
    return outputs.arm_commands(chunk, robot, published_ns=STAMP + elapsed_ns)


@pytest.mark.parametrize(
    ('elapsed_ns', 'first'),
    [
        (-5 * MS, 0),
        (0, 0),
        (99 * MS, 0),
        (100 * MS, 1),
        (250 * MS, 2),
        (399 * MS, 3),
        (400 * MS, 4),
    ],
)
def test_an_action_is_past_once_its_interval_has_ended(elapsed_ns, first):
    assert outputs.first_action_not_past(4, dt_ns=100 * MS, elapsed_ns=elapsed_ns) == first


def test_a_trajectory_stamped_now_holds_the_actions_to_come_shifted_by_the_time_elapsed():
    commands = _trajectory(4, elapsed_ns=130 * MS)
    traj = commands.trajectory
    assert stamp_to_ns(traj.header.stamp) == STAMP + 130 * MS  # the publication time
    assert traj.header.frame_id == 'arm/base' and list(traj.joint_names) == list(JOINTS)
    # action 0 ended at 100 ms: left out; action k is reached at (k + 1) * dt after the image
    assert [stamp_to_ns(p.time_from_start) for p in traj.points] == [70 * MS, 170 * MS, 270 * MS]
    rows = _rows(4, 3)
    for point, row in zip(traj.points, rows[1:], strict=True):
        np.testing.assert_allclose(point.positions, row, rtol=0, atol=1e-6)
    assert commands.twist is None and commands.gripper is None  # off for this robot


def test_a_trajectory_on_receipt_has_a_zero_stamp_and_the_same_points():
    now = _trajectory(4, elapsed_ns=130 * MS).trajectory
    on_receipt = _trajectory(4, elapsed_ns=130 * MS, start='on_receipt').trajectory
    assert stamp_to_ns(on_receipt.header.stamp) == 0
    assert on_receipt.points == now.points


def test_horizon_one_is_sent_while_its_action_is_not_past():
    traj = _trajectory(1, elapsed_ns=60 * MS).trajectory
    assert [stamp_to_ns(p.time_from_start) for p in traj.points] == [40 * MS]
    assert _trajectory(1, elapsed_ns=100 * MS) is None  # past: nothing left, nothing sent


def test_a_chunk_whose_actions_are_all_past_yields_no_command():
    assert _trajectory(4, elapsed_ns=400 * MS) is None
    assert _trajectory(4, elapsed_ns=3 * S) is None


def _latencies(horizon: int, lead_ns: int) -> list[int]:
    """Every 0.5 ms up to the chunk's end and past it, and 1 ns either side of each action's
    end and of each action's end less the lead."""
    latencies = set(range(0, (horizon + 1) * 100 * MS, MS // 2))
    ends = [k * 100 * MS for k in range(1, horizon + 1)]
    latencies |= {end - d + e for end in ends for d in (0, lead_ns) for e in (-1, 0, 1)}
    return sorted(t for t in latencies if t >= 0)


@pytest.mark.parametrize('lead_s', [0.015, 0.04])
@pytest.mark.parametrize('horizon', [1, 2, 8])
@pytest.mark.parametrize('start', ['now', 'on_receipt'])
def test_every_trajectory_is_accepted_at_every_latency_up_to_the_chunks_end(
    horizon, start, lead_s
):
    lead_ns = round(lead_s * S)
    end_ns = horizon * 100 * MS
    sent = 0
    for latency in _latencies(horizon, lead_ns):
        commands = _trajectory(horizon, elapsed_ns=latency, start=start, min_lead_s=lead_s)
        if end_ns - latency < lead_ns:  # even the last action is due within the lead
            assert commands is None, latency
            continue
        sent += 1
        traj = commands.trajectory
        # received at any time within the lead of its publication, the controller takes it
        received = STAMP + latency + lead_ns - 1
        assert controller_refusal(traj, received_ns=received) is None, latency
        times = [stamp_to_ns(p.time_from_start) for p in traj.points]
        assert min(times) >= lead_ns, latency
        # an action due within the lead is dropped, not clamped: every point is reached at its
        # own action's end, the last one where the chunk ends (image stamp + horizon * dt)
        assert all((t + latency) % (100 * MS) == 0 for t in times), latency
        assert times[-1] == end_ns - latency
    assert sent > (end_ns - lead_ns) // (MS // 2)  # each latency that leaves a point sent one


def test_the_controller_check_refuses_a_point_due_before_it_arrives():
    """Without the lead (what the node sent before) a trajectory published 1 ms before its
    only point is due is refused by a controller that receives it 3 ms later."""
    traj = _trajectory(1, elapsed_ns=99 * MS, min_lead_s=0.0).trajectory
    assert [stamp_to_ns(p.time_from_start) for p in traj.points] == [1 * MS]
    received = STAMP + 102 * MS
    assert controller_refusal(traj, received_ns=received) == (
        'non-zero start time that ends in the past'
    )
    assert _trajectory(1, elapsed_ns=99 * MS) is None  # with the default lead: not sent


def test_an_action_due_within_the_lead_is_dropped_and_the_next_one_sent_at_its_own_time():
    traj = _trajectory(4, elapsed_ns=90 * MS).trajectory  # action 0 due in 10 ms < 15 ms
    assert [stamp_to_ns(p.time_from_start) for p in traj.points] == [110 * MS, 210 * MS, 310 * MS]
    np.testing.assert_allclose(traj.points[0].positions, _rows(4, 3)[1], rtol=0, atol=1e-6)
    at_lead = _trajectory(4, elapsed_ns=85 * MS).trajectory  # due in exactly 15 ms: kept
    assert stamp_to_ns(at_lead.points[0].time_from_start) == 15 * MS


@pytest.mark.parametrize(
    ('latency_ns', 'cause'),
    [
        (118 * MS, 'latency 118.0 ms > horizon x dt 100 ms'),
        (90 * MS, 'latency 90.0 ms + min_lead_s 15 ms > horizon x dt 100 ms'),
    ],
)
def test_a_chunk_with_nothing_left_says_why_in_words(latency_ns, cause):
    assert _trajectory(1, elapsed_ns=latency_ns) is None
    assert outputs.nothing_left(_arm(), horizon=1, latency_ns=latency_ns) == cause


def test_the_controller_check_refuses_what_the_old_output_sent():
    """The check above is the controller's: a trajectory stamped with the image stamp whose
    last point is already past (what the node published before) is refused."""
    traj = _trajectory(1, elapsed_ns=0).trajectory
    traj.header.stamp = _chunk(_arm(), _rows(1, 3), JOINTS).header.stamp
    traj.points[0].time_from_start.nanosec = 0
    assert controller_refusal(traj, received_ns=STAMP + 50 * MS) == (
        'non-zero start time that ends in the past'
    )


def _ee_robot(**outputs_on) -> RobotConfig:
    return RobotConfig('arm', dt=0.2, frame_id='arm/tool0', **outputs_on)


def test_the_twist_is_the_current_actions_delta_over_dt_in_the_chunks_frame():
    robot = _ee_robot(publish_twist=True, publish_gripper=True)
    actions = np.array(
        [
            [0.01, 0.02, 0.03, 0.1, 0.2, 0.3, 1.0],
            [0.02, -0.04, 0.06, -0.2, 0.0, 0.4, 0.0],
        ],
        np.float32,
    )
    chunk = _chunk(robot, actions, robot.action_names(7))
    commands = outputs.arm_commands(chunk, robot, published_ns=STAMP + 250 * MS)
    twist = commands.twist
    assert twist.header.frame_id == 'arm/tool0'
    assert stamp_to_ns(twist.header.stamp) == STAMP + 250 * MS
    linear, angular = twist.twist.linear, twist.twist.angular
    # 250 ms after the image, dt 0.2: action 1 is the current one
    np.testing.assert_allclose([linear.x, linear.y, linear.z], [0.1, -0.2, 0.3], rtol=1e-5)
    np.testing.assert_allclose([angular.x, angular.y, angular.z], [-1.0, 0.0, 2.0], rtol=1e-5)
    assert commands.gripper.data == 0.0  # action 1's gripper column
    assert commands.trajectory is None
    first = outputs.arm_commands(chunk, robot, published_ns=STAMP + 10 * MS)
    assert first.gripper.data == 1.0
    assert first.twist.twist.linear.x == pytest.approx(0.05)
    assert outputs.arm_commands(chunk, robot, published_ns=STAMP + 400 * MS) is None


def test_the_gripper_alone_is_sent_without_a_twist():
    robot = _ee_robot(publish_gripper=True)
    chunk = _chunk(robot, np.full((1, 7), 0.5, np.float32), robot.action_names(7))
    commands = outputs.arm_commands(chunk, robot, published_ns=STAMP)
    assert commands.twist is None and commands.gripper.data == 0.5


@pytest.mark.parametrize('reason', list(FailureReason))
def test_every_refusal_reason_has_its_step_rejected_value(reason):
    msg = outputs.step_rejected(Refusal('arm', 3, STAMP, reason, 'why'))
    name = f'REASON_{reason.name}'
    assert msg.reason == getattr(StepRejected, name)
    assert stamp_to_ns(msg.header.stamp) == STAMP and msg.detail == 'why'


def test_the_control_qos_keeps_the_newest_message_until_the_step_budget_ends():
    qos = control_qos(0.25)
    assert qos.history == HistoryPolicy.KEEP_LAST and qos.depth == 1
    assert qos.reliability == ReliabilityPolicy.RELIABLE
    assert qos.durability == DurabilityPolicy.VOLATILE  # a volatile subscriber matches
    assert qos.lifespan == Duration(nanoseconds=250 * MS)
