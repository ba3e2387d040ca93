"""The node in its own process, its engine in another, four robots over real DDS.

One node serves the whole module; the tests run in order: a single image's chunk, four
robots at once (robot_2 sends compressed PNG images), the diagnostics, malformed inputs,
killing the engine, and last, the node's lifecycle transitions as ``ros2 lifecycle set``
takes them (deactivate, activate, cleanup, configure, activate, shutdown).
"""

from __future__ import annotations

import math
import os
import signal
import time

import numpy as np
import psutil
import pytest
from rclpy.duration import Duration
from rclpy.qos import DurabilityPolicy, ReliabilityPolicy
from ros_harness import JOINTS, Harness, NodeProcess, level_of, values_of
from sensor_msgs.msg import Image
from std_msgs.msg import String

from vla_sched.msg import ActionChunk, StepRejected
from vla_sched.ros.conversions import ns_to_stamp, stamp_to_ns
from vla_sched.ros.diagnostic_keys import (
    LIFECYCLE_STATE_KEY,
    SCHEDULER_KEYS,
    STATE_AGE_KEY,
    robot_keys,
    status_names,
)

pytestmark = [pytest.mark.ros, pytest.mark.slow]

ROBOTS = ['robot_0', 'robot_1', 'robot_2', 'robot_3']
BUDGET_S = 10.0  # generous: the CPU model is slow and these tests are not about deadlines
NODE = '/vla_sched'
SCHEDULER = f'{NODE}: scheduler'
TRAJECTORY_JOINTS = [f'j{i}' for i in range(7)]


def _params() -> dict:
    return {
        'robot_ids': ROBOTS,
        'robot_defaults': {
            'period_s': 0.25,
            'instruction': 'pick up the red block',
            'state_joint_names': list(JOINTS),
            # dt = budget: a chunk published before its deadline has an action left to execute
            'dt': BUDGET_S,
        },
        'robots': {
            'robot_0': {'publish_twist': True, 'publish_gripper': True},
            'robot_2': {'image_transport': 'compressed'},
            'robot_1': {
                'action_space': 'joint_position',
                'action_joint_names': TRAJECTORY_JOINTS,
                'publish_joint_trajectory': True,
                'frame_id': 'robot_1/base',
            },
        },
        'engine': {
            'mode': 'process',
            'device': 'cpu',
            'heartbeat_timeout_s': 5.0,
            'restart_delay_s': 0.5,
        },
        'deadlines': {'step_budget_s': BUDGET_S},
        'diagnostics': {'period_s': 0.5, 'silent_robot_s': 60.0},
    }


@pytest.fixture(scope='module')
def served(tmp_path_factory):
    node = NodeProcess(tmp_path_factory.mktemp('serving'), _params())
    harness = Harness(ROBOTS, compressed=('robot_2',))
    try:
        assert harness.wait_matched(60), node.log()
        ready = harness.wait_status(
            SCHEDULER, lambda s: values_of(s)['engine state'] == 'ready', 180
        )
        assert ready is not None, node.log()[-3000:]
        yield node, harness
    finally:
        harness.close()
        assert node.stop() == 0, node.log()[-3000:]


def _chunk_with_stamp(harness: Harness, rid: str, stamp_ns: int) -> ActionChunk | None:
    for _, chunk in harness.chunks[rid]:
        if stamp_to_ns(chunk.header.stamp) == stamp_ns:
            return chunk
    return None


