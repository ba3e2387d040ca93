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

It is a managed (lifecycle) node, driven through its lifecycle services (``ros2 lifecycle
get/set``, a launch file, a lifecycle manager):

- configure checks the checkpoint and starts the engine, which loads it (/diagnostics shows
  the engine starting until it is ready); a checkpoint that cannot be served fails the
  transition, naming why, and the node stays unconfigured;
- activate starts serving: steps are sent, chunks and the arm's commands published (their
  publishers are lifecycle publishers);
- deactivate stops both: the steps in flight and every later one are refused with
  StepRejected(INACTIVE), and the engine keeps its model and sessions;
- cleanup and shutdown stop the engine (and its process).

The robots' subscriptions, ``vla/step_rejected`` and /diagnostics live in every state: a node
that is not active refuses each step that falls due with INACTIVE and reports its lifecycle
state and its engine's on /diagnostics. With the parameter ``autostart`` (default true) the
node configures and activates itself once it spins (a one-shot timer, as nav2's lifecycle
servers do), so a node started on its own serves at once; a configure that fails there is a
failed transition like any other: the node stays unconfigured and says why in its log and on
/diagnostics. The launch files start it with ``--managed`` on its command line (not a
parameter, so a dump of its parameters starts a node on its own that serves): it then waits
for its transitions, which they drive, whatever ``autostart`` says.

``--ros-args --log-level <level>`` (or ``<node logger>:=<level>``, as the launch files give
it) sets the node's logger, and ``main`` forwards the package's Python loggers to it at the
same level (``ros_logging``).

    python -m vla_sched.ros.node --ros-args --params-file config/vla_sched.yaml
