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

A new chunk meets the playing one by the ``blending`` merge mode (``merge``). No point is sent
to be reached less than ``min_lead_s`` after its tick (the action is dropped and the next one
sent). With ``safety_gate`` on, each chunk is checked against the newest ``joint_states`` and
the joint limits (``safety_gate``) and clipped or refused before it is kept. When nothing is
left to play the executor holds; after ``starvation_timeout_s`` it keeps holding or moves to
``safe_position`` (checked by the gate when it is on).

Ticks fall on the newest chunk's action boundaries (a one-shot timer re-armed each tick),
and once at a chunk's arrival. No message stops it: every field is checked first
(``chunk_checks``: dt within ``[min_chunk_dt_s, max_chunk_dt_s]``, shapes, the columns the
sink reads, finite values) and the stamp against the clock (``max_stamp_skew_s``); a chunk
that fails is skipped and counted by reason. ``/diagnostics`` gets one status,
``'<node>: chunk executor'``, with what was executed, skipped (by reason, and the last skip's
detail) and held (holds, their time, starvation timeouts), the safety gate's refusals and
clips by reason, the executed action period p50/p99 and the newest chunk's age; ERROR when
every chunk so far was of an action space the sink cannot play (also logged, once per action
space), WARN while holding and while a JointTrajectoryController is sent placeholder joint
names (``a0``, ``a1``, ...: the vla_sched node's names when ``action_joint_names`` is unset).

String parameters whose choices YAML reads as booleans (``-p blending:=off`` is the boolean
false) are accepted as the boolean too: false is ``off``.
"""

from __future__ import annotations

import math
import re
import sys
from dataclasses import dataclass

import numpy as np
import rclpy
from diagnostic_msgs.msg import DiagnosticArray
from geometry_msgs.msg import TwistStamped
from rcl_interfaces.msg import ParameterDescriptor
from rclpy.exceptions import ParameterException
from rclpy.executors import ExternalShutdownException, SingleThreadedExecutor
from rclpy.node import Node
from rclpy.qos import qos_profile_sensor_data
from rclpy.signals import SignalHandlerOptions
from sensor_msgs.msg import JointState
from std_msgs.msg import Float64
from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

from vla_sched.msg import ActionChunk
from vla_sched.ros.chunk_checks import ChunkRefusedError, ChunkRules, chunk_from_message
from vla_sched.ros.chunk_executor import (
    PERIOD_WINDOW_ACTIONS,
    SKIP_REASONS,
    ChunkExecutor,
    Command,
)
from vla_sched.ros.chunk_executor_config import ChunkExecutorConfig
from vla_sched.ros.conversions import ns_to_duration, ns_to_stamp
from vla_sched.ros.diagnostic_keys import NO_DATA
from vla_sched.ros.diagnostics import ERROR, OK, STALE, WARN, StatusData, to_message
from vla_sched.ros.node_config import GRIPPER_COLUMN, ConfigError
from vla_sched.ros.outputs import ee_twist
from vla_sched.ros.parameters import ParamSpec, check_value, descriptor
from vla_sched.ros.robot_topics import control_qos
from vla_sched.ros.safety_gate import CHECK_REASONS, GATE_REASONS, SafetyGate
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
PERIOD_P50_KEY = f'executed action period p50 over last {PERIOD_WINDOW_ACTIONS} actions (ms)'
PERIOD_P99_KEY = PERIOD_P50_KEY.replace(' p50 ', ' p99 ')
# The vla_sched node's joint names when a robot's action_joint_names is unset.
PLACEHOLDER_NAME = re.compile(r'a\d+')
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
        if defined.is_string_list:
            values[spec.name] = check_value(spec, _declare_list(node, spec.name, desc))
            continue
        if _bool_words(defined.choices):
            desc.dynamic_typing = True  # a boolean is read back as its word below
        param = node.declare_parameter(spec.name, spec.default, desc)
        values[spec.name] = check_value(spec, _choice_of(param.value, defined.choices))
    return ChunkExecutorConfig(**values)


def _declare_list(node: Node, name: str, desc: ParameterDescriptor) -> list:
    """A string-list parameter's value: '[]' in a params file arrives as "not set", so the
    given value is read through a dynamically typed probe, then declared with ``desc``."""
    value = node.declare_parameter(name, [], ParameterDescriptor(dynamic_typing=True)).value
    node.undeclare_parameter(name)
    value = [] if value is None else value
    node.declare_parameter(name, value, desc, ignore_override=True)
    return value


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


def take_chunk(
    executor: ChunkExecutor,
    rules: ChunkRules,
    msg: ActionChunk,
    now_ns: int,
    gate: SafetyGate | None = None,
) -> bool:
    """Check ``msg`` and hand it to ``executor`` (through ``gate`` when it is on): True if it
    was kept, else it was counted as skipped (``executor.counts.last_skip`` says why).
    Nothing is raised, whatever ``msg`` holds."""
    try:
        chunk = chunk_from_message(msg, rules)
    except ChunkRefusedError as exc:
        executor.skip(exc.reason, exc.detail)
        return False
    except Exception as exc:  # a message no check foresaw: counted, never fatal
        executor.skip('malformed', f'chunk {msg.step_seq}: {type(exc).__name__}: {exc}')
        return False
    gated = gate if gate is not None and gate.enabled else None
    published = published_ns(chunk.stamp_ns, msg.total_ms)
    return executor.receive(chunk, now_ns, published_ns=published, gate=gated) is None


def published_ns(stamp_ns: int, total_ms: float) -> int | None:
    """When a chunk was published: its stamp plus its ``total_ms``; None when that is not a
    finite, non-negative time."""
    total_ms = float(total_ms)
    if not math.isfinite(total_ms) or not 0 <= total_ms <= 3.6e6:
        return None
    return stamp_ns + round(total_ms * 1e6)


def executor_of(config: ChunkExecutorConfig) -> ChunkExecutor:
    """The chunk executor's rules with ``config``'s settings."""
    return ChunkExecutor(
        action_spaces=config.action_spaces,
        blending=config.blending,
        ensemble_m=config.ensemble_m,
        lookahead=config.trajectory_points == 'remaining',
        max_stamp_skew_ns=round(config.max_stamp_skew_s * NS_PER_S),
        min_lead_ns=round(config.min_lead_s * NS_PER_S),
        blend_joints=config.blend_joints,
    )


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


@dataclass(slots=True)
class StarvationCounts:
    """What the executor did when a hold outlasted ``starvation_timeout_s``."""

    timeouts: int = 0  # holds that outlasted it
    safe_position_moves: int = 0  # safe positions sent
    safe_position_refused: int = 0  # safe positions the safety gate refused (kept holding)
    handled_hold_ns: int | None = None  # the start of the last hold handled


def placeholder_names(names: tuple[str, ...]) -> bool:
    """Whether ``names`` are the vla_sched node's placeholders ``a0``, ``a1``, ..."""
    return bool(names) and all(PLACEHOLDER_NAME.fullmatch(name) for name in names)


def _ms(value: float) -> str:
    return NO_DATA if math.isnan(value) else f'{value:.1f}'


def executor_status(
    executor: ChunkExecutor,
    config: ChunkExecutorConfig,
    *,
    node_name: str,
    now_ns: int,
    gate: SafetyGate | None = None,
    starvation: StarvationCounts | None = None,
) -> StatusData:
    """The executor's /diagnostics status: STALE before its first chunk, WARN while it holds
    after having played or while its JointTrajectoryController gets placeholder joint names,
    OK while it plays."""
    counts = executor.counts
    starvation = starvation or StarvationCounts()
    age_ns = executor.newest_age_ns(now_ns)
    age = NO_DATA if age_ns is None else f'{age_ns / 1e9:.3f}'
    last_reason, last_detail = counts.last_skip or ('', '')
    num_skipped = sum(counts.skipped.values())
    hold_ns = executor.hold_ns(now_ns)
    placeholders = config.sink == 'joint_trajectory' and placeholder_names(
        executor.newest_joint_names
    )
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
    elif placeholders:
        level = WARN
        state = 'holding' if executor.holding else 'executing'
        names = executor.newest_joint_names
        message = (
            f"joint names {names[0]}..{names[-1]} are placeholders: set the robot's "
            "action_joint_names on the vla_sched node to its controller's joints"
        )
    elif executor.holding:
        level, state = WARN, 'holding'
        message = (
            f'holding {hold_ns / 1e9:.1f} s: no valid action left (newest chunk {age} s old, '
            f'last skipped {last_reason or NO_DATA})'
        )
    else:
        level, message, state = OK, f'executing (newest chunk {age} s old)', 'executing'
    longest_ns = max(counts.longest_hold_ns, hold_ns)
    values = [
        ('state', state),
        ('sink', config.sink),
        ('blending', config.blending),
        ('min lead (ms)', f'{executor.min_lead_ns / 1e6:g}'),
        ('actions executed', str(counts.actions_executed)),
        ('chunks executed', str(counts.chunks_executed)),
        (PERIOD_P50_KEY, _ms(executor.action_periods.percentile(50))),
        (PERIOD_P99_KEY, _ms(executor.action_periods.percentile(99))),
        ('holds', str(counts.holds)),
        ('time held (s)', f'{(counts.held_ns + hold_ns) / 1e9:.3f}'),
        ('current hold (s)', f'{hold_ns / 1e9:.3f}'),
        ('longest hold (s)', f'{longest_ns / 1e9:.3f}'),
        ('starvation action', config.starvation_action),
        ('starvation timeouts', str(starvation.timeouts)),
        ('safe position moves', str(starvation.safe_position_moves)),
        ('safe positions refused', str(starvation.safe_position_refused)),
        *((f'chunks skipped: {r}', str(counts.skipped[r])) for r in SKIP_REASONS),
        ('safety gate', config.safety_gate),
        *_gate_values(gate),
        (AGE_KEY, age),
        (LAST_SKIP_KEY, f'{last_reason}: {last_detail}' if last_reason else NO_DATA),
    ]
    return StatusData(node_name + STATUS_SUFFIX, level, message, node_name, tuple(values))


def _gate_values(gate: SafetyGate | None) -> list[tuple[str, str]]:
    """The safety gate's counts by reason (n/a while it is off)."""
    on = gate is not None and gate.enabled

    def count(table: str, reason: str) -> str:
        return str(getattr(gate, table)[reason]) if on else NO_DATA

    values = [('safety gate checked', str(gate.checked) if on else NO_DATA)]
    values += [(f'safety gate refused: {r}', count('refused', r)) for r in GATE_REASONS]
    values += [(f'safety gate clipped: {r}', count('clipped', r)) for r in CHECK_REASONS]
    return values


class ChunkExecutorNode(Node):
    """Plays ``vla/action_chunk`` to the configured sink (see the module docstring)."""

    def __init__(self, **node_kwargs) -> None:
        super().__init__(NODE_NAME, **node_kwargs)
        self.config = declare_config(self)
        cfg = self.config
        self.executor_rules = executor_of(cfg)
        self.gate = SafetyGate(
            mode=cfg.safety_gate,
            limits=cfg.limits(),
            max_state_age_ns=round(cfg.max_joint_state_age_s * NS_PER_S),
        )
        self.starvation = StarvationCounts()
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
        self._starvation_timer = self.create_timer(
            max(cfg.starvation_timeout_s, 1e-3), self._on_starvation, autostart=False
        )
        self.create_timer(cfg.diagnostics_period_s, self.publish_diagnostics)
        self.create_subscription(ActionChunk, cfg.chunk_topic, self._on_chunk, CONTROL_QOS)
        if self.gate.enabled:
            # best effort matches a reliable publisher too
            self.create_subscription(
                JointState, cfg.joint_state_topic, self._on_joint_state, qos_profile_sensor_data
            )
        self._last_twist_frame = ''
        self._safe_refusal = ''
        self.get_logger().info(
            f'playing {self.resolve_topic_name(cfg.chunk_topic)} to sink {cfg.sink}'
            f'{" and the gripper" if cfg.publish_gripper else ""}, blending {cfg.blending}, '
            f'safety gate {cfg.safety_gate}'
        )

    def _now_ns(self) -> int:
        return self.get_clock().now().nanoseconds

    def _on_chunk(self, msg: ActionChunk) -> None:
        """Check, keep and play a chunk; no message ends the executor."""
        now = self._now_ns()
        if take_chunk(self.executor_rules, self.chunk_rules, msg, now, self.gate):
            self._play(now)
        else:
            self._log_skip(str(msg.action_space))

    def _on_joint_state(self, msg: JointState) -> None:
        self.gate.measure(msg.name, msg.position, self._now_ns())

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
                self._starvation_timer.reset()  # one-shot: cancelled when it fires
        else:
            self._starvation_timer.cancel()
            self._send(command)
        due = self.executor_rules.next_tick_ns(now_ns)
        if due is None:
            self._tick_timer.cancel()
            return
        self._tick_timer.timer_period_ns = max(1, due - now_ns)
        self._tick_timer.reset()

    def _on_starvation(self) -> None:
        """A hold outlasted ``starvation_timeout_s``: keep holding, or go to the safe position."""
        self._starvation_timer.cancel()
        since = self.executor_rules.hold_since_ns
        if since is None or since == self.starvation.handled_hold_ns:
            return
        self.starvation.handled_hold_ns = since
        self.starvation.timeouts += 1
        if self.config.starvation_action != 'safe_position':
            return
        trajectory = self.safe_position_trajectory(self._now_ns())
        if trajectory is None:
            self.starvation.safe_position_refused += 1
            self.get_logger().warning(
                f'safe position refused by the safety gate: {self._safe_refusal}'
            )
            return
        self.starvation.safe_position_moves += 1
        self._trajectory.publish(trajectory)

    def safe_position_trajectory(self, now_ns: int) -> JointTrajectory | None:
        """The trajectory to the safe position, reached ``safe_position_time_s`` from now;
        None when the safety gate (when on) refuses it."""
        cfg = self.config
        pairs = cfg.safe_joint_position()
        names = tuple(name for name, _ in pairs)
        target = np.array([value for _, value in pairs], dtype=np.float64)
        if self.gate.enabled:
            verdict = self.gate.check_target(names, target, cfg.safe_position_time_s, now_ns)
            if verdict.actions is None:
                self._safe_refusal = verdict.detail
                return None
        duration_ns = round(cfg.safe_position_time_s * NS_PER_S)
        command = Command(
            at_ns=now_ns,
            rows=target[None, :],
            reached_ns=(now_ns + duration_ns,),
            dt_ns=duration_ns,
            joint_names=names,
            action_space='joint_position',
            frame_id='',
        )
        return trajectory_message(command, stamped=cfg.trajectory_start == 'now')

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
            gate=self.gate,
            starvation=self.starvation,
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