def test_an_image_yields_a_chunk_with_the_right_shape_stamp_and_robot_id(served):
    node, harness = served
    found: list[ActionChunk] = []
    stamps = []

    def arrived() -> bool:
        chunks = (_chunk_with_stamp(harness, 'robot_1', s) for s in stamps)
        found.extend(c for c in chunks if c is not None)
        return bool(found)

    # One frame at a time (best-effort QoS may lose one); each has a distinct stamp.
    for _ in range(5):
        harness.publish_joints('robot_1')
        stamps.append(harness.publish_frame('robot_1'))
        if harness.spin_until(arrived, 20):
            break
    assert found, node.log()[-3000:]
    chunk = found[0]
    stamp_ns = stamp_to_ns(chunk.header.stamp)
    assert chunk.robot_id == 'robot_1' and chunk.header.frame_id == 'robot_1/base'
    assert chunk.step_seq >= 1
    assert chunk.dof == 7 and chunk.horizon >= 1
    assert len(chunk.actions) == chunk.horizon * chunk.dof
    assert list(chunk.joint_names) == TRAJECTORY_JOINTS
    assert chunk.action_space == ActionChunk.ACTION_SPACE_JOINT_POSITION
    assert stamp_to_ns(chunk.deadline) == stamp_ns + round(BUDGET_S * 1e9)
    assert chunk.dt == pytest.approx(BUDGET_S)
    assert chunk.total_ms > 0 and not chunk.late
    assert all(math.isfinite(a) for a in chunk.actions)
    # the trajectory twin, stamped at its publication: the actions not yet past, the last one
    # reached where the chunk ends (image stamp + horizon * dt)
    end_ns = stamp_ns + chunk.horizon * round(BUDGET_S * 1e9)

    def trajectory():
        for t in harness.trajectories['robot_1']:
            if stamp_to_ns(t.header.stamp) + stamp_to_ns(t.points[-1].time_from_start) == end_ns:
                return t
        return None

    assert harness.spin_until(lambda: trajectory() is not None, 10)
    traj = trajectory()
    assert stamp_ns < stamp_to_ns(traj.header.stamp) <= _now()
    assert list(traj.joint_names) == TRAJECTORY_JOINTS and traj.header.frame_id == 'robot_1/base'
    rows = np.asarray(chunk.actions, dtype=np.float32).reshape(chunk.horizon, chunk.dof)
    first = chunk.horizon - len(traj.points)
    for point, row in zip(traj.points, rows[first:], strict=True):
        np.testing.assert_allclose(point.positions, row, rtol=0, atol=1e-6)


def test_four_robots_are_served_at_once(served):
    _, harness = served
    before = {rid: len(harness.chunks[rid]) for rid in ROBOTS}
    for rid in ROBOTS:
        harness.start_camera(rid, rate_hz=5.0)
    ok = harness.spin_until(
        lambda: all(len(harness.chunks[r]) >= before[r] + 3 for r in ROBOTS), 90
    )
    counts = {rid: len(harness.chunks[rid]) - before[rid] for rid in ROBOTS}
    assert ok, f'chunks per robot: {counts}'
    for rid in ROBOTS:
        assert all(chunk.robot_id == rid for _, chunk in harness.chunks[rid])
        seqs = [chunk.step_seq for _, chunk in harness.chunks[rid]]
        assert seqs == sorted(set(seqs))  # one step at a time, in order
    # robot_0 (ee_delta) drives an arm through MoveIt Servo and a gripper controller
    assert harness.spin_until(
        lambda: harness.twists['robot_0'] and harness.grippers['robot_0'], 10
    )
    twist = harness.twists['robot_0'][-1]
    assert twist.header.frame_id == 'base_link' and 0 < stamp_to_ns(twist.header.stamp) <= _now()
    assert all(math.isfinite(g.data) for g in harness.grippers['robot_0'])
    assert not harness.twists['robot_1'] and not harness.grippers['robot_3']  # off there
    # published for control: reliable, volatile, expiring after the step budget
    for topic in ('action_chunk', 'twist', 'gripper'):
        (info,) = harness.node.get_publishers_info_by_topic(f'/robot_0/vla/{topic}')
        qos = info.qos_profile
        assert qos.reliability == ReliabilityPolicy.RELIABLE, topic
        assert qos.durability == DurabilityPolicy.VOLATILE, topic
        assert qos.lifespan == Duration(seconds=BUDGET_S), topic