"""

from __future__ import annotations

import contextlib
import functools
import sys
import traceback
from collections.abc import Callable, Sequence

import rclpy
from diagnostic_msgs.msg import DiagnosticArray
from rclpy.clock import Clock, ClockType
from rclpy.exceptions import ParameterException
from rclpy.executors import ExternalShutdownException, SingleThreadedExecutor
from rclpy.lifecycle import LifecycleNode, LifecycleState, TransitionCallbackReturn
from rclpy.signals import SignalHandlerOptions
from rclpy.utilities import remove_ros_args

from vla_sched.engine.checkpoints import ModelPathError, check_model_path
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
from vla_sched.ros.diagnostic_keys import SIM_CLOCK, SIM_NO_CLOCK, SYSTEM_CLOCK
from vla_sched.ros.engine_link import EngineLink, EngineView, engine_clock
from vla_sched.ros.launch_args import MANAGED_FLAG
from vla_sched.ros.model_input import model_image_sizes
from vla_sched.ros.node_config import ConfigError, FrontendConfig
from vla_sched.ros.outcomes import Outcomes
from vla_sched.ros.robot_slot import Refusal, RobotSlot
from vla_sched.ros.robot_topics import RobotTopics, quiet_publisher
from vla_sched.ros.ros_logging import forward_python_logs, stop_forwarding
from vla_sched.ros.shutdown import ShutdownRequest
from vla_sched.ros.topic_check import PublisherCheck

NODE_NAME = 'vla_sched'
SUCCESS = TransitionCallbackReturn.SUCCESS
FAILURE = TransitionCallbackReturn.FAILURE
ERROR = TransitionCallbackReturn.ERROR


# The primary state a transition callback leads to on SUCCESS and on FAILURE (the lifecycle
# design's state machine, which rcl runs); on ERROR the node goes through on_error, whose own
# result decides. rclpy keeps the state in a private field, so the node follows it here.
STATE_AFTER = {
    'on_configure': ('inactive', 'unconfigured'),
    'on_activate': ('active', 'inactive'),
    'on_deactivate': ('inactive', 'active'),
    'on_cleanup': ('unconfigured', 'inactive'),
    'on_shutdown': ('finalized', 'finalized'),
    'on_error': ('unconfigured', 'finalized'),
}


def _transition(callback: Callable) -> Callable:
    """A transition callback that logs an exception it raises and returns ERROR (rclpy turns
    it into ERROR too, but silently), and records the state its result leads to."""
    on_success, on_failure = STATE_AFTER[callback.__name__]

    @functools.wraps(callback)
    def run(node: VlaSchedNode, state: LifecycleState) -> TransitionCallbackReturn:
        try:
            result = callback(node, state)
        except Exception:
            node.get_logger().error(
                f'{callback.__name__} from {state.label} failed:\n{traceback.format_exc()}'
            )
            result = ERROR
        if result == SUCCESS:
            node._lifecycle_state = on_success
        elif result == FAILURE or callback.__name__ == 'on_error':
            node._lifecycle_state = on_failure
        else:
            node._lifecycle_state = 'errorprocessing'
        return result

    return run


class VlaSchedNode(LifecycleNode):
    """The frontend node (see the module docstring)."""

    def __init__(
        self,
        *,
        client_factory=None,
        command_line: Sequence[str] = (),
        managed: bool = False,
        **kwargs,
    ) -> None:
        """Declare and read the parameters, subscribe every robot, and with ``autostart``
        (unless ``managed``) arm the one-shot timer that configures (starts the engine) and
        activates the node once it spins.

        Args:
            client_factory: builds the engine client from the ``FrontendConfig`` (default:
                ``EngineClient`` with the engine and link settings from the parameters).
            command_line: the arguments given to ``rclpy.init``; a ``--params-file`` there
                that gives this node no parameters is refused, and so is a value there that
                names no parameter.
            managed: something else drives its transitions (a launch file; ``--managed`` on
                the command line): it waits for them, whatever ``autostart`` says.
            **kwargs: passed to ``rclpy.node.Node`` (e.g. ``parameter_overrides``).

        Raises:
            ConfigError: a parameter is missing, malformed, inconsistent or unknown.
        """
        super().__init__(NODE_NAME, **kwargs)
        self._lifecycle_state = 'unconfigured'
        self.config: FrontendConfig = parameters.declare_and_read(
            self,
            command_line=[*command_line, *(kwargs.get('cli_args') or ())],
            overrides=kwargs.get('parameter_overrides') or (),
        )
        autostart = self.get_parameter(parameters.AUTOSTART.name).value and not managed
        self.add_on_set_parameters_callback(
            parameters.runtime_validator(self.config, self._apply_runtime_param)
        )
        now = self._now_ns()
        window_s = self.config.diagnostics.window_s
        robots = self.config.robots
        self.slots = {  # periodic robots' phases spread across the period (``period_phase``)
            r.robot_id: RobotSlot(r, window_s=window_s, created_ns=now, phase=i / len(robots))
            for i, r in enumerate(robots)
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
            refuse=self.outcomes.refuse_input,
            on_new=self._dispatch,
            max_decode_s=self.config.max_decode_s,
            model_image_size=model_image_sizes(
                lambda: self.link.info if self.link is not None else None,
                self.config.engine_config(),
            ),
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
        self._client_factory = client_factory or _engine_client
        self._engine_spoke = self.create_guard_condition(self._pump)
        self.link: EngineLink | None = None  # while configured (inactive or active)
        self._active = False  # steps are sent only while active
        self._configure_error = ''  # why the last configure failed
        self._told_no_instruction: set[str] = set()  # robots whose wait was logged
        # A plain publisher: /diagnostics reports in every lifecycle state.
        self._diagnostics_pub = self.create_publisher(
            DiagnosticArray, '/diagnostics', 10, event_callbacks=quiet_publisher()
        )
        # Fires only when a periodic robot with an observation waits for its period.
        self._due_timer = self.create_timer(1.0, self._on_due, autostart=False)
        # One timer for the heartbeat and /diagnostics: one wake-up where two would come.
        diagnostics_ns = round(self.config.diagnostics.period_s * 1e9)
        tick_s = min(self.config.link.heartbeat_period_s, self.config.diagnostics.period_s)
        self._diagnostics_period_ns = diagnostics_ns
        self._tick_ns = round(tick_s * 1e9)
        # On the steady clock: heartbeats and /diagnostics keep their period under
        # use_sim_time, also while nothing publishes /clock (the engine would read a silent
        # frontend as lost).
        self._steady_clock = Clock(clock_type=ClockType.STEADY_TIME)
        self._started_steady_ns = self._steady_ns()  # uptime is never counted in sim time
        self._clock_warned = False  # the WARN that sim time is on and no /clock came
        self._diagnostics_due_ns = self._steady_ns() + diagnostics_ns
        self.create_timer(tick_s, self._tick, clock=self._steady_clock)
        self._autostart_timer = None
        if autostart:
            # On the steady clock: it fires under use_sim_time before /clock runs.
            self._autostart_timer = self.create_timer(
                0.0, self._autostart, clock=self._steady_clock
            )
        else:
            driver = 'its launch file or ' if managed else ''
            self.get_logger().info(
                f'unconfigured: waiting for configure ({driver}ros2 lifecycle set '
                f'{self.get_fully_qualified_name()} configure)'
            )

    def _autostart(self) -> None:
        """Once, when the node first spins: configure and activate, as a node started on its
        own is expected to serve. A transition that fails leaves the node where the failure
        left it (a checkpoint that cannot be served: unconfigured), logged and reported on
        /diagnostics at once; its lifecycle services can take it on from there."""
        self.destroy_timer(self._autostart_timer)
        self._autostart_timer = None
        if self.trigger_configure() == SUCCESS and self.trigger_activate() == SUCCESS:
            return
        self.get_logger().error(
            f'autostart stopped: the node is {self._lifecycle_state}'
            + (f' ({self._configure_error})' if self._configure_error else '')
        )
        self.publish_diagnostics()

    # --- lifecycle transitions -------------------------------------------------------------

    @property
    def lifecycle_state(self) -> str:
        """The label of the node's primary lifecycle state (``unconfigured``, ``inactive``,
        ``active``, ``finalized``; ``errorprocessing`` while ``on_error`` runs), as the
        results of its transition callbacks lead it through the lifecycle state machine."""
        return self._lifecycle_state

    @_transition
    def on_configure(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Check the checkpoint and start the engine; FAILURE (unconfigured) if it cannot be
        served."""
        try:
            check_model_path(self.config.engine_config())
        except ModelPathError as exc:
            self._configure_error = str(exc)
            self.get_logger().error(f'configure failed: {exc}')
            return FAILURE
        try:  # the engine's runtime folder and sockets: a full or read-only disk fails here
            client = self._client_factory(self.config)
            client.on_arrival = self._wake_for_engine
            link = EngineLink(client, self.config.link)
            link.start()
        except OSError as exc:
            self._configure_error = f'cannot start the engine: {exc}'
            self.get_logger().error(f'configure failed: {self._configure_error}')
            return FAILURE
        self._configure_error = ''
        self.link = link
        self.get_logger().info(
            f'configured for {len(self.slots)} robots; engine {self.config.link.mode} mode, '
            'starting'
        )
        return SUCCESS

    @_transition
    def on_activate(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Serve: publish chunks and send the steps that fall due from now on."""
        result = super().on_activate(state)  # the lifecycle publishers publish from now on
        self._active = True
        now = self._now_ns()
        for slot in self.slots.values():
            slot.engine_back(now)  # judge its action rate afresh, as after an engine restart
        self.get_logger().info(f'active: serving {len(self.slots)} robots {sorted(self.slots)}')
        self._dispatch()
        return result

    @_transition
    def on_deactivate(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Stop serving: the steps in flight are refused (their results never published) and
        so is every step that falls due; the engine keeps running."""
        self._stop_serving('deactivated')
        self.get_logger().info('inactive: every step is refused until the node is activated')
        return super().on_deactivate(state)

    @_transition
    def on_cleanup(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Stop the engine (and its process); a later configure starts a new one."""
        self._stop_engine()
        self.get_logger().info('unconfigured: engine stopped')
        return SUCCESS

    @_transition
    def on_shutdown(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Stop serving and the engine for good; the finalized node keeps reporting on
        /diagnostics and refusing steps until its process ends."""
        if self._active:
            self._stop_serving('shut down')
            super().on_deactivate(state)  # the lifecycle publishers stop as on deactivate
        self._stop_engine()
        self.get_logger().info('finalized: engine stopped')
        return SUCCESS

    @_transition
    def on_error(self, state: LifecycleState) -> TransitionCallbackReturn:
        """A transition raised: stop serving and the engine, and go back to unconfigured."""
        if self._active:
            self._stop_serving('in error')
            super().on_deactivate(state)
        self._stop_engine()
        return SUCCESS

    def _stop_serving(self, why: str) -> None:
        self._active = False
        now = self._now_ns()
        for slot in self.slots.values():
            self.outcomes.abandon(slot, FailureReason.INACTIVE, f'node {why}', now)

    def _stop_engine(self) -> None:
        if self.link is not None:
            self.link.close()
            self.link = None

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
            self.outcomes.refuse_input(slot, FailureReason.INVALID_STATE, str(exc), stamp, now)

    def _on_instruction(self, slot: RobotSlot, msg) -> None:
        try:
            text = check_instruction(msg.data, max_bytes=self.config.max_instruction_bytes)
        except ConversionError as exc:
            slot.refuse_instruction(str(exc))
            self._close_session(slot.robot_id)
            now = self._now_ns()
            self.outcomes.refuse_input(slot, FailureReason.INVALID_INSTRUCTION, str(exc), now, now)
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
        if self.link is not None:
            self._poll_engine(self.link)
        self._dispatch()

    def _poll_engine(self, link: EngineLink) -> None:
        polled = link.poll()
        if polled.died:
            self._on_engine_death(polled.died)
        for msg in polled.messages:
            if isinstance(msg, StepResult):
                self.outcomes.result(msg, self._now_ns(), self.link.info)
            elif isinstance(msg, StepFailure):
                self.outcomes.failure(msg, self._now_ns())
            elif isinstance(msg, EngineInfo):
                self._on_engine_info(msg)

    def _tick(self) -> None:
        """Every heartbeat period (or diagnostics period, if shorter): the pump's periodic
        work, the sim clock's check, and /diagnostics when its period has come (within half a
        tick)."""
        self._pump()
        self._check_sim_clock()
        now = self._steady_ns()
        if now + self._tick_ns // 2 >= self._diagnostics_due_ns:
            self._diagnostics_due_ns += self._diagnostics_period_ns
            if self._diagnostics_due_ns <= now:  # fell behind: skip the missed periods
                self._diagnostics_due_ns = now + self._diagnostics_period_ns
            self.publish_diagnostics()

    def _on_due(self) -> None:
        self._due_timer.cancel()
        self._dispatch()

    def _dispatch(self) -> None:
        """Send every robot that is due its step (refuse it while the node is not active),
        then arm the timer for the next one that will be due once its period has come."""
        now = self._now_ns()
        info = self.link.info if self.link is not None else None
        budget_ns = round(self.config.step_budget_s * 1e9)
        next_due_ns = None
        for slot in self.slots.values():
            expires_ns = self._expire_flight(slot, now)
            if not slot.is_due(now):
                for due_ns in (slot.due_at_ns(), expires_ns):
                    if due_ns is not None and (next_due_ns is None or due_ns < next_due_ns):
                        next_due_ns = due_ns
                continue
            step = slot.take_step(
                now,
                budget_ns=budget_ns,
                num_state=info.num_state if info is not None else 0,
                num_images=info.num_images if info is not None else 0,
                priority=slot.config.priority,
            )
            if isinstance(step, Refusal):
                self.outcomes.publish_refusal(step, expected=self._before_instruction(slot, step))
            elif not self._active:
                self.outcomes.refuse(
                    slot, FailureReason.INACTIVE, self._inactive_detail(), step.stamp_ns, now
                )
            elif info is None:
                self.outcomes.refuse(
                    slot,
                    FailureReason.ENGINE_UNAVAILABLE,
                    f'engine {self.link.state if self.link is not None else "stopped"}',
                    step.stamp_ns,
                    now,
                    # its first start is no fault (a restart after a crash is)
                    expected=self.link is not None and self.link.num_restarts == 0,
                )
            else:
                self._send(slot, step, now)
        self._arm_due_timer(next_due_ns, now)

    def _before_instruction(self, slot: RobotSlot, refusal: Refusal) -> bool:
        """Whether ``refusal`` is of a robot that never had an instruction (its images came
        first, as they may at start-up): no fault, said once at INFO (the refusals at
        DEBUG), where a refused or cleared instruction stays a WARN."""
        if refusal.reason is not FailureReason.INVALID_INSTRUCTION or slot.instruction_version:
            return False
        if slot.robot_id not in self._told_no_instruction:
            self._told_no_instruction.add(slot.robot_id)
            self.get_logger().info(
                f'{slot.robot_id}: waiting for an instruction (vla/instruction or the '
                f'parameter robots.{slot.robot_id}.instruction); its steps are refused until '
                'one arrives'
            )
        return True

    def _expire_flight(self, slot: RobotSlot, now: int) -> int | None:
        """Give up the robot's step in flight if the engine has not answered it by its
        deadline plus ``deadlines.engine_timeout_margin_s`` (refused with ENGINE_TIMEOUT; the
        robot is free for its next step); else when that will be (None: nothing in flight)."""
        margin_s = self.config.engine_timeout_margin_s
        expires_ns = slot.flight_expires_at_ns(round(margin_s * 1e9))
        if expires_ns is None or now < expires_ns:
            return expires_ns
        late_s = (now - slot.in_flight.deadline_ns) / 1e9
        self.outcomes.abandon(
            slot,
            FailureReason.ENGINE_TIMEOUT,
            f'the engine did not answer this step {late_s:.2f} s past its deadline '
            f'(deadlines.engine_timeout_margin_s = {margin_s:g} s): step given up',
            now,
        )
        return None

    def _inactive_detail(self) -> str:
        state = self.lifecycle_state
        name = self.get_fully_qualified_name()
        if state == 'inactive':
            return f'node inactive: steps resume once it is activated ({name})'
        if state == 'unconfigured':
            return f'node unconfigured: steps resume once it is configured and activated ({name})'
        return f'node {state}: it sends no steps'

    def _arm_due_timer(self, due_ns: int | None, now: int) -> None:
        if due_ns is None:
            self._due_timer.cancel()
            return
        self._due_timer.timer_period_ns = max(1, due_ns - now)
        self._due_timer.reset()

    def _send(self, slot: RobotSlot, step: StepRequest, now: int) -> None:
        """Send ``step`` to the engine (the node is active and configured), or answer it:
        whatever keeps it from the engine (no engine, a step the codec refuses, a transport
        error) becomes a StepRejected for it, and the robot stays free, so its next step is
        sent."""
        assert self.link is not None
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
            self.get_logger().debug(f'{slot.robot_id}: step {step.step_seq} sent')
            return
        self.outcomes.refuse(slot, reason, detail, step.stamp_ns, now)

    def _on_engine_info(self, info: EngineInfo) -> None:
        if self.link is not None and self.link.ready:  # its refusals and downtime are over
            now = self._now_ns()
            for slot in self.slots.values():
                slot.engine_back(now)
        weights = ' (random weights: actions are meaningless)' if info.random_weights else ''
        self.get_logger().info(
            f'engine ready: {info.model_name}{weights}; state {info.num_state}, '
            f'actions {info.action_horizon}x{info.action_dim}, {info.num_images} image(s) of '
            f'{info.image_size}px per step'
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
            num_cameras = slot.config.num_cameras
            if num_cameras != info.num_images:
                self.get_logger().error(
                    f'robots.{slot.robot_id}.camera_topics has {num_cameras} cameras; the '
                    f'checkpoint takes {info.num_images} images per step: every step of this '
                    'robot is refused'
                )

    def _on_engine_death(self, why: str) -> None:
        assert self.link is not None
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
        if self.link is not None and self.link.ready:
            try:
                self.link.send(CloseSession(robot_id=robot_id))
            except EngineUnavailable:
                pass  # a dead engine holds no sessions
            except Exception as exc:
                self.get_logger().warning(
                    f'{robot_id}: session close not sent: {type(exc).__name__}: {exc}'
                )

    def ros_clock(self) -> str:
        """What the node's ROS time follows: ``system``, ``sim`` (``use_sim_time`` and
        ``/clock`` came), ``sim_no_clock`` (``use_sim_time`` and no ``/clock`` yet: ROS time
        stands at 0, so periodic steps, stamps and deadlines wait for it)."""
        clock = self.get_clock()
        if not clock.ros_time_is_active:
            return SYSTEM_CLOCK
        return SIM_CLOCK if clock.now().nanoseconds else SIM_NO_CLOCK

    def uptime_s(self) -> float:
        """Seconds since the node started, on the steady clock (also under sim time)."""
        return (self._steady_ns() - self._started_steady_ns) / 1e9

    def _check_sim_clock(self) -> None:
        """Under use_sim_time, warn once when no /clock came ``NO_CLOCK_WARN_S`` after
        start-up (also on /diagnostics), and say when it comes after all."""
        clock = self.ros_clock()
        if clock == SIM_NO_CLOCK and not self._clock_warned:
            if self.uptime_s() >= diagnostics.NO_CLOCK_WARN_S:
                self._clock_warned = True
                self.get_logger().warning(
                    f'sim time on, no /clock received in {self.uptime_s():.0f} s: ROS time '
                    'stands at 0, so periodic steps wait and stamps and deadlines are wrong; '
                    'publish /clock (a simulator, ros2 bag play --clock) or set '
                    'use_sim_time false'
                )
        elif clock == SIM_CLOCK and self._clock_warned:
            self._clock_warned = False
            self.get_logger().info('/clock received: sim time runs')

    def _now_ns(self) -> int:
        return self.get_clock().now().nanoseconds

    def _steady_ns(self) -> int:
        return self._steady_clock.now().nanoseconds

    def publish_diagnostics(self) -> None:
        now = self._now_ns()
        for slot in self.slots.values():
            self._log_instruction(slot, slot.instruction_changes.due(now))
        for problem in self._publisher_check.new_problems():
            self.get_logger().warning(problem)
        msg = diagnostics.diagnostic_array(
            self._engine_view(),
            [slot.view(now) for slot in self.slots.values()],
            self.config.diagnostics,
            stamp=self.get_clock().now().to_msg(),
            node_name=self.get_fully_qualified_name(),
            lifecycle_state=self.lifecycle_state,
            ros_clock=self.ros_clock(),
            uptime_s=self.uptime_s(),
        )
        self._diagnostics_pub.publish(msg)

    def _engine_view(self) -> EngineView:
        if self.link is None:
            return diagnostics.stopped_engine(
                self.config.link.mode, last_error=self._configure_error
            )
        return self.link.view()

    def close(self) -> None:
        """Stop the image workers and the engine (its process too); free the runtime folder."""
        self.camera.close()
        self._stop_engine()


def _engine_client(config: FrontendConfig):
    return EngineClient(config.engine_config(), config.link)


def main(argv: list[str] | None = None) -> int:
    """Run the node until SIGINT or SIGTERM (0, however often signalled); 2 on a
    configuration error. ``--managed`` (before ``--ros-args``): wait for transitions. The
    engine is stopped and its runtime folder removed on the way out.
    """
    argv = list(argv if argv is not None else sys.argv)
    with (
        ShutdownRequest() as shutdown,
        rclpy.init(args=argv, signal_handler_options=SignalHandlerOptions.NO),
    ):
        try:
            node = VlaSchedNode(command_line=argv, managed=MANAGED_FLAG in remove_ros_args(argv))
        except (ValueError, TypeError, ParameterException) as exc:
            print(f'vla_sched: configuration error: {exc}', file=sys.stderr)
            return 2
        forwarding = forward_python_logs(node.get_logger())
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
            stop_forwarding(forwarding)
            executor.shutdown()
            node.destroy_node()
    return 0


if __name__ == '__main__':
    sys.exit(main())
