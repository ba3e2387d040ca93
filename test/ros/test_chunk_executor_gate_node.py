"""The executor's safety gate and starvation with real rclpy, in process: a chunk that jumps
from the measured joint state is refused, a good one reaches the stand-in controller (each
trajectory accepted by its rule), and once the chunk runs out the executor holds, then sends
the safe position after starvation_timeout_s; /diagnostics counts each."""

from __future__ import annotations

import time

import numpy as np
import pytest
import rclpy
from diagnostic_msgs.msg import DiagnosticArray
from rclpy.executors import SingleThreadedExecutor
from sensor_msgs.msg import JointState
from trajectory_controller_rules import controller_refusal
from trajectory_msgs.msg import JointTrajectory

from vla_sched.msg import ActionChunk
from vla_sched.ros.conversions import ns_to_stamp, stamp_to_ns

pytestmark = [pytest.mark.ros, pytest.mark.slow]  # rclpy nodes spinning in process

NAMESPACE = 'gate_test_arm'
JOINTS = ('j0', 'j1', 'j2')
DT_S = 0.1
MEASURED = 0.1


def _chunk(seq: int, stamp_ns: int, rows: np.ndarray) -> ActionChunk:
    msg = ActionChunk(robot_id=NAMESPACE, step_seq=seq, horizon=len(rows), dof=len(JOINTS))
    msg.header.stamp = ns_to_stamp(stamp_ns)
    msg.dt = DT_S
    msg.actions = np.asarray(rows, dtype=np.float32).reshape(-1)
    msg.joint_names = list(JOINTS)
    msg.action_space = ActionChunk.ACTION_SPACE_JOINT_POSITION
    msg.deadline = ns_to_stamp(stamp_ns + 500_000_000)
    return msg


@pytest.mark.ros
def test_the_gate_refuses_a_jump_plays_a_good_chunk_then_starvation_sends_the_safe_position():
    from vla_sched.ros.chunk_executor_node import ChunkExecutorNode

    context = rclpy.Context()
    rclpy.init(args=[], context=context)
    args = ['--ros-args', '-r', f'__ns:=/{NAMESPACE}', '-p', 'diagnostics_period_s:=0.05']
    args += ['-p', 'safety_gate:=refuse', '-p', 'starvation_action:=safe_position']
    args += ['-p', 'starvation_timeout_s:=0.3', '-p', 'safe_position_time_s:=2.0']
    args += ['-p', "safe_position:=['j0=0.0', 'j1=0.0', 'j2=0.0']"]
    limits = ', '.join(f"'{j} lower=-2 upper=2 velocity=1.0 acceleration=50'" for j in JOINTS)
    args += ['-p', f'joint_limits:=[{limits}]']
    executor_node = ChunkExecutorNode(context=context, cli_args=args)
    robot = rclpy.create_node('stand_in_robot', context=context)
    spinner = SingleThreadedExecutor(context=context)
    spinner.add_node(executor_node)
    spinner.add_node(robot)
    received, statuses = [], []
    robot.create_subscription(
        JointTrajectory,
        f'/{NAMESPACE}/joint_trajectory_controller/joint_trajectory',
        lambda m: received.append((time.time_ns(), m)),
        10,
    )
    robot.create_subscription(
        DiagnosticArray, '/diagnostics', lambda a: statuses.extend(a.status), 10
    )
    chunks = robot.create_publisher(ActionChunk, f'/{NAMESPACE}/vla/action_chunk', 10)
    states = robot.create_publisher(JointState, f'/{NAMESPACE}/joint_states', 10)

    def publish_state() -> None:
        msg = JointState(name=list(JOINTS), position=[MEASURED] * len(JOINTS))
        msg.header.stamp = robot.get_clock().now().to_msg()
        states.publish(msg)

    robot.create_timer(0.02, publish_state)

    def spin_until(predicate, timeout_s: float = 20.0) -> bool:
        end = time.monotonic() + timeout_s
        while not predicate() and time.monotonic() < end:
            spinner.spin_once(timeout_sec=0.05)
        return predicate()

    def latest() -> dict[str, str]:
        mine = [s for s in statuses if s.name.startswith(f'/{NAMESPACE}/')]
        return {kv.key: kv.value for kv in mine[-1].values} if mine else {}

    try:
        assert executor_node.config.safe_joint_position()[0] == ('j0', 0.0)
        assert spin_until(lambda: executor_node.gate.has_state(JOINTS))
        jump = np.full((4, 3), 1.5)  # 1.4 from the measured 0.1 within 0.1 s, at 1/s at most
        chunks.publish(_chunk(1, time.time_ns(), jump))
        assert spin_until(lambda: latest().get('safety gate refused: start_jump') == '1')
        assert not received, 'a refused chunk reached the controller'
        good = MEASURED + 0.05 * np.arange(4)[:, None] * np.ones((1, 3))
        chunks.publish(_chunk(2, time.time_ns(), good))
        assert spin_until(lambda: latest().get('state') == 'holding'), latest()
        played = len(received)
        assert played >= 1
        assert spin_until(lambda: latest().get('safe position moves') == '1'), latest()
        assert spin_until(lambda: len(received) == played + 1)
        values = latest()
        assert values['starvation timeouts'] == '1' and values['holds'] == '1'
        assert float(values['current hold (s)']) >= 0.3
        assert values['chunks skipped: safety_gate'] == '1'
    finally:
        spinner.shutdown()
        executor_node.destroy_node()
        robot.destroy_node()
        context.try_shutdown()

    for received_ns, traj in received:
        assert controller_refusal(traj, received_ns=received_ns) is None
    for _, traj in received[:played]:
        assert all(abs(v - MEASURED) < 0.2 for v in traj.points[0].positions)
    safe = received[played][1]
    assert list(safe.joint_names) == list(JOINTS)
    assert list(safe.points[0].positions) == [0.0, 0.0, 0.0]
    assert stamp_to_ns(safe.points[0].time_from_start) == 2_000_000_000
