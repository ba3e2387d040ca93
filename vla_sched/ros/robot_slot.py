"""One robot's state in the frontend: its newest observation, its step in flight, its counters.

The slot is the frontend's one record of its robot: instruction and its version, state,
pending observation, step in flight, and the outcomes of its steps (chunks, deadline misses,
superseded observations, refusals, image stamp to publish latency). What only the engine
knows (session prefix, retracts, token latencies) arrives in ``EngineStats`` and is not
copied here.

The rules a robot relies on live here, free of ROS so they can be tested with a fake clock:
- newest observation wins: an image that was never sent is dropped (and counted) when a
  newer one arrives;
- an observation is one image per camera (``camera_sync``): a robot with several cameras is
  due only once each camera's image is in, and a step whose cameras did not all send one in
  time is refused (``CAMERAS_INCOMPLETE``), as is one whose camera count is not the
  checkpoint's;
- at most one step in flight: a robot is due only when nothing of it is in the engine, and
  a step the engine has not answered by its deadline plus a margin is given up
  (``flight_expires_at_ns``; the node refuses it with ``ENGINE_TIMEOUT``), so no lost or
  stolen step leaves its robot stuck;
- ``periodic`` robots are due once per period, on their phase of it (``period_phase``: spread
  across the period by the node, restored after a stall), ``on_image`` robots on every new
  image;
- a step whose deadline (image stamp + budget) has passed is refused before it is sent;
- a step whose joint state is stale (older than ``max_state_age_s``, or stamped further than
  ``max_state_image_skew_s`` from the image) is refused, never sent with that state;
- a result is accepted only for the step in flight, so nothing stale is ever published.

Health over the last ``window_s``: action and image input rates, refusals, chunks published
with no action left to send (``count_all_past``, with the cause), and the last error, which is
shown until a whole window passes without a refusal. Timing over the last
``LATENCY_WINDOW_CHUNKS`` chunks: image stamp to publish latency percentiles, and the jitter
of the chunks' publication, ``|interval between two chunks - period_s|`` (its p99).
``engine_back`` forgets what a lost engine caused (its refusals, and the rate judged over its
downtime).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass

import numpy as np

from vla_sched.ipc.messages import FailureReason, StepFailure, StepRequest, StepResult
from vla_sched.ros.camera_sync import CameraFrame, CameraSync, Observation
from vla_sched.ros.node_config import RobotConfig
from vla_sched.ros.period_phase import PeriodSchedule
from vla_sched.ros.previous_chunk import (
    DELAY_PERCENTILE,
    NO_ACTIONS,
    PublishedChunk,
    inference_delay,
)
from vla_sched.ros.text_bounds import MAX_DETAIL_CHARS, bounded
from vla_sched.ros.windows import CountingThrottle, EventWindow, MsLatencyWindow

NS_PER_S = 1_000_000_000
LATENCY_WINDOW_CHUNKS = 256  # image stamp to publish latencies kept per robot
INSTRUCTION_LOG_INTERVAL_S = 5.0  # at most one log line about instruction changes this often


def stamp_problem(stamp_ns: int, now_ns: int, *, max_future_ns: int) -> str | None:
    """Why an image stamped ``stamp_ns`` cannot be an observation at ``now_ns``, or None.

    A zero stamp says nothing about when the image was taken, and one further ahead than
    ``max_future_ns`` would give chunks (and deadlines) stamped in the future.
    """
    if stamp_ns == 0:
        return 'header.stamp is zero: stamp images with the time they were taken'
    ahead_ns = stamp_ns - now_ns
    if ahead_ns > max_future_ns:
        return (
            f'header.stamp is {ahead_ns / NS_PER_S:.3f} s ahead of the node clock (more than '
            f'limits.max_future_stamp_s = {max_future_ns / NS_PER_S:g} s)'
        )
    return None


def stale_state_problem(
    state_stamp_ns: int, *, image_stamp_ns: int, now_ns: int, config: RobotConfig
) -> str | None:
    """Why a joint state stamped ``state_stamp_ns`` is too stale for a step at ``now_ns``
    on the image stamped ``image_stamp_ns``, or None (``config`` holds the limits; 0 is none).

    A zero stamp says nothing about when the state was measured, so it passes only when both
    checks are off.
    """
    owner = f'robots.{config.robot_id}'
    max_age_ns = round(config.max_state_age_s * NS_PER_S)
    max_skew_ns = round(config.max_state_image_skew_s * NS_PER_S)
    if max_age_ns == 0 and max_skew_ns == 0:
        return None
    if state_stamp_ns == 0:
        return (
            'joint_states header.stamp is zero: stamp joint states with the time they were '
            f'measured (or set {owner}.max_state_age_s and max_state_image_skew_s to 0)'
        )
    age_ns = now_ns - state_stamp_ns
    if max_age_ns and age_ns > max_age_ns:
        return (
            f'joint state is {age_ns / NS_PER_S:.3f} s old (more than {owner}.max_state_age_s '
            f'= {config.max_state_age_s:g} s): is joint_states still published?'
        )
    skew_ns = state_stamp_ns - image_stamp_ns
    if max_skew_ns and abs(skew_ns) > max_skew_ns:
        side = 'after' if skew_ns > 0 else 'before'
        return (
            f'joint state stamped {abs(skew_ns) / NS_PER_S:.3f} s {side} the image (more than '
            f'{owner}.max_state_image_skew_s = {config.max_state_image_skew_s:g} s)'
        )
    return None


@dataclass(frozen=True, slots=True)
class InFlight:
    """The step this robot has in the engine."""

    step_seq: int
    stamp_ns: int
    deadline_ns: int


@dataclass(frozen=True, slots=True)
class Refusal:
    """An observation or step that will produce no chunk (published as StepRejected)."""

    robot_id: str
    step_seq: int  # 0 when refused before a step was created
    stamp_ns: int
    reason: FailureReason
    detail: str


@dataclass(frozen=True, slots=True)
class RobotView:
    """What /diagnostics reports about one robot, computed at one instant."""

    robot_id: str
    window_s: float  # of the rates, the refusal count and the last error
    target_rate_hz: float
    action_rate_hz: float
    image_rate_hz: float  # camera images received
    rate_judged: bool  # false until the robot has been active for a whole window
    stamp_to_publish_ms_p50: float  # image stamp to the chunk's publication
    stamp_to_publish_ms_p95: float
    stamp_to_publish_ms_p99: float
    publish_jitter_ms_p99: float  # p99 of |interval between two chunks - period|; NaN: none
    num_chunks: int
    num_deadline_misses: int
    num_superseded: int
    num_chunks_all_past: int  # chunks published with no action left to send
    num_all_past_window: int  # of them, in the last window
    all_past_cause: str  # why the last of them had none ('latency 118.0 ms > ...'); '' none
    placeholder_joint_names: tuple[str, ...]  # a trajectory's names a0, a1, ...; () if not
    num_refused_window: int
    refused_by_reason: dict[str, int]
    last_error: str  # '' when no refusal came in the last window
    last_error_age_s: float  # NaN without a last error
    since_last_chunk_s: float  # NaN before the first chunk
    silent_s: float  # seconds since the last image (or since start-up if none came)
    state_age_s: float  # of the newest joint state; NaN without one (or without state joints)
    seen_image: bool


class RobotSlot:
    """Frontend state of one robot (see the module docstring); a periodic robot fires on its
    ``phase`` of the period (a fraction in [0, 1), ``period_phase``)."""

    def __init__(
        self, config: RobotConfig, *, window_s: float, created_ns: int, phase: float = 0.0
    ) -> None:
        self.config = config
        self.robot_id = config.robot_id
        self.period_ns = round(config.period_s * NS_PER_S)
        self.schedule = PeriodSchedule(self.period_ns, phase=phase)
        self.cameras = CameraSync(
            config.camera_topics,
            max_skew_s=config.max_camera_skew_s,
            max_wait_s=config.max_camera_wait_s,
            owner=f'robots.{config.robot_id}',
        )
        self.in_flight: InFlight | None = None
        self.state: np.ndarray | None = None
        self.state_stamp_ns = 0  # of ``state``
        self.state_error = 'no joint_states received yet'
        self.instruction = ''
        self.instruction_version = 0
        self.instruction_error = 'no instruction set'
        self.created_ns = created_ns
        self.first_image_ns: int | None = None
        self.last_image_ns: int | None = None
        self._next_step_seq = 1
        self.num_chunks = 0
        self.num_deadline_misses = 0
        self.num_superseded = 0
        self.num_chunks_all_past = 0
        self.all_past_cause = ''
        self.refused_by_reason: Counter[str] = Counter()
        self.last_error = ''
        self.last_error_reason: FailureReason | None = None
        self.last_error_ns: int | None = None
        self.last_chunk_ns: int | None = None
        self.previous_chunk: PublishedChunk | None = None  # the last one, under rtc
        self.stamp_to_publish = MsLatencyWindow(LATENCY_WINDOW_CHUNKS)
        self.publish_jitter = MsLatencyWindow(LATENCY_WINDOW_CHUNKS)
        self.window_s = float(window_s)
        window_ns = round(window_s * NS_PER_S)
        self._chunk_times = EventWindow(window_ns)
        self._image_times = EventWindow(window_ns)
        self._all_past_times = EventWindow(window_ns)
        self._refusal_times: dict[FailureReason, EventWindow] = {
            reason: EventWindow(window_ns) for reason in FailureReason
        }
        self._judged_since_ns: int | None = None  # set when the engine comes back
        self.instruction_changes = CountingThrottle(round(INSTRUCTION_LOG_INTERVAL_S * NS_PER_S))
        if config.instruction:
            self.set_instruction(config.instruction)

    # --- inputs (called from subscription callbacks, already converted) -------------------

    @property
    def pending(self) -> Observation | None:
        """The observation waiting to be sent (``camera_sync.Observation``), or None."""
        return self.cameras.pending

    def offer_image(self, frame: CameraFrame, camera: int = 0) -> None:
        """Take ``frame`` from camera ``camera`` (0: the primary, whose image starts a new
        observation; an unsent older one is superseded)."""
        if self.cameras.offer(camera, frame):
            self.num_superseded += 1
        if camera != 0:
            return
        if self.first_image_ns is None:
            self.first_image_ns = frame.received_ns
        self.last_image_ns = frame.received_ns
        self._image_times.add(frame.received_ns)

    def supersede_unconverted(self) -> None:
        """An image waiting for conversion was replaced by a newer one: it is superseded
        like an unsent observation."""
        self.num_superseded += 1

    def set_state(self, state: np.ndarray, *, stamp_ns: int) -> None:
        """Use ``state``, measured at ``stamp_ns`` (its joint_states header.stamp), from now
        on; a step checks its age then (``stale_state_problem``)."""
        self.state = state
        self.state_stamp_ns = stamp_ns
        self.state_error = ''

    def refuse_state(self, detail: str) -> None:
        """A bad joint_states makes the robot's state unknown until a good one arrives."""
        self.state = None
        self.state_stamp_ns = 0
        self.state_error = detail

    def set_instruction(self, text: str) -> bool:
        """Use ``text`` from now on; whether it differs from the current instruction."""
        changed = text != self.instruction
        if changed:
            self.instruction = text
            self.instruction_version += 1
        self.instruction_error = ''
        return changed

    def refuse_instruction(self, detail: str) -> None:
        """A refused instruction stops the robot until a valid one arrives (no old task)."""
        self.instruction = ''
        self.instruction_version += 1
        self.instruction_error = f'last instruction refused: {detail}'

    def set_period(self, period_s: float) -> None:
        self.period_ns = round(period_s * NS_PER_S)
        self.schedule.set_period(self.period_ns)

    # --- dispatch --------------------------------------------------------------------------

    def is_due(self, now_ns: int) -> bool:
        """An unsent observation with every camera's image in (or whose wait for them is
        over), nothing in flight, and (periodic) its period has come."""
        if not self.cameras.is_ready(now_ns) or self.in_flight is not None:
            return False
        return self.config.trigger == 'on_image' or self.schedule.is_due(now_ns)

    def due_at_ns(self) -> int | None:
        """When a robot that waits only for time becomes due (its period's start, or the
        end of its observation's wait for cameras, whichever is later), or None: it is due on
        an event (an image, the end of its step in flight) or now."""
        if self.pending is None or self.in_flight is not None:
            return None
        times = [self.cameras.ready_at_ns()]
        if self.config.trigger == 'periodic':
            times.append(self.schedule.next_due_ns)
        known = [t for t in times if t is not None]
        return max(known) if known else None

    def take_step(
        self, now_ns: int, *, budget_ns: int, num_state: int, num_images: int, priority: int
    ) -> StepRequest | Refusal:
        """Turn the pending observation into a step, or refuse it (it is consumed either way).

        ``num_images`` is the checkpoint's images per step (0: not known yet, not checked).
        A refusal is already counted; the caller publishes it. A request is the caller's to
        send, followed by ``mark_sent`` (or ``refuse`` if sending failed).
        """
        if self.pending is None:
            raise RuntimeError(f'robot {self.robot_id}: take_step without an observation')
        obs, cameras_problem = self.cameras.take()
        self._advance_schedule(now_ns)
        deadline_ns = obs.stamp_ns + budget_ns
        problem = self._input_problem(
            num_state, num_images, cameras_problem, image_stamp_ns=obs.stamp_ns, now_ns=now_ns
        )
        if problem is not None:
            return self._refusal(obs.stamp_ns, *problem, now_ns=now_ns)
        if now_ns > deadline_ns:
            late_ms = (now_ns - deadline_ns) / 1e6
            self.num_deadline_misses += 1
            return self._refusal(
                obs.stamp_ns,
                FailureReason.DEADLINE_MISSED,
                f'deadline passed {late_ms:.1f} ms before the step could be sent',
                now_ns=now_ns,
            )
        state = self.state if num_state > 0 else np.zeros(0, dtype=np.float32)
        assert state is not None
        previous, delay = NO_ACTIONS, 0
        if self.previous_chunk is not None:
            dt_s = self.config.dt
            previous = self.previous_chunk.remaining_at(obs.stamp_ns, dt_s=dt_s)
            delay = inference_delay(
                self.stamp_to_publish.percentile(DELAY_PERCENTILE),
                dt_s=dt_s,
                horizon=self.previous_chunk.actions.shape[0],
            )
        return StepRequest(
            robot_id=self.robot_id,
            step_seq=self._next_step_seq,
            stamp_ns=obs.stamp_ns,
            deadline_ns=deadline_ns,
            received_ns=obs.received_ns,
            images=obs.images,
            state=state,
            instruction=self.instruction,
            instruction_version=self.instruction_version,
            priority=priority,
            previous_actions=previous,
            inference_delay=delay,
        )

    def _input_problem(
        self,
        num_state: int,
        num_images: int,
        cameras_problem: str | None,
        *,
        image_stamp_ns: int,
        now_ns: int,
    ) -> tuple[FailureReason, str] | None:
        if not self.instruction:
            return FailureReason.INVALID_INSTRUCTION, self.instruction_error
        num_cameras = self.cameras.num_cameras
        if num_images and num_cameras != num_images:
            return (
                FailureReason.MALFORMED_IMAGE,
                f'the checkpoint takes {num_images} image{"s" if num_images > 1 else ""} per '
                f'step but robots.{self.robot_id}.camera_topics lists {num_cameras} '
                f'camera{"s" if num_cameras > 1 else ""}',
            )
        if cameras_problem is not None:
            return FailureReason.CAMERAS_INCOMPLETE, cameras_problem
        if num_state > 0:
            names = self.config.state_joint_names
            if len(names) != num_state:
                return (
                    FailureReason.INVALID_STATE,
                    f'the checkpoint takes {num_state} state values but state_joint_names '
                    f'has {len(names)}',
                )
            if self.state is None:
                return FailureReason.INVALID_STATE, self.state_error
            stale = stale_state_problem(
                self.state_stamp_ns,
                image_stamp_ns=image_stamp_ns,
                now_ns=now_ns,
                config=self.config,
            )
            if stale is not None:
                return FailureReason.STALE_STATE, stale
        return None

    def _advance_schedule(self, now_ns: int) -> None:
        if self.config.trigger == 'periodic':
            self.schedule.advance(now_ns)  # missed periods are skipped, the phase kept

    def mark_sent(self, request: StepRequest) -> None:
        """``request`` went to the engine: it is the step in flight."""
        self.in_flight = InFlight(
            step_seq=request.step_seq, stamp_ns=request.stamp_ns, deadline_ns=request.deadline_ns
        )
        self._next_step_seq += 1

    def flight_expires_at_ns(self, margin_ns: int) -> int | None:
        """When the step in flight is given up if the engine has not answered it (its
        deadline plus ``margin_ns``), or None with nothing in flight."""
        return None if self.in_flight is None else self.in_flight.deadline_ns + margin_ns

    # --- outcomes ---------------------------------------------------------------------------

    def owns(self, step_seq: int) -> bool:
        """Whether ``step_seq`` is the step in flight (anything else is stale)."""
        return self.in_flight is not None and self.in_flight.step_seq == step_seq

    def is_late(self, result: StepResult, now_ns: int) -> bool:
        """The engine says so, or the deadline of the step in flight has passed."""
        assert self.in_flight is not None
        return bool(result.late) or now_ns > self.in_flight.deadline_ns

    def finish(self, result: StepResult, now_ns: int, *, late: bool = False) -> bool:
        """Accept the result of the step in flight, its chunk published at ``now_ns``;
        False (ignored) for any other step."""
        if not self.owns(result.step_seq):
            return False
        self.in_flight = None
        self.num_chunks += 1
        if late or result.late:
            self.num_deadline_misses += 1
        self.stamp_to_publish.add((now_ns - result.stamp_ns) / 1e6)
        if self.last_chunk_ns is not None:
            self.publish_jitter.add(abs(now_ns - self.last_chunk_ns - self.period_ns) / 1e6)
        if self.config.rtc:
            self.previous_chunk = PublishedChunk(result.stamp_ns, result.actions)
        self._chunk_times.add(now_ns)
        self.last_chunk_ns = now_ns
        return True

    def count_all_past(self, now_ns: int, cause: str) -> None:
        """A chunk was published at ``now_ns`` with no action left to send (none reached
        ``min_lead_s`` or more after it: no trajectory, twist or gripper went out), because of
        ``cause`` (``outputs.nothing_left``)."""
        self.num_chunks_all_past += 1
        self.all_past_cause = cause
        self._all_past_times.add(now_ns)

    def fail(self, failure: StepFailure, now_ns: int) -> Refusal | None:
        """The engine ended the step in flight without actions; None if it is not ours."""
        if self.in_flight is None or failure.step_seq != self.in_flight.step_seq:
            return None
        self.in_flight = None
        if failure.reason is FailureReason.DEADLINE_MISSED:
            self.num_deadline_misses += 1
        elif failure.reason is FailureReason.SUPERSEDED:
            self.num_superseded += 1
        return self.refuse(
            Refusal(
                self.robot_id, failure.step_seq, failure.stamp_ns, failure.reason, failure.detail
            ),
            now_ns,
        )

    def abandon(self, reason: FailureReason, detail: str, now_ns: int) -> Refusal | None:
        """End the step in flight (engine lost, late, unpublishable); a result that still
        comes for it is ignored."""
        flight = self.in_flight
        if flight is None:
            return None
        self.in_flight = None
        if reason is FailureReason.DEADLINE_MISSED:
            self.num_deadline_misses += 1
        return self.refuse(
            Refusal(self.robot_id, flight.step_seq, flight.stamp_ns, reason, detail), now_ns
        )

    def refuse(self, refusal: Refusal, now_ns: int) -> Refusal:
        """Count a refusal and remember it as the last error; returns it with its detail
        bounded to ``MAX_DETAIL_CHARS``."""
        detail = bounded(refusal.detail, MAX_DETAIL_CHARS)
        if detail != refusal.detail:
            refusal = dataclasses.replace(refusal, detail=detail)
        self.refused_by_reason[refusal.reason.value] += 1
        self.last_error = f'{refusal.reason.value}: {detail}'
        self.last_error_reason = refusal.reason
        self.last_error_ns = now_ns
        self._refusal_times[refusal.reason].add(now_ns)
        return refusal

    def engine_back(self, now_ns: int) -> None:
        """The engine is ready again: forget the refusals its absence caused (and the last
        error, if it was one of them), and judge the action rate afresh from ``now_ns``."""
        self._refusal_times[FailureReason.ENGINE_UNAVAILABLE].clear()
        if self.last_error_reason is FailureReason.ENGINE_UNAVAILABLE:
            self.last_error, self.last_error_reason, self.last_error_ns = '', None, None
        self._judged_since_ns = now_ns

    def _refusal(
        self, stamp_ns: int, reason: FailureReason, detail: str, *, now_ns: int
    ) -> Refusal:
        return self.refuse(Refusal(self.robot_id, 0, stamp_ns, reason, detail), now_ns)

    # --- health -----------------------------------------------------------------------------

    def view(self, now_ns: int) -> RobotView:
        window_ns = self._chunk_times.window_ns
        active_since = self.first_image_ns
        if active_since is not None and self._judged_since_ns is not None:
            active_since = max(active_since, self._judged_since_ns)
        judged = active_since is not None and now_ns - active_since >= window_ns
        silent_since = self.last_image_ns if self.last_image_ns is not None else self.created_ns
        error_ns = self.last_error_ns
        recent_error = error_ns is not None and now_ns - error_ns < window_ns
        chunk_ns = self.last_chunk_ns
        num_all_past_window = self._all_past_times.count(now_ns)
        state_age_s = float('nan')
        if self.config.state_joint_names and self.state is not None and self.state_stamp_ns:
            state_age_s = (now_ns - self.state_stamp_ns) / 1e9
        return RobotView(
            robot_id=self.robot_id,
            window_s=self.window_s,
            target_rate_hz=NS_PER_S / self.period_ns,
            action_rate_hz=self._chunk_times.rate_hz(now_ns, since_ns=active_since),
            image_rate_hz=self._image_times.rate_hz(now_ns, since_ns=self.first_image_ns),
            rate_judged=judged,
            stamp_to_publish_ms_p50=self.stamp_to_publish.percentile(50),
            stamp_to_publish_ms_p95=self.stamp_to_publish.percentile(95),
            stamp_to_publish_ms_p99=self.stamp_to_publish.percentile(99),
            publish_jitter_ms_p99=self.publish_jitter.percentile(99),
            num_chunks=self.num_chunks,
            num_deadline_misses=self.num_deadline_misses,
            num_superseded=self.num_superseded,
            num_chunks_all_past=self.num_chunks_all_past,
            num_all_past_window=num_all_past_window,
            all_past_cause=self.all_past_cause if num_all_past_window else '',
            placeholder_joint_names=(
                self.config.action_joint_names
                if self.config.trajectory_names_are_placeholders
                else ()
            ),
            num_refused_window=sum(w.count(now_ns) for w in self._refusal_times.values()),
            refused_by_reason=dict(self.refused_by_reason),
            last_error=self.last_error if recent_error else '',
            last_error_age_s=(now_ns - error_ns) / 1e9 if recent_error else float('nan'),
            since_last_chunk_s=(now_ns - chunk_ns) / 1e9 if chunk_ns is not None else float('nan'),
            silent_s=(now_ns - silent_since) / 1e9,
            seen_image=self.last_image_ns is not None,
            state_age_s=state_age_s,
        )