def test_diagnostics_carry_the_scheduler_and_robot_statuses_with_their_keys(served):
    _, harness = served
    after = harness.diagnostics[-1][0] if harness.diagnostics else 0
    assert harness.spin_until(lambda: harness.diagnostics[-1][0] > after, 5)
    array = harness.diagnostics[-1][1]
    assert [s.name for s in array.status] == status_names(NODE, ROBOTS)
    scheduler = array.status[0]
    assert [kv.key for kv in scheduler.values] == list(SCHEDULER_KEYS)
    values = values_of(scheduler)
    assert values['engine state'] == 'ready' and int(values['engine pid']) > 0
    assert 'random weights' in values['model']
    assert values['running batch size'] != 'n/a'
    assert 0.0 <= float(values['KV pool use (%)']) <= 100.0
    assert level_of(scheduler) in (0, 1) and scheduler.hardware_id
    for rid, status in zip(ROBOTS, array.status[1:], strict=True):
        assert [kv.key for kv in status.values] == list(robot_keys(5.0))
        assert status.hardware_id == f'{NODE}/{rid}'
        assert int(values_of(status)['chunks published']) >= 3
        assert float(values_of(status)[STATE_AGE_KEY]) >= 0.0  # the joint states' stamps
        assert float(values_of(status)['target rate (Hz)']) == pytest.approx(4.0)


def _wait_refused(harness: Harness, rid: str, since: int, reason: int, text: str) -> None:
    """A refused input message is named by a StepRejected, or, when one of the same reason
    went out within the robot's period (at most one is published per reason and period), by
    the robot's last error on /diagnostics."""
    status_name = f'{NODE}: robot {rid}'

    def named() -> bool:
        if any(
            received >= since and msg.reason == reason and text in msg.detail
            for received, msg in harness.rejected[rid]
        ):
            return True
        status = harness.status(status_name, after_ns=since)
        return status is not None and text in values_of(status)['last error']

    assert harness.spin_until(named, 20), [m.detail for _, m in harness.rejected[rid]]


def _wait_rejection(harness: Harness, rid: str, since: int, reason: int, text: str) -> str:
    found = []

    def arrived() -> bool:
        for received, msg in harness.rejected[rid]:
            if received >= since and msg.reason == reason and text in msg.detail:
                found.append(msg.detail)
        return bool(found)

    assert harness.spin_until(arrived, 20), [m.detail for _, m in harness.rejected[rid]]
    return found[0]


