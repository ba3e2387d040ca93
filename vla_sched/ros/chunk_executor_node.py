"""The chunk executor node: plays its robot's ActionChunks to the robot's controllers.

One per robot, in the robot's namespace (``launch/chunk_executor.launch.py``)::

    ros2 run vla_sched vla_chunk_executor --ros-args -r __ns:=/robot_0 \\
        --params-file config/chunk_executor.yaml

It subscribes to ``vla/action_chunk`` (reliable, volatile, depth 1, as the vla_sched node
publishes it), keeps and plays chunks by the rules of ``chunk_executor`` on the node's clock
(``use_sim_time`` follows /clock), and sends each tick's command to its sink:

- ``joint_trajectory``: a JointTrajectory for a JointTrajectoryController, one point (the
  current action, reached at the end of its interval) or every remaining point of the newest
  chunk, ``time_from_start`` counted from the tick, stamped with the tick time or zero
  (``trajectory_start``). Holding sends no new trajectory: the controller holds the last
  point it reached.
- ``twist``: a TwistStamped for MoveIt Servo, the current ee_delta action over dt in the
  chunk's frame; a zero twist once when it starts to hold, and on the way out.
- ``publish_gripper``: the current action's gripper column as a Float64.

Ticks fall on the newest chunk's action boundaries (a one-shot timer re-armed each tick),
and once at a chunk's arrival. ``/diagnostics`` gets one status, ``'<node>: chunk
executor'``, with what was executed, skipped (by reason) and held, and the newest chunk's age.
"""

from __future__ import annotations

import sys

import numpy as np
import rclpy
from diagnostic_msgs.msg import DiagnosticArray
from geometry_msgs.msg import TwistStamped
from rclpy.exceptions import ParameterException
from rclpy.executors import ExternalShutdownException, SingleThreadedExecutor
from rclpy.node import Node
from rclpy.signals import SignalHandlerOptions
from std_msgs.msg import Float64
from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

from vla_sched.msg import ActionChunk
from vla_sched.ros.chunk_executor import SKIP_REASONS, Chunk, ChunkExecutor, Command
from vla_sched.ros.chunk_executor_config import ChunkExecutorConfig
from vla_sched.ros.conversions import ns_to_duration, ns_to_stamp, stamp_to_ns
from vla_sched.ros.diagnostic_keys import NO_DATA
from vla_sched.ros.diagnostics import OK, STALE, WARN, StatusData, to_message
from vla_sched.ros.node_config import GRIPPER_COLUMN, ConfigError
from vla_sched.ros.outputs import ee_twist
from vla_sched.ros.parameters import ParamSpec, check_value, descriptor
from vla_sched.ros.robot_topics import control_qos
from vla_sched.ros.shutdown import ShutdownRequest
from vla_sched.settings import settings_of

NODE_NAME = 'vla_chunk_executor'
STATUS_SUFFIX = ': chunk executor'
# Reliable, volatile, the newest message only: what the vla_sched node offers its chunks
# with (a subscriber needs no lifespan), and what the controllers' topics accept.
CONTROL_QOS = control_qos()
AGE_KEY = 'newest chunk age (s)'


def declare_config(node: Node) -> ChunkExecutorConfig:
    """Declare one read-only parameter per setting of ``ChunkExecutorConfig`` and build the
    config from their values.

    Raises:
        ConfigError: a value breaks its setting's rules, or the settings do not fit together.
    """
    values = {}
    for defined in settings_of(ChunkExecutorConfig):
        spec = ParamSpec(defined.name, defined)
        param = node.declare_parameter(spec.name, spec.default, descriptor(spec))
        values[spec.name] = check_value(spec, param.value)
    return ChunkExecutorConfig(**values)


def dt_ns_of(dt_s: float) -> int:
    """An ActionChunk's float32 ``dt`` in nanoseconds, rounded to whole microseconds: a
    float32 holds about 7 significant digits, so 0.2 s reads 0.2000000030 and would put every
    action boundary a few nanoseconds off the one the node meant."""
    return round(float(dt_s) * 1e6) * 1000


