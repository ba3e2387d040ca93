"""What each robot is told about its steps: a chunk (and trajectory), or a StepRejected.

``Outcomes`` turns the engine's results and failures, and the node's own refusals, into the
messages published on the robot's topics, and keeps the robot's slot in step with them:

- a result is published only for the robot's step in flight (anything else is stale);
- its chunk is published whole; the arm's commands (trajectory, twist, gripper) hold only
  the actions reached ``min_lead_s`` or more after the publication, and none is sent when no
  action is (counted with its cause, for every robot: such a chunk has nothing left to
  execute, whatever plays it);
- a late result is refused (``DEADLINE_MISSED``) under ``late_policy: drop``, else published
  marked late;
- a result that cannot become a chunk (actions of the wrong shape, non-finite, action names
  that do not fit) ends its step with ``INTERNAL_ERROR``;
- a refused input message (a bad joint_states, image or instruction: ``refuse_input``) is
  published at most once per robot and reason per robot period (``RefusalThrottle``; the
  next one says how many were held), never once per message; every one is counted;
- every other refusal is published, and logged as a WARN at most once a second (the check is
  made here: rclpy's own throttle inspects the caller's frame on every call, even one it
  drops); those a normal start or pause makes (``expected``: the engine's first start, no
  instruction yet, ``INACTIVE`` of a node that is not active, whose transitions the node
  logs) are logged at DEBUG only, each one, so a normal start shows no WARN.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping

from rclpy.impl.rcutils_logger import RcutilsLogger

from vla_sched.ipc.messages import EngineInfo, FailureReason, StepFailure, StepResult
from vla_sched.ros import outputs
from vla_sched.ros.node_config import ConfigError
from vla_sched.ros.refusal_throttle import RefusalThrottle
from vla_sched.ros.robot_slot import Refusal, RobotSlot
from vla_sched.ros.robot_topics import RobotTopics

MAX_LOGGED_DETAIL_CHARS = 200
REFUSAL_LOG_INTERVAL_S = 1.0  # at most one log line about refusals this often


class Outcomes:
    """Publishes the robots' outcomes (see the module docstring)."""

    def __init__(
        self,
        slots: Mapping[str, RobotSlot],
        topics: Mapping[str, RobotTopics],
        *,
        late_policy: str,
        logger: RcutilsLogger,
    ) -> None:
        self._slots = slots
        self._topics = topics
        self._late_policy = late_policy
        self._logger = logger
        self._next_refusal_log_s = float('-inf')
        self._input_refusals = RefusalThrottle()

    def result(self, result: StepResult, now: int, info: EngineInfo | None) -> None:
        """Publish ``result``'s chunk if it is its robot's step in flight."""
        slot = self._slots.get(result.robot_id)
        if slot is None or not slot.owns(result.step_seq):
            return  # not the step in flight: stale, never published
        late = slot.is_late(result, now)
        if late and self._late_policy == 'drop':
            late_ms = max(0.0, (now - slot.in_flight.deadline_ns) / 1e6)
            self.abandon(slot, FailureReason.DEADLINE_MISSED, f'done {late_ms:.1f} ms late', now)
            return
        action_dim = info.action_dim if info is not None else int(result.actions.shape[-1])
        try:
            chunk = outputs.action_chunk(
                result,
                slot.config,
                deadline_ns=slot.in_flight.deadline_ns,
                published_ns=now,
                joint_names=slot.config.action_names(action_dim),
                late=late,
            )
        except (ConfigError, ValueError) as exc:
            self.abandon(slot, FailureReason.INTERNAL_ERROR, str(exc), now)
            return
        topics = self._topics[slot.robot_id]
        topics.chunks.publish(chunk)
        if outputs.first_action_to_send(chunk, slot.config, published_ns=now) == chunk.horizon:
            latency_ns = now - result.stamp_ns
            cause = outputs.nothing_left(slot.config, horizon=chunk.horizon, latency_ns=latency_ns)
            slot.count_all_past(now, cause)
        elif topics.drives_arm:
            topics.publish_arm(outputs.arm_commands(chunk, slot.config, published_ns=now))
        slot.finish(result, now, late=late)

    def failure(self, failure: StepFailure, now: int) -> None:
        """Publish the engine's failure of a robot's step in flight."""
        slot = self._slots.get(failure.robot_id)
        if slot is None:
            return
        refusal = slot.fail(failure, now)
        if refusal is not None:
            self.publish_refusal(refusal)
            if failure.reason is FailureReason.KV_POOL_FULL:
                self._logger.warning(f'{slot.robot_id}: {failure.detail}')

    def abandon(self, slot: RobotSlot, reason: FailureReason, detail: str, now: int) -> None:
        """End the robot's step in flight, if any, with a refusal."""
        refusal = slot.abandon(reason, detail, now)
        if refusal is not None:
            self.publish_refusal(refusal)

    def refuse(
        self,
        slot: RobotSlot,
        reason: FailureReason,
        detail: str,
        stamp_ns: int,
        now: int,
        *,
        expected: bool = False,
    ) -> None:
        """Refuse an input stamped ``stamp_ns`` that never became a step (``expected``: a
        refusal of a normal start, logged at DEBUG)."""
        refusal = slot.refuse(Refusal(slot.robot_id, 0, stamp_ns, reason, detail), now)
        self.publish_refusal(refusal, expected=expected)

    def refuse_input(
        self, slot: RobotSlot, reason: FailureReason, detail: str, stamp_ns: int, now: int
    ) -> None:
        """Refuse an input message stamped ``stamp_ns`` (counted always, published at most
        once per robot and reason per robot period)."""
        refusal = slot.refuse(Refusal(slot.robot_id, 0, stamp_ns, reason, detail), now)
        held = self._input_refusals.admit((slot.robot_id, reason), now, slot.period_ns)
        if held is None:
            return
        if held:
            more = f' (and {held} more since the last StepRejected for {reason.value})'
            refusal = dataclasses.replace(refusal, detail=refusal.detail + more)
        self.publish_refusal(refusal)

    def publish_refusal(self, refusal: Refusal, *, expected: bool = False) -> None:
        """Publish ``refusal`` on its robot's ``vla/step_rejected`` and log it: at DEBUG when
        ``expected`` (or ``INACTIVE``), else as a WARN at most once a second."""
        self._topics[refusal.robot_id].rejected.publish(outputs.step_rejected(refusal))
        line = (
            f'{refusal.robot_id}: step {refusal.step_seq} refused: {refusal.reason.value}: '
            f'{refusal.detail[:MAX_LOGGED_DETAIL_CHARS]}'
        )
        if expected or refusal.reason is FailureReason.INACTIVE:
            self._logger.debug(line)
            return
        now_s = time.monotonic()
        if now_s < self._next_refusal_log_s:
            return
        self._next_refusal_log_s = now_s + REFUSAL_LOG_INTERVAL_S
        self._logger.warning(line)
