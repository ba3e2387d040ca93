"""The frontend node: robots' topics in, the engine in the middle, action chunks out.

Per robot (under its namespace) it subscribes ``camera/image_raw`` (sensor-data QoS; or
``camera/image_raw/compressed``), ``joint_states`` and ``vla/instruction`` (transient local),
and publishes ``vla/action_chunk``, ``vla/step_rejected`` and, if enabled,
``vla/joint_trajectory``. It publishes ``/diagnostics`` at ``diagnostics.period_s``.

Callbacks only check and enqueue: camera images are converted (decoded, checked against
``limits.max_image_pixels`` from their header first) by ``ImageIntake`` worker threads, so a
slow or hostile image never holds this executor; a guard condition brings each converted
image back here, into the robot's ``RobotSlot`` (newest observation wins), and a robot that
is due is sent its step at once. The node polls nothing: the engine client's receiving
thread triggers another guard condition when the engine's messages arrive (or the engine
ends), and that wakes the executor to publish results and send the robots that became free
their next steps. A one-shot timer wakes it when the next ``periodic`` robot falls due, and
one timer every ``engine.heartbeat_period_s`` sends the node's heartbeat, notices a silent
engine and restarts a dead one. When the engine dies, every step in flight is answered with
StepRejected(ENGINE_UNAVAILABLE), nothing it computed is published, and the engine is
restarted after ``engine.restart_delay_s``, doubling for each death in a row up to
``engine.restart_max_delay_s``.

    python -m vla_sched.ros.node --ros-args --params-file config/vla_sched.yaml
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Sequence

import rclpy
from diagnostic_msgs.msg import DiagnosticArray
from rclpy.event_handler import PublisherEventCallbacks, SubscriptionEventCallbacks
from rclpy.exceptions import ParameterException
from rclpy.executors import ExternalShutdownException, SingleThreadedExecutor
from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
from rclpy.qos import qos_profile_sensor_data as sensor_qos
from rclpy.signals import SignalHandlerOptions
from sensor_msgs.msg import CompressedImage, Image, JointState
from std_msgs.msg import String
from trajectory_msgs.msg import JointTrajectory

from vla_sched.ipc.codec import CodecError
from vla_sched.ipc.messages import (
    CloseSession,
    EngineInfo,
    FailureReason,
    StepFailure,
    StepRequest,
    StepResult,
)
from vla_sched.msg import ActionChunk, StepRejected
from vla_sched.ros import diagnostics, outputs, parameters
from vla_sched.ros.conversions import (
    ConversionError,
    check_instruction,
    compressed_to_rgb,
    image_to_rgb,
    joint_state_to_vector,
    stamp_to_ns,
)
from vla_sched.ros.engine_clock import engine_clock
from vla_sched.ros.engine_link import EngineLink
from vla_sched.ros.image_intake import Converted, ImageIntake
from vla_sched.ros.node_config import ConfigError, FrontendConfig
from vla_sched.ros.robot_slot import Observation, Refusal, RobotSlot, stamp_problem
from vla_sched.ros.shutdown import ShutdownRequest
from vla_sched.serving.checkpoints import check_model_path
from vla_sched.serving.engine_client import EngineClient, EngineUnavailable

NODE_NAME = 'vla_sched'


def _quiet_publisher() -> PublisherEventCallbacks:
    """No QoS event handlers: rclpy's executor walks each one on every wake-up, and each of a
    robot's publishers would add two; a subscriber that does not match logs it itself."""
    return PublisherEventCallbacks(use_default_callbacks=False)


class RobotTopics:
    """One robot's publishers (subscriptions are kept by the node)."""

    def __init__(self, node: Node, slot: RobotSlot) -> None:
        ns = slot.config.topic_namespace
        quiet = _quiet_publisher()
        self.chunks = node.create_publisher(
            ActionChunk, f'{ns}/vla/action_chunk', 10, event_callbacks=quiet
        )
        self.rejected = node.create_publisher(
            StepRejected, f'{ns}/vla/step_rejected', 10, event_callbacks=quiet
        )
        self.trajectory = None
        if slot.config.publish_joint_trajectory:
            self.trajectory = node.create_publisher(
                JointTrajectory, f'{ns}/vla/joint_trajectory', 10, event_callbacks=quiet
            )