def chunk_from_message(msg: ActionChunk) -> Chunk:
    """The executor's ``Chunk`` of an ActionChunk.

    Raises:
        ValueError: the message's sizes disagree, or its actions or dt are not usable.
    """
    actions = np.asarray(msg.actions, dtype=np.float64)
    if actions.size != msg.horizon * msg.dof:
        raise ValueError(f'{actions.size} action values for horizon {msg.horizon} x {msg.dof}')
    return Chunk(
        step_seq=int(msg.step_seq),
        stamp_ns=stamp_to_ns(msg.header.stamp),
        dt_ns=dt_ns_of(msg.dt),
        deadline_ns=stamp_to_ns(msg.deadline),
        actions=actions.reshape(msg.horizon, msg.dof),
        joint_names=tuple(msg.joint_names),
        action_space=msg.action_space,
        frame_id=msg.header.frame_id,
    )


def trajectory_message(command: Command, *, stamped: bool) -> JointTrajectory:
    """The JointTrajectory of ``command``: point j reached ``reached_ns[j] - at_ns`` after the
    stamp, which is the tick time (``stamped``) or zero (the controller starts on receipt)."""
    msg = JointTrajectory(joint_names=list(command.joint_names))
    msg.header.frame_id = command.frame_id
    msg.header.stamp = ns_to_stamp(command.at_ns if stamped else 0)
    msg.points = [
        JointTrajectoryPoint(
            positions=[float(v) for v in row],
            time_from_start=ns_to_duration(reached - command.at_ns),
        )
        for row, reached in zip(command.rows, command.reached_ns, strict=True)
    ]
    return msg


def executor_status(
    executor: ChunkExecutor, config: ChunkExecutorConfig, *, node_name: str, now_ns: int
) -> StatusData:
    """The executor's /diagnostics status: STALE before its first chunk, WARN while it holds
    after having played, OK while it plays."""
    counts = executor.counts
    age_ns = executor.newest_age_ns(now_ns)
    age = NO_DATA if age_ns is None else f'{age_ns / 1e9:.3f}'
    if age_ns is None and counts.actions_executed == 0:
        level, message, state = STALE, 'waiting for the first chunk', 'waiting'
    elif executor.holding:
        level, state = WARN, 'holding'
        message = f'holding: no valid action left (newest chunk {age} s old)'
    else:
        level, message, state = OK, f'executing (newest chunk {age} s old)', 'executing'
    values = [
        ('state', state),
        ('sink', config.sink),
        ('blending', config.blending),
        ('actions executed', str(counts.actions_executed)),
        ('chunks executed', str(counts.chunks_executed)),
        ('holds', str(counts.holds)),
        *((f'chunks skipped: {r}', str(counts.skipped[r])) for r in SKIP_REASONS),
        (AGE_KEY, age),
    ]
    return StatusData(node_name + STATUS_SUFFIX, level, message, node_name, tuple(values))