def test_malformed_inputs_are_refused_for_that_robot_while_others_keep_going(served):
    _, harness = served
    bad = 'robot_3'
    harness.stop_camera(bad)
    others = [r for r in ROBOTS if r != bad]
    before = {r: len(harness.chunks[r]) for r in others}

    wrong_encoding = Image(height=8, width=8, encoding='16UC1', step=16, data=bytes(128))
    wrong_encoding.header.stamp = ns_to_stamp(_now())
    cases = [
        (lambda: harness.publish_image(bad, wrong_encoding), 1, "encoding '16UC1'"),
        (lambda: harness.publish_image(bad, _short_image()), 1, 'needs 192'),
        (lambda: harness.publish_joints(bad, positions=[0, 0, math.nan, 0, 0, 0, 0]), 2,
         "non-finite positions for ['joint_3']"),
        (lambda: harness.publish_joints(bad, positions=[0, 0, 0, 0, 0, 0, math.inf]), 2,
         "non-finite positions for ['gripper']"),
        (lambda: harness.publish_joints(bad, names=['elbow', 'wrist'], positions=[0, 0]), 2,
         'lacks configured joints'),
        (lambda: harness.publish_frame(bad, stamp_ns=_now() + 3600 * 10**9), 1,
         's ahead of the node clock'),
        (lambda: harness.publish_frame(bad, stamp_ns=0), 1, 'header.stamp is zero'),
        (lambda: harness.publish_instruction(bad, ''), 3, 'instruction is empty'),
        (lambda: harness.publish_instruction(bad, 'x' * 10_000_000), 3,
         'instruction has 10000000 bytes'),
    ]  # fmt: skip
    for publish, reason, text in cases:
        since = _now()
        publish()
        _wait_refused(harness, bad, since, reason, text)
    # the robot has no valid instruction now: its next image is refused, naming why
    since = _now()
    harness.publish_joints(bad)
    harness.publish_frame(bad)
    _wait_rejection(harness, bad, since, StepRejected.REASON_INVALID_INSTRUCTION, 'refused')
    status = harness.wait_status(
        f'{NODE}: robot {bad}', lambda s: 'instruction' in values_of(s)['last error'], 5
    )
    assert status is not None and level_of(status) == 1  # WARN, with the reason
    assert status.message.startswith('invalid_instruction')  # the cause first
    # nothing was ever stamped ahead of its publication
    for _, chunk in harness.chunks[bad]:
        assert stamp_to_ns(chunk.header.stamp) <= _now()
    # the other robots kept getting actions
    assert harness.spin_until(lambda: all(len(harness.chunks[r]) > before[r] for r in others), 30)
    # and the refused robot comes back with a valid instruction
    harness.instructions[bad].publish(String(data='place it in the bin'))
    count = len(harness.chunks[bad])
    harness.start_camera(bad, rate_hz=5.0)
    assert harness.spin_until(lambda: len(harness.chunks[bad]) > count, 60)


def test_killing_the_engine_turns_the_scheduler_error_and_the_node_recovers(served):
    node, harness = served
    status = harness.status(SCHEDULER)
    old_pid = int(values_of(status)['engine pid'])
    kill_ns = _now()
    os.kill(old_pid, signal.SIGKILL)
    error = harness.wait_status(SCHEDULER, lambda s: level_of(s) == 2, 5, after_ns=kill_ns)
    assert error is not None, node.log()[-3000:]
    error_ns = next(t for t, a in harness.diagnostics if t >= kill_ns and _has_error(a))
    assert (error_ns - kill_ns) / 1e9 < 2.0
    assert values_of(error)['engine state'] == 'dead'
    # no chunk computed from an observation before the kill is published after the death
    for rid in ROBOTS:
        for _, chunk in harness.chunks[rid]:
            stamp = stamp_to_ns(chunk.header.stamp)
            published = stamp + chunk.total_ms * 1e6
            if stamp < kill_ns:
                assert published < error_ns, (rid, chunk.step_seq)
    # robots are told at once that their steps will not come
    assert harness.spin_until(
        lambda: any(
            m.reason == StepRejected.REASON_ENGINE_UNAVAILABLE and t >= kill_ns
            for rid in ROBOTS
            for t, m in harness.rejected[rid]
        ),
        10,
    )
    # the node restarts the engine and resumes

    def restarted(status) -> bool:
        values = values_of(status)
        return values['engine state'] == 'ready' and int(values['engine restarts']) >= 1

    recovered = harness.wait_status(SCHEDULER, restarted, 180, after_ns=kill_ns)
    assert recovered is not None, node.log()[-3000:]
    assert int(values_of(recovered)['engine pid']) != old_pid
    resumed_ns = _now()
    assert harness.spin_until(
        lambda: all(
            any(stamp_to_ns(c.header.stamp) > resumed_ns for _, c in harness.chunks[r])
            for r in ROBOTS
        ),
        90,
    )


def _served_since(harness: Harness, rid: str, since_ns: int) -> bool:
    """Whether ``rid`` got a chunk for an image stamped after ``since_ns``."""
    return any(stamp_to_ns(c.header.stamp) > since_ns for _, c in harness.chunks[rid])


