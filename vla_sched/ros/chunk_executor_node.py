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
and once at a chunk's arrival. No message stops it: every field is checked first
(``chunk_checks``: dt within ``[min_chunk_dt_s, max_chunk_dt_s]``, shapes, the columns the
sink reads, finite values) and the stamp against the clock (``max_stamp_skew_s``); a chunk
that fails is skipped and counted by reason. ``/diagnostics`` gets one status,
``'<node>: chunk executor'``, with what was executed, skipped (by reason, and the last skip's
detail) and held, and the newest chunk's age; ERROR when every chunk so far was of an action
space the sink cannot play (also logged, once per action space).

String parameters whose choices YAML reads as booleans (``-p blending:=off`` is the boolean
false) are accepted as the boolean too: false is ``off``.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

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
from vla_sched.ros.chunk_checks import ChunkRefusedError, ChunkRules, chunk_from_message
from vla_sched.ros.chunk_executor import SKIP_REASONS, ChunkExecutor, Command
from vla_sched.ros.chunk_executor_config import ChunkExecutorConfig
from vla_sched.ros.conversions import ns_to_duration, ns_to_stamp
from vla_sched.ros.diagnostic_keys import NO_DATA
from vla_sched.ros.diagnostics import ERROR, OK, STALE, WARN, StatusData, to_message
from vla_sched.ros.node_config import GRIPPER_COLUMN, ConfigError
from vla_sched.ros.outputs import ee_twist
from vla_sched.ros.parameters import ParamSpec, check_value, descriptor
from vla_sched.ros.robot_topics import control_qos
from vla_sched.ros.shutdown import ShutdownRequest
from vla_sched.ros.text_bounds import MAX_MESSAGE_CAUSE_CHARS, bounded
from vla_sched.settings import settings_of

NODE_NAME = 'vla_chunk_executor'
STATUS_SUFFIX = ': chunk executor'
# Reliable, volatile, the newest message only: what the vla_sched node offers its chunks
# with (a subscriber needs no lifespan), and what the controllers' topics accept.
CONTROL_QOS = control_qos()
AGE_KEY = 'newest chunk age (s)'
LAST_SKIP_KEY = 'last skipped'
# What YAML makes of these words: a choice spelled so arrives as a boolean.
_YAML_BOOL_WORDS = {False: ('off', 'false', 'no'), True: ('on', 'true', 'yes')}
NS_PER_S = 1_000_000_000


def declare_config(node: Node) -> ChunkExecutorConfig:
    """Declare one read-only parameter per setting of ``ChunkExecutorConfig`` and build the
    config from their values.

    Raises:
        ConfigError: a value breaks its setting's rules, or the settings do not fit together.
    """
    values = {}
    for defined in settings_of(ChunkExecutorConfig):
        spec = ParamSpec(defined.name, defined)
        desc = descriptor(spec)
        if _bool_words(defined.choices):
            desc.dynamic_typing = True  # a boolean is read back as its word below
        param = node.declare_parameter(spec.name, spec.default, desc)
        values[spec.name] = check_value(spec, _choice_of(param.value, defined.choices))
    return ChunkExecutorConfig(**values)


def _bool_words(choices: tuple[str, ...] | None) -> dict[bool, str]:
    """The choices that YAML reads as a boolean, by that boolean."""
    words = {}
    for flag, spellings in _YAML_BOOL_WORDS.items():
        for choice in choices or ():
            if choice.lower() in spellings:
                words[flag] = choice
    return words


def _choice_of(value, choices: tuple[str, ...] | None):
    """``value``, or the choice a boolean ``value`` was written as (``off`` for false)."""
    if isinstance(value, bool):
        return _bool_words(choices).get(value, value)
    return value


def chunk_rules(config: ChunkExecutorConfig) -> ChunkRules:
    """The message checks of an executor with ``config``."""
    return ChunkRules(
        action_spaces=config.action_spaces,
        min_columns=config.min_columns,
        min_dt_ns=round(config.min_chunk_dt_s * 1e6) * 1000,
        max_dt_ns=round(config.max_chunk_dt_s * 1e6) * 1000,
    )