class VlaSchedNode(Node):
    """The frontend node (see the module docstring)."""

    def __init__(self, *, client_factory=None, command_line: Sequence[str] = (), **kwargs) -> None:
        """Declare and read the parameters, subscribe every robot, start the engine.

        Args:
            client_factory: builds the engine client from the ``FrontendConfig`` (default:
                ``EngineClient`` with the engine and link settings from the parameters).
            command_line: the arguments given to ``rclpy.init``; a ``--params-file`` there
                that gives this node no parameters is refused.
            **kwargs: passed to ``rclpy.node.Node`` (e.g. ``parameter_overrides``).

        Raises:
            ConfigError: a parameter is missing, malformed, inconsistent or unknown.
            ModelPathError: ``engine.model_path`` cannot be served, or it holds several
                datasets' statistics and ``engine.unnorm_key`` names none of them.
        """
        super().__init__(NODE_NAME, **kwargs)
        self.config: FrontendConfig = parameters.declare_and_read(self, command_line=command_line)
        check_model_path(self.config.engine_config())
        self.add_on_set_parameters_callback(
            parameters.runtime_validator(self.config, self._apply_runtime_param)
        )
        now = self._now_ns()
        window_s = self.config.diagnostics.window_s
        self.slots = {
            r.robot_id: RobotSlot(r, window_s=window_s, created_ns=now) for r in self.config.robots
        }
        self.topics = {rid: RobotTopics(self, slot) for rid, slot in self.slots.items()}
        self._converted_ready = self.create_guard_condition(self._take_converted)
        self.intake = ImageIntake(on_ready=self._wake_for_converted)
        for slot in self.slots.values():
            self._subscribe(slot)
        client = (client_factory or _engine_client)(self.config)
        self._engine_spoke = self.create_guard_condition(self._pump)
        client.on_arrival = self._wake_for_engine
        self.link = EngineLink(client, self.config.link)
        self._diagnostics_pub = self._create_diagnostics_publisher()
        # Fires only when a periodic robot with an observation waits for its period.
        self._due_timer = self.create_timer(1.0, self._on_due, autostart=False)
        self.link.start()
        self.get_logger().info(
            f'serving {len(self.slots)} robots {sorted(self.slots)}; engine '
            f'{self.config.link.mode} mode, starting'
        )
        self.create_timer(self.config.link.heartbeat_period_s, self._pump)
        self.create_timer(self.config.diagnostics.period_s, self.publish_diagnostics)

    # --- wiring -----------------------------------------------------------------------------

    def _subscribe(self, slot: RobotSlot) -> None:
        ns = slot.config.topic_namespace
        if slot.config.image_transport == 'compressed':
            self.create_subscription(
                CompressedImage,
                f'{ns}/camera/image_raw/compressed',
                lambda msg: self._on_image(slot, msg, compressed=True),
                sensor_qos,
            )
        else:
            self.create_subscription(
                Image, f'{ns}/camera/image_raw', lambda msg: self._on_image(slot, msg), sensor_qos
            )
        # Sensor QoS (best effort, volatile) matches every publisher, so the QoS event handlers
        # could only report a wrong message type, which a missing state reports too; the
        # camera's keep them, as a wrong image type is the common mistake.
        self.create_subscription(
            JointState,
            f'{ns}/joint_states',
            lambda msg: self._on_joints(slot, msg),
            sensor_qos,
            event_callbacks=SubscriptionEventCallbacks(use_default_callbacks=False),
        )
        latched = QoSProfile(
            depth=1,
            reliability=ReliabilityPolicy.RELIABLE,
            durability=DurabilityPolicy.TRANSIENT_LOCAL,
        )
        self.create_subscription(
            String, f'{ns}/vla/instruction', lambda msg: self._on_instruction(slot, msg), latched
        )

    def _create_diagnostics_publisher(self):
        return self.create_publisher(DiagnosticArray, '/diagnostics', 10)

    # --- callbacks: convert and enqueue -----------------------------------------------------

    def _on_image(self, slot: RobotSlot, msg, *, compressed: bool = False) -> None:
        now = self._now_ns()
        stamp = stamp_to_ns(msg.header.stamp)
        max_future_ns = round(self.config.max_future_stamp_s * 1e9)
        problem = stamp_problem(stamp, now, max_future_ns=max_future_ns)
        if problem is not None:
            self._refuse(slot, FailureReason.MALFORMED_IMAGE, problem, stamp, now)
            return
        convert = compressed_to_rgb if compressed else image_to_rgb
        job = functools.partial(convert, msg, max_pixels=self.config.max_image_pixels)
        if self.intake.submit(slot.robot_id, job, stamp_ns=stamp, received_ns=now):
            slot.supersede_unconverted()

    def _wake_for_converted(self) -> None:
        """Called from an intake worker: wake the executor to take the result."""
        with contextlib.suppress(Exception):  # the node is being destroyed
            self._converted_ready.trigger()

    def _take_converted(self) -> None:
        """Converted images into their slots, refused ones answered, and the robots that
        are due sent (executor thread)."""
        for converted in self.intake.take():
            self._on_converted(self.slots[converted.robot_id], converted)
        self._dispatch()

    def _on_converted(self, slot: RobotSlot, converted: Converted) -> None:
        if converted.image is None:
            self._refuse(
                slot,
                FailureReason.MALFORMED_IMAGE,
                converted.error,
                converted.stamp_ns,
                self._now_ns(),
            )
            return
        slot.offer_image(
            Observation(
                image=converted.image,
                stamp_ns=converted.stamp_ns,
                received_ns=converted.received_ns,
            )
        )

    def _on_joints(self, slot: RobotSlot, msg) -> None:
        names = slot.config.state_joint_names
        if not names:
            return  # this robot sends no state to the checkpoint
        try:
            slot.set_state(joint_state_to_vector(msg, names))
        except ConversionError as exc:
            slot.refuse_state(str(exc))
            now = self._now_ns()
            stamp = stamp_to_ns(msg.header.stamp) or now
            self._refuse(slot, FailureReason.INVALID_STATE, str(exc), stamp, now)

    def _on_instruction(self, slot: RobotSlot, msg) -> None:
        try:
            text = check_instruction(msg.data, max_bytes=self.config.max_instruction_bytes)
        except ConversionError as exc:
            slot.refuse_instruction(str(exc))
            self._close_session(slot.robot_id)
            now = self._now_ns()
            self._refuse(slot, FailureReason.INVALID_INSTRUCTION, str(exc), now, now)
            return
        if slot.set_instruction(text):
            self._log_instruction(slot, slot.instruction_changes.add(self._now_ns()))

    def _log_instruction(self, slot: RobotSlot, num_changes: int) -> None:
        """One line per robot at most every few seconds, however often it changes."""
        if num_changes:
            self.get_logger().info(
                f'{slot.robot_id}: instruction {slot.instruction[:80]!r} '
                f'({num_changes} change{"s" if num_changes > 1 else ""} since the last line)'
            )

    def _apply_runtime_param(self, robot_id: str, name: str, value) -> None:
        slot = self.slots[robot_id]
        if name == 'period_s':
            slot.set_period(value)
        elif value:
            slot.set_instruction(value)
        else:
            slot.refuse_instruction('instruction parameter cleared')

    # --- the pump: engine messages in, due steps out ----------------------------------------

    def _wake_for_engine(self) -> None:
        """Called from the engine client's receiving thread: wake the executor to pump."""
        with contextlib.suppress(Exception):  # the node is being destroyed
            self._engine_spoke.trigger()

    def _pump(self) -> None:
        """Engine messages in, due steps out: when the engine spoke, and every heartbeat
        period (the node's heartbeat, a silent engine, a restart that is due)."""
        polled = self.link.poll()
        if polled.died:
            self._on_engine_death(polled.died)
        for msg in polled.messages:
            if isinstance(msg, StepResult):
                self._on_result(msg)
            elif isinstance(msg, StepFailure):
                self._on_failure(msg)
            elif isinstance(msg, EngineInfo):
                self._on_engine_info(msg)
        self._dispatch()

    def _on_due(self) -> None:
        self._due_timer.cancel()
        self._dispatch()

    def _dispatch(self) -> None:
        """Send every robot that is due its step, then arm the timer for the next one that
        will be due once its period has come."""
        now = self._now_ns()
        info = self.link.info
        budget_ns = round(self.config.step_budget_s * 1e9)
        next_due_ns = None
        for slot in self.slots.values():
            if not slot.is_due(now):
                due_ns = slot.due_at_ns()
                if due_ns is not None and (next_due_ns is None or due_ns < next_due_ns):
                    next_due_ns = due_ns
                continue
            num_state = info.num_state if info is not None else 0
            step = slot.take_step(
                now, budget_ns=budget_ns, num_state=num_state, priority=slot.config.priority
            )
            if isinstance(step, Refusal):
                self._publish_refusal(step)
            elif info is None:
                self._refuse(
                    slot,
                    FailureReason.ENGINE_UNAVAILABLE,
                    f'engine {self.link.state}',
                    step.stamp_ns,
                    now,
                )
            else:
                self._send(slot, step, now)
        self._arm_due_timer(next_due_ns, now)

    def _arm_due_timer(self, due_ns: int | None, now: int) -> None:
        if due_ns is None:
            self._due_timer.cancel()
            return
        self._due_timer.timer_period_ns = max(1, due_ns - now)
        self._due_timer.reset()

    def _send(self, slot: RobotSlot, step: StepRequest, now: int) -> None:
        """Send ``step``, or answer it: whatever keeps it from the engine (no engine, a step
        the codec refuses, a transport error) becomes a StepRejected for it, and the robot
        stays free, so its next step is sent."""
        try:
            self.link.send(engine_clock(step, now_ns=now))
        except EngineUnavailable as exc:
            reason, detail = FailureReason.ENGINE_UNAVAILABLE, str(exc)
        except CodecError as exc:
            reason, detail = FailureReason.MALFORMED_IMAGE, f'step cannot be encoded: {exc}'
        except Exception as exc:
            reason = FailureReason.ENGINE_UNAVAILABLE
            detail = f'step could not be sent: {type(exc).__name__}: {exc}'
        else:
            slot.mark_sent(step)
            return
        self._refuse(slot, reason, detail, step.stamp_ns, now)

    def _on_result(self, result: StepResult) -> None:
        slot = self.slots.get(result.robot_id)
        if slot is None or not slot.owns(result.step_seq):
            return  # not the step in flight: stale, never published
        now = self._now_ns()
        late = slot.is_late(result, now)
        if late and self.config.late_policy == 'drop':
            late_ms = max(0.0, (now - slot.in_flight.deadline_ns) / 1e6)
            self._abandon(slot, FailureReason.DEADLINE_MISSED, f'done {late_ms:.1f} ms late', now)
            return
        try:
            chunk = self._chunk(slot, result, now, late=late)
        except (ConfigError, ValueError) as exc:
            self._abandon(slot, FailureReason.INTERNAL_ERROR, str(exc), now)
            return
        topics = self.topics[slot.robot_id]
        topics.chunks.publish(chunk)
        if topics.trajectory is not None:
            topics.trajectory.publish(outputs.joint_trajectory(chunk, dt_s=slot.config.dt))
        slot.finish(result, now, late=late)

    def _chunk(self, slot: RobotSlot, result: StepResult, now: int, *, late: bool):
        info = self.link.info
        action_dim = info.action_dim if info is not None else int(result.actions.shape[-1])
        return outputs.action_chunk(
            result,
            slot.config,
            deadline_ns=slot.in_flight.deadline_ns,
            published_ns=now,
            joint_names=slot.config.action_names(action_dim),
            late=late,
        )

    def _abandon(self, slot: RobotSlot, reason: FailureReason, detail: str, now: int) -> None:
        refusal = slot.abandon(reason, detail, now)
        if refusal is not None:
            self._publish_refusal(refusal)

    def _on_failure(self, failure: StepFailure) -> None:
        slot = self.slots.get(failure.robot_id)
        if slot is None:
            return
        refusal = slot.fail(failure, self._now_ns())
        if refusal is not None:
            self._publish_refusal(refusal)
            if failure.reason is FailureReason.KV_POOL_FULL:
                self.get_logger().warning(f'{slot.robot_id}: {failure.detail}')

    def _on_engine_info(self, info: EngineInfo) -> None:
        if self.link.ready:  # its refusals and downtime are over
            now = self._now_ns()
            for slot in self.slots.values():
                slot.engine_back(now)
        weights = ' (random weights: actions are meaningless)' if info.random_weights else ''
        self.get_logger().info(
            f'engine ready: {info.model_name}{weights}; state {info.num_state}, '
            f'actions {info.action_horizon}x{info.action_dim}, image {info.image_size}px'
        )
        for slot in self.slots.values():
            try:
                slot.config.action_names(info.action_dim)
            except ConfigError as exc:
                self.get_logger().error(str(exc))
            names = slot.config.state_joint_names
            if info.num_state and len(names) != info.num_state:
                self.get_logger().error(
                    f'robots.{slot.robot_id}.state_joint_names has {len(names)} names; the '
                    f'checkpoint takes {info.num_state} state values'
                )

    def _on_engine_death(self, why: str) -> None:
        now = self._now_ns()
        self.get_logger().error(
            f'engine dead ({why}); restart in {self.link.restart_delay_s:.1f} s '
            f'(attempt {self.link.restart_attempt})'
        )
        for slot in self.slots.values():
            self._abandon(slot, FailureReason.ENGINE_UNAVAILABLE, f'engine dead: {why}', now)
        self.publish_diagnostics()

    # --- helpers ------------------------------------------------------------------------------

    def _refuse(
        self, slot: RobotSlot, reason: FailureReason, detail: str, stamp_ns: int, now: int
    ) -> None:
        refusal = slot.refuse(Refusal(slot.robot_id, 0, stamp_ns, reason, detail), now)
        self._publish_refusal(refusal)

    def _publish_refusal(self, refusal: Refusal) -> None:
        self.topics[refusal.robot_id].rejected.publish(outputs.step_rejected(refusal))
        self.get_logger().warning(
            f'{refusal.robot_id}: step {refusal.step_seq} refused: {refusal.reason.value}: '
            f'{refusal.detail[:200]}',
            throttle_duration_sec=1.0,
        )

    def _close_session(self, robot_id: str) -> None:
        if self.link.ready:
            try:
                self.link.send(CloseSession(robot_id=robot_id))
            except EngineUnavailable:
                pass  # a dead engine holds no sessions
            except Exception as exc:
                self.get_logger().warning(
                    f'{robot_id}: session close not sent: {type(exc).__name__}: {exc}'
                )

    def _now_ns(self) -> int:
        return self.get_clock().now().nanoseconds

    def publish_diagnostics(self) -> None:
        now = self._now_ns()
        for slot in self.slots.values():
            self._log_instruction(slot, slot.instruction_changes.due(now))
        msg = diagnostics.diagnostic_array(
            self.link.view(),
            [slot.view(now) for slot in self.slots.values()],
            self.config.diagnostics,
            stamp=self.get_clock().now().to_msg(),
            node_name=self.get_fully_qualified_name(),
        )
        self._diagnostics_pub.publish(msg)

    def close(self) -> None:
        """Stop the image workers and the engine (its process too); free the runtime folder."""
        self.intake.close()
        self.link.close()


