"""The frontend node: robots' topics in, the engine in the middle, action chunks out.

Each robot's topics are in ``robot_topics``; the node publishes ``/diagnostics`` at
``diagnostics.period_s``. Callbacks only check and enqueue: camera images go through
``CameraInput`` (small raw images converted at once, compressed and large ones by worker
threads, so a slow or hostile image never holds this executor) into the robot's
``RobotSlot`` (newest observation wins), and a robot that is due is sent its step at once.
The node polls nothing: the engine client's receiving thread triggers a guard condition when
the engine's messages arrive (or the engine ends), and that wakes the executor to publish
results and send the robots that became free their next steps. A one-shot timer wakes it
when the next ``periodic`` robot falls due, and one timer every ``engine.heartbeat_period_s``
sends the node's heartbeat, notices a silent engine, restarts a dead one and publishes
/diagnostics when its period has come. When the engine dies, every step in flight is answered
with StepRejected(ENGINE_UNAVAILABLE), nothing it computed is published, and the engine is
restarted after ``engine.restart_delay_s``, doubling for each death in a row up to
``engine.restart_max_delay_s``.

    python -m vla_sched.ros.node --ros-args --params-file config/vla_sched.yaml
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Sequence

import rclpy
from diagnostic_msgs.msg import DiagnosticArray
from rclpy.exceptions import ParameterException
from rclpy.executors import ExternalShutdownException, SingleThreadedExecutor
from rclpy.node import Node
from rclpy.signals import SignalHandlerOptions

from vla_sched.engine.checkpoints import check_model_path
from vla_sched.engine.client import EngineClient, EngineUnavailable
from vla_sched.ipc.codec import CodecError
from vla_sched.ipc.messages import (
    CloseSession,
    EngineInfo,
    FailureReason,
    StepFailure,
    StepRequest,
    StepResult,
)
from vla_sched.ros import diagnostics, parameters
from vla_sched.ros.camera_input import CameraInput
from vla_sched.ros.conversions import (
    ConversionError,
    check_instruction,
    joint_state_to_vector,
    stamp_to_ns,
)
from vla_sched.ros.engine_link import EngineLink, engine_clock
from vla_sched.ros.node_config import ConfigError, FrontendConfig
from vla_sched.ros.outcomes import Outcomes
from vla_sched.ros.robot_slot import Refusal, RobotSlot
from vla_sched.ros.robot_topics import RobotTopics, quiet_publisher
from vla_sched.ros.shutdown import ShutdownRequest
from vla_sched.ros.topic_check import PublisherCheck

NODE_NAME = 'vla_sched'


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
        self.topics: dict[str, RobotTopics] = {}
        self.outcomes = Outcomes(
            self.slots, self.topics, late_policy=self.config.late_policy, logger=self.get_logger()
        )
        self.camera = CameraInput(
            self,
            self.slots,
            max_pixels=self.config.max_image_pixels,
            max_future_stamp_s=self.config.max_future_stamp_s,
            now_ns=self._now_ns,
            refuse=self.outcomes.refuse,
            on_new=self._dispatch,
        )
        for rid, slot in self.slots.items():
            self.topics[rid] = RobotTopics(
                self,
                slot,
                on_image=self.camera.on_image,
                on_joints=self._on_joints,
                on_instruction=self._on_instruction,
                output_lifespan_s=self.config.step_budget_s,
            )
        self._publisher_check = PublisherCheck(
            [watched for topics in self.topics.values() for watched in topics.watched],
            count_publishers=self.count_publishers,
            publishers_info=self.get_publishers_info_by_topic,
        )
        client = (client_factory or _engine_client)(self.config)
        self._engine_spoke = self.create_guard_condition(self._pump)
        client.on_arrival = self._wake_for_engine
        self.link = EngineLink(client, self.config.link)
        self._diagnostics_pub = self.create_publisher(
            DiagnosticArray, '/diagnostics', 10, event_callbacks=quiet_publisher()
        )
        # Fires only when a periodic robot with an observation waits for its period.
        self._due_timer = self.create_timer(1.0, self._on_due, autostart=False)
        self.link.start()
        self.get_logger().info(
            f'serving {len(self.slots)} robots {sorted(self.slots)}; engine '
            f'{self.config.link.mode} mode, starting'
        )
        # One timer for the heartbeat and /diagnostics: one wake-up where two would come.
        diagnostics_ns = round(self.config.diagnostics.period_s * 1e9)
        tick_s = min(self.config.link.heartbeat_period_s, self.config.diagnostics.period_s)
        self._diagnostics_period_ns = diagnostics_ns
        self._tick_ns = round(tick_s * 1e9)
        self._diagnostics_due_ns = self._now_ns() + diagnostics_ns
        self.create_timer(tick_s, self._tick)

    # --- callbacks: check and enqueue ----------------------------------------------------

    def _on_joints(self, slot: RobotSlot, msg) -> None:
        try:
            slot.set_state(
                joint_state_to_vector(msg, slot.config.state_joint_names),
                stamp_ns=stamp_to_ns(msg.header.stamp),
            )
        except ConversionError as exc:
            slot.refuse_state(str(exc))
            now = self._now_ns()
            stamp = stamp_to_ns(msg.header.stamp) or now
            self.outcomes.refuse(slot, FailureReason.INVALID_STATE, str(exc), stamp, now)

    def _on_instruction(self, slot: RobotSlot, msg) -> None:
        try:
            text = check_instruction(msg.data, max_bytes=self.config.max_instruction_bytes)
        except ConversionError as exc:
            slot.refuse_instruction(str(exc))
            self._close_session(slot.robot_id)
            now = self._now_ns()
            self.outcomes.refuse(slot, FailureReason.INVALID_INSTRUCTION, str(exc), now, now)
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
                self.outcomes.result(msg, self._now_ns(), self.link.info)
            elif isinstance(msg, StepFailure):
                self.outcomes.failure(msg, self._now_ns())
            elif isinstance(msg, EngineInfo):
                self._on_engine_info(msg)
        self._dispatch()

    def _tick(self) -> None:
        """Every heartbeat period (or diagnostics period, if shorter): the pump's periodic
        work, and /diagnostics when its period has come (within half a tick)."""
        self._pump()
        now = self._now_ns()
        if now + self._tick_ns // 2 >= self._diagnostics_due_ns:
            self._diagnostics_due_ns += self._diagnostics_period_ns
            if self._diagnostics_due_ns <= now:  # fell behind: skip the missed periods
                self._diagnostics_due_ns = now + self._diagnostics_period_ns
            self.publish_diagnostics()

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
                self.outcomes.publish_refusal(step)
            elif info is None:
                self.outcomes.refuse(
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
        self.outcomes.refuse(slot, reason, detail, step.stamp_ns, now)

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
            self.outcomes.abandon(
                slot, FailureReason.ENGINE_UNAVAILABLE, f'engine dead: {why}', now
            )
        self.publish_diagnostics()

    # --- helpers ------------------------------------------------------------------------------

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
        for problem in self._publisher_check.new_problems():
            self.get_logger().warning(problem)
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
        self.camera.close()
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