def take_chunk(executor: ChunkExecutor, rules: ChunkRules, msg: ActionChunk, now_ns: int) -> bool:
    """Check ``msg`` and hand it to ``executor``: True if it was kept, else it was counted as
    skipped (``executor.counts.last_skip`` says why). Nothing is raised, whatever ``msg``
    holds."""
    try:
        chunk = chunk_from_message(msg, rules)
    except ChunkRefusedError as exc:
        executor.skip(exc.reason, exc.detail)
        return False
    except Exception as exc:  # a message no check foresaw: counted, never fatal
        executor.skip('malformed', f'chunk {msg.step_seq}: {type(exc).__name__}: {exc}')
        return False
    return executor.receive(chunk, now_ns) is None


@dataclass(frozen=True, slots=True)
class SinkMessages:
    """What one tick sends; None for an output the configuration does not have."""

    trajectory: JointTrajectory | None
    twist: TwistStamped | None
    gripper: Float64 | None


def sink_messages(command: Command, config: ChunkExecutorConfig) -> SinkMessages:
    """The messages of ``command`` for the sink and gripper of ``config`` (the command's
    chunk has the columns they read: ``chunk_checks``)."""
    trajectory = twist = gripper = None
    current = command.rows[0]
    if config.sink == 'joint_trajectory':
        trajectory = trajectory_message(command, stamped=config.trajectory_start == 'now')
    elif config.sink == 'twist':
        twist = ee_twist(current, dt_s=command.dt_ns / 1e9, frame_id=command.frame_id)
        twist.header.stamp = ns_to_stamp(command.at_ns)
    if config.publish_gripper:
        gripper = Float64(data=float(current[GRIPPER_COLUMN]))
    return SinkMessages(trajectory, twist, gripper)


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
    last_reason, last_detail = counts.last_skip or ('', '')
    num_skipped = sum(counts.skipped.values())
    if not executor.admitted_any and last_reason == 'action_space':
        level, state = ERROR, 'cannot play'
        message = (
            f'sink {config.sink} plays only {"/".join(config.action_spaces)} chunks: '
            f'{last_detail} ({counts.skipped["action_space"]} skipped)'
        )
    elif not executor.admitted_any and num_skipped:
        level, state = WARN, 'waiting'
        message = (
            f'no playable chunk yet: {num_skipped} skipped, last {last_reason}: {last_detail}'
        )
    elif not executor.admitted_any:
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
        (LAST_SKIP_KEY, f'{last_reason}: {last_detail}' if last_reason else NO_DATA),
    ]
    return StatusData(node_name + STATUS_SUFFIX, level, message, node_name, tuple(values))


class ChunkExecutorNode(Node):
    """Plays ``vla/action_chunk`` to the configured sink (see the module docstring)."""

    def __init__(self, **node_kwargs) -> None:
        super().__init__(NODE_NAME, **node_kwargs)
        self.config = declare_config(self)
        cfg = self.config
        self.executor_rules = ChunkExecutor(
            action_spaces=cfg.action_spaces,
            blending=cfg.blending,
            ensemble_m=cfg.ensemble_m,
            lookahead=cfg.trajectory_points == 'remaining',
            max_stamp_skew_ns=round(cfg.max_stamp_skew_s * NS_PER_S),
        )
        self.chunk_rules = chunk_rules(cfg)
        self._unplayable_spaces: set[str] = set()  # the action spaces logged as unplayable
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
        """Check, keep and play a chunk; no message ends the executor."""
        now = self._now_ns()
        if take_chunk(self.executor_rules, self.chunk_rules, msg, now):
            self._play(now)
        else:
            self._log_skip(str(msg.action_space))

    def _log_skip(self, action_space: str) -> None:
        """Log the chunk just skipped: an action space the sink cannot play once as an error,
        the other reasons as warnings at most once a second."""
        reason, detail = self.executor_rules.counts.last_skip
        action_space = bounded(action_space, MAX_MESSAGE_CAUSE_CHARS)
        if reason != 'action_space':
            self.get_logger().warning(f'{reason}: {detail}', throttle_duration_sec=1.0)
        elif action_space not in self._unplayable_spaces and len(self._unplayable_spaces) < 8:
            self._unplayable_spaces.add(action_space)
            self.get_logger().error(
                f'sink {self.config.sink} cannot play {action_space!r} chunks (it plays '
                f'{list(self.config.action_spaces)}): every such chunk is skipped'
            )

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
        sent = sink_messages(command, self.config)
        if sent.trajectory is not None:
            self._trajectory.publish(sent.trajectory)
        if sent.twist is not None:
            self._twist.publish(sent.twist)
            self._last_twist_frame = command.frame_id
        if sent.gripper is not None:
            self._gripper.publish(sent.gripper)

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