def _scheduler_in(harness: Harness, state: str, after_ns: int):
    """The first scheduler status after ``after_ns`` that reports the lifecycle ``state``."""
    status = harness.wait_status(
        SCHEDULER, lambda s: values_of(s)[LIFECYCLE_STATE_KEY] == state, 10, after_ns=after_ns
    )
    assert status is not None, state
    return status


def test_lifecycle_transitions_pause_resume_and_restart_serving(served):
    node, harness = served
    assert harness.lifecycle_state(NODE) == 'active'  # autostart took it there
    assert not harness.change_state(NODE, 'activate')  # not from active
    # deactivate: every step is refused with its reason, nothing is published
    assert harness.change_state(NODE, 'deactivate')
    paused_ns = _now()
    assert harness.lifecycle_state(NODE) == 'inactive'
    for rid in ROBOTS:
        _wait_rejection(harness, rid, paused_ns, StepRejected.REASON_INACTIVE, 'node inactive')
    status = _scheduler_in(harness, 'inactive', paused_ns)
    assert level_of(status) == 1 and status.message.startswith('inactive: every step is refused')
    assert values_of(status)['engine state'] == 'ready'  # the model stays loaded
    robot = harness.wait_status(
        f'{NODE}: robot robot_0', lambda s: s.message.startswith('not served'), 10
    )
    assert robot is not None and level_of(robot) == 1
    assert not any(_served_since(harness, rid, paused_ns) for rid in ROBOTS)
    # activate: serving resumes
    assert harness.change_state(NODE, 'activate')
    resumed_ns = _now()
    assert harness.spin_until(
        lambda: all(_served_since(harness, r, resumed_ns) for r in ROBOTS), 60
    )
    # cleanup stops the engine; the node still reports and refuses, naming its state
    old_pid = int(values_of(harness.status(SCHEDULER))['engine pid'])
    assert harness.change_state(NODE, 'deactivate')
    assert harness.change_state(NODE, 'cleanup')
    stopped_ns = _now()
    assert harness.lifecycle_state(NODE) == 'unconfigured'
    assert not psutil.pid_exists(old_pid)
    status = _scheduler_in(harness, 'unconfigured', stopped_ns)
    assert values_of(status)['engine state'] == 'stopped' and level_of(status) == 1
    _wait_rejection(harness, 'robot_1', stopped_ns, StepRejected.REASON_INACTIVE, 'unconfigured')
    # configure starts a new engine, and once active the robots are served by it
    assert harness.change_state(NODE, 'configure')
    assert harness.change_state(NODE, 'activate')
    restarted_ns = _now()
    ready = harness.wait_status(
        SCHEDULER, lambda s: values_of(s)['engine state'] == 'ready', 180, after_ns=restarted_ns
    )
    assert ready is not None, node.log()[-3000:]
    assert values_of(ready)[LIFECYCLE_STATE_KEY] == 'active' and level_of(ready) == 0
    assert int(values_of(ready)['engine pid']) != old_pid
    assert harness.spin_until(
        lambda: all(_served_since(harness, r, restarted_ns) for r in ROBOTS), 90
    )
    # shutdown stops the engine for good; the finalized node still reports until it exits
    new_pid = int(values_of(ready)['engine pid'])
    assert harness.change_state(NODE, 'shutdown')
    final_ns = _now()
    assert harness.lifecycle_state(NODE) == 'finalized'
    assert not psutil.pid_exists(new_pid)
    status = _scheduler_in(harness, 'finalized', final_ns)
    assert values_of(status)['engine state'] == 'stopped'
    assert status.message.startswith('finalized: the node serves no more steps')


def _has_error(array) -> bool:
    return any(s.name == SCHEDULER and level_of(s) == 2 for s in array.status)


def _short_image() -> Image:
    msg = Image(height=8, width=8, encoding='rgb8', step=24, data=bytes(100))
    msg.header.stamp = ns_to_stamp(_now())
    return msg


def _now() -> int:
    return time.time_ns()