def _engine_client(config: FrontendConfig):
    return EngineClient(config.engine_config(), config.link)


def main(argv: list[str] | None = None) -> int:
    """Run the node until SIGINT or SIGTERM (0, however often signalled); 2 on a
    configuration error. The engine is stopped and its runtime folder removed on the way out.
    """
    argv = list(argv if argv is not None else sys.argv)
    with (
        ShutdownRequest() as shutdown,
        rclpy.init(args=argv, signal_handler_options=SignalHandlerOptions.NO),
    ):
        try:
            node = VlaSchedNode(command_line=argv)
        except (ValueError, TypeError, ParameterException) as exc:
            print(f'vla_sched: configuration error: {exc}', file=sys.stderr)
            return 2
        executor = SingleThreadedExecutor()
        executor.add_node(node)
        try:
            # No timeout: the heartbeat timer ends every wait within its period, and a signal's
            # handler runs when the wait returns.
            while not shutdown.requested and rclpy.ok():
                executor.spin_once()
            if shutdown.requested:
                node.get_logger().info(f'{shutdown.signal_name}: stopping the engine')
        except ExternalShutdownException:
            pass  # the context was shut down from elsewhere: stop as on a signal
        finally:
            node.close()
            executor.shutdown()
            node.destroy_node()
    return 0


if __name__ == '__main__':
    sys.exit(main())
