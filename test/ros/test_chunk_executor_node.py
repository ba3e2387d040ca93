"""The chunk executor as a robot runs it: its own process in the robot's namespace, a chunk
publisher like the vla_sched node's, and a stand-in JointTrajectoryController that applies the
controller's acceptance rules to every trajectory it receives. Its parameters file documents
exactly the parameters it declares."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import rclpy
import yaml
from analyzer_rules import analyzers_from_params, claims, row_name, rules_from_params
from diagnostic_msgs.msg import DiagnosticArray
from rclpy.executors import SingleThreadedExecutor
from trajectory_controller_rules import controller_refusal
from trajectory_msgs.msg import JointTrajectory

from vla_sched.msg import ActionChunk
from vla_sched.ros.chunk_checks import ChunkRefusedError, chunk_from_message
from vla_sched.ros.chunk_executor import Chunk, ChunkExecutor, Command
from vla_sched.ros.chunk_executor_config import ChunkExecutorConfig
from vla_sched.ros.chunk_executor_node import (
    PERIOD_P50_KEY,
    PERIOD_P99_KEY,
    StarvationCounts,
    chunk_rules,
    executor_of,
    executor_status,
    placeholder_names,
    trajectory_message,
)
from vla_sched.ros.conversions import ns_to_stamp, stamp_to_ns
from vla_sched.ros.robot_topics import control_qos
from vla_sched.ros.safety_gate import SafetyGate
from vla_sched.settings import settings_of

pytestmark = [pytest.mark.ros, pytest.mark.slow]  # rclpy nodes spinning in process

ROOT = Path(__file__).resolve().parents[2]
PARAMS_FILE = ROOT / 'config' / 'chunk_executor.yaml'
NAMESPACE = 'exec_test_arm'
STATUS = f'/{NAMESPACE}/vla_chunk_executor: chunk executor'
JOINTS = ('j0', 'j1', 'j2')
DT_NS = 200_000_000
HORIZON = 4


def test_the_params_file_documents_every_parameter_with_its_default():
    documented = yaml.safe_load(PARAMS_FILE.read_text())['/**']['ros__parameters']
    declared = {
        s.name: list(s.default) if s.is_string_list else s.default
        for s in settings_of(ChunkExecutorConfig)
    }
    assert documented == declared


def _chunk(seq: int, stamp_ns: int, first_value: float, *, budget_ns: int) -> ActionChunk:
    rows = first_value + np.arange(HORIZON * len(JOINTS), dtype=np.float32)
    msg = ActionChunk(robot_id=NAMESPACE, step_seq=seq, horizon=HORIZON, dof=len(JOINTS))
    msg.header.stamp = ns_to_stamp(stamp_ns)
    msg.header.frame_id = 'base'
    msg.dt = DT_NS / 1e9
    msg.actions = rows
    msg.joint_names = list(JOINTS)
    msg.action_space = ActionChunk.ACTION_SPACE_JOINT_POSITION
    msg.deadline = ns_to_stamp(stamp_ns + budget_ns)
    return msg


@pytest.mark.ros
def test_the_executor_plays_a_chunk_the_controller_accepts_skips_a_late_one_and_holds(
    tmp_path,
):
    params = tmp_path / 'params.yaml'
    values = {'diagnostics_period_s': 0.1}
    params.write_text(yaml.safe_dump({'/**': {'ros__parameters': values}}))
    cmd = [sys.executable, '-m', 'vla_sched.ros.chunk_executor_node', '--ros-args']
    cmd += ['-r', f'__ns:=/{NAMESPACE}', '--params-file', str(params)]
    log_path = tmp_path / 'executor.log'
    with log_path.open('w') as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    context = rclpy.Context()
    rclpy.init(args=[], context=context)
    node = rclpy.create_node('stand_in_controller', context=context)
    executor = SingleThreadedExecutor(context=context)
    executor.add_node(node)
    received: list[tuple[int, JointTrajectory]] = []
    statuses = []
    node.create_subscription(
        JointTrajectory,
        f'/{NAMESPACE}/joint_trajectory_controller/joint_trajectory',
        lambda m: received.append((time.time_ns(), m)),
        10,
    )
    node.create_subscription(
        DiagnosticArray,
        '/diagnostics',
        lambda a: statuses.extend(s for s in a.status if s.name == STATUS),
        10,
    )
    chunks = node.create_publisher(
        ActionChunk, f'/{NAMESPACE}/vla/action_chunk', control_qos(0.25)
    )

    def spin_until(predicate, timeout_s: float = 30.0) -> bool:
        end = time.monotonic() + timeout_s
        while not predicate() and time.monotonic() < end:
            assert proc.poll() is None, log_path.read_text()[-2000:]
            executor.spin_once(timeout_sec=0.05)
        return predicate()

    def latest() -> dict[str, str]:
        return {kv.key: kv.value for kv in statuses[-1].values} if statuses else {}

    try:
        assert spin_until(lambda: chunks.get_subscription_count() > 0 and statuses)
        now = time.time_ns()
        ended = _chunk(1, now - 2 * HORIZON * DT_NS, 100.0, budget_ns=10 * HORIZON * DT_NS)
        chunks.publish(ended)  # ended long before it arrived, its deadline still ahead
        assert spin_until(lambda: latest().get('chunks skipped: ended_before_arrival') == '1')
        late = _chunk(1, now - 2 * DT_NS, 100.0, budget_ns=DT_NS // 2)
        chunks.publish(late)  # its deadline passed: never played
        assert spin_until(lambda: latest().get('chunks skipped: past_deadline') == '1')
        stamp = time.time_ns() - 20_000_000
        chunks.publish(_chunk(2, stamp, 0.0, budget_ns=250_000_000))
        assert spin_until(lambda: latest().get('state') == 'holding'), latest()
        status = statuses[-1]
        after_hold, reports = len(received), len(statuses)
        assert spin_until(lambda: len(statuses) >= reports + 2)  # two more reports
        assert len(received) == after_hold  # holding sends no new trajectory
    finally:
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=20)
        executor.shutdown()
        node.destroy_node()
        context.try_shutdown()
    assert code == 0, log_path.read_text()[-2000:]

    assert received, 'no trajectory reached the controller'
    played = []
    for received_ns, traj in received:
        assert controller_refusal(traj, received_ns=received_ns) is None
        assert list(traj.joint_names) == list(JOINTS) and len(traj.points) == 1
        point = traj.points[0]
        index = round(point.positions[0]) // len(JOINTS)  # chunk 2's action k starts at 3k
        np.testing.assert_allclose(point.positions, 3 * index + np.arange(3.0), atol=1e-6)
        # stamped at the tick, reached at the end of the action's interval
        reached_ns = stamp_to_ns(traj.header.stamp) + stamp_to_ns(point.time_from_start)
        assert reached_ns == stamp + (index + 1) * DT_NS
        played.append(index)
    assert played == sorted(set(played)), 'each action once, in order'
    values = {kv.key: kv.value for kv in status.values}
    assert status.level == bytes([1]) and status.message.startswith('holding')
    assert values['chunks skipped: ended_before_arrival'] == '1'
    assert values['actions executed'] == str(len(received))
    assert (values['chunks executed'], values['holds']) == ('1', '1')
    assert values['chunks skipped: past_deadline'] == '1'
    assert float(values['newest chunk age (s)']) >= HORIZON * DT_NS / 1e9


def test_the_analyzers_claim_each_executors_status_once_in_a_row_of_its_own():
    params = yaml.safe_load((ROOT / 'config' / 'diagnostics_analyzers.yaml').read_text())
    params = params['analyzers']['ros__parameters']
    rules, analyzers = list(rules_from_params(params)), analyzers_from_params(params)
    rows = set()
    for namespace in ('/robot_0', '/gpu0/robot_0', '/gpu0/arm_left'):
        name = f'{namespace}/vla_chunk_executor: chunk executor'
        (rule,) = claims(rules, name)
        assert rule.analyzer == 'executors'
        rows.add(row_name(analyzers['executors'], name))
    assert len(rows) == 3


def test_a_message_becomes_a_chunk_with_its_dt_read_to_the_microsecond():
    rules = chunk_rules(ChunkExecutorConfig())
    chunk = chunk_from_message(_chunk(7, 5 * DT_NS, 1.0, budget_ns=DT_NS), rules)
    assert chunk.dt_ns == DT_NS  # float32 0.2 s is 0.2000000030 s
    assert (chunk.stamp_ns, chunk.deadline_ns, chunk.horizon) == (5 * DT_NS, 6 * DT_NS, HORIZON)
    np.testing.assert_array_equal(chunk.actions[1], [4.0, 5.0, 6.0])
    broken = _chunk(8, 0, 1.0, budget_ns=DT_NS)
    broken.horizon = HORIZON + 1
    with pytest.raises(
        ChunkRefusedError, match='12 action values and 3 joint names for horizon 5'
    ):
        chunk_from_message(broken, rules)


def test_the_trajectory_is_stamped_at_the_tick_or_zero_with_the_same_points():
    command = Command(
        at_ns=10 * DT_NS + 5,
        rows=np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]),
        reached_ns=(11 * DT_NS, 12 * DT_NS),
        dt_ns=DT_NS,
        joint_names=JOINTS,
        action_space='joint_position',
        frame_id='base',
    )
    stamped = trajectory_message(command, stamped=True)
    on_receipt = trajectory_message(command, stamped=False)
    assert stamp_to_ns(stamped.header.stamp) == command.at_ns
    assert stamp_to_ns(on_receipt.header.stamp) == 0 and on_receipt.points == stamped.points
    times = [stamp_to_ns(p.time_from_start) for p in stamped.points]
    assert times == [DT_NS - 5, 2 * DT_NS - 5]
    assert [list(p.positions) for p in stamped.points] == command.rows.tolist()
    assert controller_refusal(stamped, received_ns=command.at_ns + DT_NS // 2) is None


def test_the_status_is_stale_before_the_first_chunk_ok_while_playing_warn_while_holding():
    config = ChunkExecutorConfig()
    rules = ChunkExecutor(
        action_spaces=('joint_position',), blending='off', ensemble_m=0.0, lookahead=False
    )

    def status(now_ns):
        return executor_status(rules, config, node_name='/arm/vla_chunk_executor', now_ns=now_ns)

    waiting = status(0)
    assert (waiting.level, waiting.message) == (3, 'waiting for the first chunk')
    assert dict(waiting.values)['newest chunk age (s)'] == 'n/a'
    assert waiting.name == '/arm/vla_chunk_executor: chunk executor'
    chunk = Chunk(1, 0, DT_NS, DT_NS, np.zeros((1, 3)), JOINTS, 'joint_position', 'base')
    rules.receive(chunk, 0)
    rules.tick(0)
    playing = status(DT_NS // 2)
    assert playing.level == 0 and dict(playing.values)['newest chunk age (s)'] == '0.100'
    rules.tick(DT_NS)
    holding = status(DT_NS)
    assert holding.level == 1 and 'no valid action left' in holding.message
    assert dict(holding.values)['holds'] == '1'


def _ee_chunk(seq: int, stamp_ns: int, *, dof: int, dt: float, space: str) -> ActionChunk:
    names = ('x', 'y', 'z', 'roll', 'pitch', 'yaw', 'gripper', 'extra')[:dof]
    msg = ActionChunk(robot_id=NAMESPACE, step_seq=seq, horizon=HORIZON, dof=dof)
    msg.header.stamp = ns_to_stamp(stamp_ns)
    msg.header.frame_id = 'tool'
    msg.dt = dt
    msg.actions = np.full(HORIZON * dof, 0.01, dtype=np.float32)
    msg.joint_names = list(names)
    msg.action_space = space
    msg.deadline = ns_to_stamp(stamp_ns + 10 * DT_NS)
    return msg


@pytest.mark.ros
def test_the_executor_outlives_chunks_it_once_died_on_and_says_what_it_cannot_play():
    """In process, a twist executor started with ``-p blending:=off`` (YAML's false): chunks
    with an infinite or huge dt, 3 or 0 columns, or stamped a minute ahead are skipped by
    reason; the next good chunk plays; a joint_position chunk it cannot play is an ERROR."""
    from geometry_msgs.msg import TwistStamped

    from vla_sched.ros.chunk_executor_node import ChunkExecutorNode

    context = rclpy.Context()
    rclpy.init(args=[], context=context)
    args = ['--ros-args', '-r', f'__ns:=/{NAMESPACE}', '-p', 'blending:=off']
    args += ['-p', 'sink:=twist', '-p', 'diagnostics_period_s:=0.05']
    executor_node = ChunkExecutorNode(context=context, cli_args=args)
    robot = rclpy.create_node('stand_in_robot', context=context)
    spinner = SingleThreadedExecutor(context=context)
    spinner.add_node(executor_node)
    spinner.add_node(robot)
    twists, statuses = [], []
    robot.create_subscription(
        TwistStamped, f'/{NAMESPACE}/servo_node/delta_twist_cmds', twists.append, 10
    )
    robot.create_subscription(
        DiagnosticArray, '/diagnostics', lambda a: statuses.extend(a.status), 10
    )
    chunks = robot.create_publisher(ActionChunk, f'/{NAMESPACE}/vla/action_chunk', 10)

    def spin_until(predicate, timeout_s: float = 20.0) -> bool:
        end = time.monotonic() + timeout_s
        while not predicate() and time.monotonic() < end:
            spinner.spin_once(timeout_sec=0.05)
        return predicate()

    def latest() -> dict[str, str]:
        return {kv.key: kv.value for kv in statuses[-1].values} if statuses else {}

    try:
        assert executor_node.config.blending == 'off'
        assert spin_until(lambda: chunks.get_subscription_count() > 0)
        now = time.time_ns()
        chunks.publish(_ee_chunk(1, now, dof=7, space='joint_position', dt=0.2))
        assert spin_until(lambda: latest().get('state') == 'cannot play'), latest()
        assert statuses[-1].level == bytes([2]) and 'plays only ee_delta' in statuses[-1].message
        hostile = [
            _ee_chunk(2, now, dof=7, space='ee_delta', dt=float('inf')),
            _ee_chunk(3, now, dof=7, space='ee_delta', dt=3e38),
            _ee_chunk(4, now, dof=3, space='ee_delta', dt=0.2),
            _ee_chunk(5, now, dof=0, space='ee_delta', dt=0.2),
            _ee_chunk(6, now + 60 * 10**9, dof=7, space='ee_delta', dt=0.2),
        ]
        for msg in hostile:  # one at a time: the subscription keeps only the newest
            skipped = executor_node.executor_rules.counts.skipped
            before = sum(skipped.values())
            chunks.publish(msg)
            assert spin_until(lambda: sum(skipped.values()) > before)  # noqa: B023
        expected = {'bad_dt': '2', 'bad_columns': '1', 'bad_shape': '1', 'future_stamp': '1'}

        def counted() -> bool:
            values = latest()
            return all(values.get(f'chunks skipped: {r}') == n for r, n in expected.items())

        assert spin_until(counted), latest()
        chunks.publish(_ee_chunk(7, time.time_ns(), dof=7, space='ee_delta', dt=0.2))
        assert spin_until(lambda: twists), 'the good chunk after the bad ones was not played'
        assert twists[0].twist.linear.x == pytest.approx(0.05, rel=1e-5)  # 0.01 per 0.2 s
        assert spin_until(lambda: latest().get('state') in ('executing', 'holding'))
    finally:
        spinner.shutdown()
        executor_node.destroy_node()
        robot.destroy_node()
        context.try_shutdown()


def test_placeholder_joint_names_to_a_trajectory_controller_are_a_warning():
    config = ChunkExecutorConfig()
    rules = executor_of(config)
    names = ('a0', 'a1', 'a2')
    rules.receive(Chunk(1, 0, DT_NS, DT_NS, np.zeros((2, 3)), names, 'joint_position', ''), 0)
    rules.tick(0)
    status = executor_status(rules, config, node_name='/arm/vla_chunk_executor', now_ns=0)
    assert status.level == 1 and 'joint names a0..a2 are placeholders' in status.message
    assert dict(status.values)['state'] == 'executing'
    assert placeholder_names(('a0', 'a12')) and not placeholder_names(('a0', 'elbow'))


def test_the_status_reports_holds_starvation_the_gate_and_the_action_period():
    config = ChunkExecutorConfig(safety_gate='refuse', joint_limits=('j0 velocity=1',))
    rules = executor_of(config)
    gate = SafetyGate(mode='refuse', limits=config.limits(), max_state_age_ns=DT_NS)
    chunk = Chunk(1, 0, DT_NS, DT_NS, np.zeros((2, 3)), JOINTS, 'joint_position', '')
    assert rules.receive(chunk, 0, gate=gate) == 'safety_gate'  # no limits for j1, j2
    gate.limits.update({name: gate.limits['j0'] for name in JOINTS})
    gate.measure(JOINTS, [0.0] * 3, 0)
    assert rules.receive(chunk, 0, gate=gate) is None
    for now in (0, DT_NS, 2 * DT_NS):
        rules.tick(now)
    starvation = StarvationCounts(timeouts=1, safe_position_moves=0)
    status = executor_status(
        rules, config, node_name='/arm/x', now_ns=3 * DT_NS, gate=gate, starvation=starvation
    )
    values = dict(status.values)
    assert status.level == 1 and status.message.startswith('holding 0.2 s')
    assert (values['holds'], values['current hold (s)'], values['time held (s)']) == (
        '1',
        '0.200',
        '0.200',
    )
    assert values['starvation timeouts'] == '1' and values['starvation action'] == 'hold'
    assert values['safety gate refused: no_limits'] == '1'
    assert values['safety gate checked'] == '2' and values['chunks skipped: safety_gate'] == '1'
    assert values[PERIOD_P50_KEY] == '200.0' and values[PERIOD_P99_KEY] == '200.0'
    off = executor_status(rules, ChunkExecutorConfig(), node_name='/arm/x', now_ns=0)
    assert dict(off.values)['safety gate refused: start_jump'] == 'n/a'