class ChunkExecutorNode(Node):
    """Plays ``vla/action_chunk`` to the configured sink (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__(NODE_NAME)
        self.config = declare_config(self)
        cfg = self.config
        self.executor_rules = ChunkExecutor(
            action_spaces=cfg.action_spaces,
            blending=cfg.blending,
            ensemble_m=cfg.ensemble_m,
            lookahead=cfg.trajectory_points == 'remaining',
        )
        self._trajectory = self._twist = self._gripper = None
        if cfg.sink == 'joint_trajectory':
            self._trajectory = self.create_publisher(
                JointTrajectory, cfg.trajectory_topic, CONTROL_QOS
            )
        elif cfg.sink == 'twist':
            self._twist = self.create_publisher(TwistStamped, cfg.twist_topic, CONTROL_QOS)
        if cfg.publish_gripper:
            self._gripper = self.create_publisher(Float64, cfg.gripper_topic, CONTROL_QOS)
        self._diagnostics = self.create_publisher(DiagnosticArray, '/diagnostics', 10)
        self._tick_timer = self.create_timer(1.0, self._on_tick, autostart=False)
        self.create_timer(cfg.diagnostics_period_s, self.publish_diagnostics)
        self.create_subscription(ActionChunk, cfg.chunk_topic, self._on_chunk, CONTROL_QOS)
        self._last_twist_frame = ''
        self.get_logger().info(
            f'playing {self.resolve_topic_name(cfg.chunk_topic)} to sink {cfg.sink}'
            f'{" and the gripper" if cfg.publish_gripper else ""}, blending {cfg.blending}'
        )

    def _now_ns(self) -> int:
        return self.get_clock().now().nanoseconds

    def _on_chunk(self, msg: ActionChunk) -> None:
        now = self._now_ns()
        try:
            chunk = chunk_from_message(msg)
        except ValueError as exc:
            self.executor_rules.skip('malformed')
            self.get_logger().warning(f'chunk {msg.step_seq} skipped: {exc}')
            return
        if self.executor_rules.receive(chunk, now) is None:
            self._play(now)

    def _on_tick(self) -> None:
        self._play(self._now_ns())

    def _play(self, now_ns: int) -> None:
        """Send the command due at ``now_ns`` (or enter the hold), and arm the next tick."""
        was_holding = self.executor_rules.holding
        command = self.executor_rules.tick(now_ns)
        if command is None:
            if self.executor_rules.holding and not was_holding:
                self.send_zero_twist()
        else:
            self._send(command)
        due = self.executor_rules.next_tick_ns(now_ns)
        if due is None:
            self._tick_timer.cancel()
            return
        self._tick_timer.timer_period_ns = max(1, due - now_ns)
        self._tick_timer.reset()

    def _send(self, command: Command) -> None:
        if self._trajectory is not None:
            stamped = self.config.trajectory_start == 'now'
            self._trajectory.publish(trajectory_message(command, stamped=stamped))
        current = command.rows[0]
        if self._twist is not None:
            twist = ee_twist(current, dt_s=command.dt_ns / 1e9, frame_id=command.frame_id)
            twist.header.stamp = ns_to_stamp(command.at_ns)
            self._twist.publish(twist)
            self._last_twist_frame = command.frame_id
        if self._gripper is not None and len(current) > GRIPPER_COLUMN:
            self._gripper.publish(Float64(data=float(current[GRIPPER_COLUMN])))

    def send_zero_twist(self) -> None:
        """Stop MoveIt Servo: a zero twist in the frame of the last one (sink twist only)."""
        if self._twist is None:
            return
        twist = TwistStamped()
        twist.header.frame_id = self._last_twist_frame
        twist.header.stamp = ns_to_stamp(self._now_ns())
        self._twist.publish(twist)

    def publish_diagnostics(self) -> None:
        status = executor_status(
            self.executor_rules,
            self.config,
            node_name=self.get_fully_qualified_name(),
            now_ns=self._now_ns(),
        )
        msg = DiagnosticArray(status=[to_message(status)])
        msg.header.stamp = self.get_clock().now().to_msg()
        self._diagnostics.publish(msg)


def main(argv: list[str] | None = None) -> int:
    """Run the executor until SIGINT or SIGTERM (0, however often signalled; a zero twist on
    the way out when it was playing one); 2 on a configuration error."""
    argv = list(argv if argv is not None else sys.argv)
    with (
        ShutdownRequest() as shutdown,
        rclpy.init(args=argv, signal_handler_options=SignalHandlerOptions.NO),
    ):
        try:
            node = ChunkExecutorNode()
        except (ConfigError, ParameterException) as exc:
            print(f'{NODE_NAME}: configuration error: {exc}', file=sys.stderr)
            return 2
        executor = SingleThreadedExecutor()
        executor.add_node(node)
        try:
            # A signal's handler runs when a wait returns: at most 0.2 s after it came.
            while not shutdown.requested and rclpy.ok():
                executor.spin_once(timeout_sec=0.2)
        except ExternalShutdownException:
            pass
        finally:
            if not node.executor_rules.holding and node.executor_rules.counts.actions_executed:
                node.send_zero_twist()
            executor.shutdown()
            node.destroy_node()
    return 0


if __name__ == '__main__':
    sys.exit(main())
