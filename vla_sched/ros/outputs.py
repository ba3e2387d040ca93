"""Build the messages the node publishes: ActionChunk, StepRejected, and the arm's commands.

An ActionChunk holds every action of a step. The arm's commands (``arm_commands``) hold only
what is still to come when the chunk is published: action k of a chunk whose image is
stamped ``t`` applies over ``[t + k * dt, t + (k + 1) * dt)`` and is reached at its end,
``t + (k + 1) * dt``. No command holds an action reached less than the robot's
``min_lead_s`` after the publication (transport to the controller and one controller
period): such an action is dropped, not clamped, and the first action reached at least that
late is the current one (``first_action_to_send``). A point due on arrival would end before
the controller takes it; clamping it to the lead would reach the position later than the
chunk says.

- JointTrajectory (for ros2_controllers' JointTrajectoryController): one point per action to
  send, action k's positions reached at ``t + (k + 1) * dt``. The controller refuses a
  trajectory with a non-zero ``header.stamp`` that ends in the past, and takes
  ``time_from_start`` from ``header.stamp`` (zero: from its receipt). ``joint_trajectory_start``
  ``now`` stamps it with the publication time and shifts the points by the time already
  elapsed since ``t``; ``on_receipt`` leaves the stamp zero with the same shifted points, so
  the controller starts it when it arrives.
- TwistStamped (for MoveIt Servo): the current action's ``x y z`` and ``roll pitch yaw``
  deltas over ``dt`` (m/s and rad/s; for the small deltas of one action the Euler angle rates
  are the angular velocity), stamped with the publication time in the chunk's frame.
- Float64: the current action's gripper value (column 7 of an ee_delta action), as the
  checkpoint's dataset defines it.

A chunk with no action left to send yields no command at all (``nothing_left`` says why).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from builtin_interfaces.msg import Time
from geometry_msgs.msg import TwistStamped
from std_msgs.msg import Float64
from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

from vla_sched.ipc.messages import FailureReason, StepResult
from vla_sched.msg import ActionChunk, StepRejected
from vla_sched.ros.conversions import ns_to_duration, ns_to_stamp, stamp_to_ns
from vla_sched.ros.node_config import GRIPPER_COLUMN, NUM_TWIST_COLUMNS, RobotConfig
from vla_sched.ros.robot_slot import Refusal
from vla_sched.ros.text_bounds import MAX_DETAIL_CHARS, bounded

# FailureReason -> StepRejected.REASON_* constant name.
_REASON_CONSTANTS = {
    FailureReason.MALFORMED_IMAGE: 'REASON_MALFORMED_IMAGE',
    FailureReason.INVALID_STATE: 'REASON_INVALID_STATE',
    FailureReason.INVALID_INSTRUCTION: 'REASON_INVALID_INSTRUCTION',
    FailureReason.KV_POOL_FULL: 'REASON_KV_POOL_FULL',
    FailureReason.DEADLINE_MISSED: 'REASON_DEADLINE_MISSED',
    FailureReason.SUPERSEDED: 'REASON_SUPERSEDED',
    FailureReason.ENGINE_UNAVAILABLE: 'REASON_ENGINE_UNAVAILABLE',
    FailureReason.INTERNAL_ERROR: 'REASON_INTERNAL_ERROR',
    FailureReason.QUEUE_FULL: 'REASON_QUEUE_FULL',
    FailureReason.CANCELLED: 'REASON_CANCELLED',
    FailureReason.STALE_STATE: 'REASON_STALE_STATE',
    FailureReason.INACTIVE: 'REASON_INACTIVE',
    FailureReason.CAMERAS_INCOMPLETE: 'REASON_CAMERAS_INCOMPLETE',
    FailureReason.ENGINE_TIMEOUT: 'REASON_ENGINE_TIMEOUT',
}
ACTION_SPACE_CONSTANTS = {
    'joint_position': 'ACTION_SPACE_JOINT_POSITION',
    'joint_delta': 'ACTION_SPACE_JOINT_DELTA',
    'ee_delta': 'ACTION_SPACE_EE_DELTA',
}


def action_chunk(
    result: StepResult,
    robot: RobotConfig,
    *,
    deadline_ns: int,
    published_ns: int,
    joint_names: tuple[str, ...],
    late: bool,
) -> ActionChunk:
    """The ActionChunk of one finished step.

    Raises:
        ValueError: the actions are not a finite float32 ``[horizon, len(joint_names)]``.
    """
    actions = np.asarray(result.actions)
    if actions.ndim != 2 or actions.shape[1] != len(joint_names):
        raise ValueError(
            f'robot {robot.robot_id} step {result.step_seq}: actions of shape {actions.shape} '
            f'do not match {len(joint_names)} action columns'
        )
    if not np.all(np.isfinite(actions)):
        raise ValueError(f'robot {robot.robot_id} step {result.step_seq}: non-finite actions')
    msg = ActionChunk()
    msg.header.stamp = ns_to_stamp(result.stamp_ns)
    msg.header.frame_id = robot.frame_id
    msg.robot_id = robot.robot_id
    msg.step_seq = int(result.step_seq)
    msg.horizon = int(actions.shape[0])
    msg.dof = int(actions.shape[1])
    msg.dt = float(robot.dt)
    msg.actions = np.ascontiguousarray(actions, dtype=np.float32).reshape(-1)
    msg.joint_names = list(joint_names)
    msg.action_space = getattr(ActionChunk, ACTION_SPACE_CONSTANTS[robot.action_space])
    msg.deadline = ns_to_stamp(deadline_ns)
    msg.queue_ms = float(result.queue_ms)
    msg.prefill_ms = float(result.prefill_ms)
    msg.decode_ms = float(result.decode_ms)
    msg.total_ms = max(0.0, (published_ns - result.stamp_ns) / 1e6)
    msg.late = bool(late)
    return msg


@dataclass(frozen=True, slots=True)
class ArmCommands:
    """What a chunk tells the arm's controllers; None for an output that is off."""

    trajectory: JointTrajectory | None
    twist: TwistStamped | None
    gripper: Float64 | None


def first_action_not_past(horizon: int, *, dt_ns: int, elapsed_ns: int) -> int:
    """Index of the first action of a chunk that is not past ``elapsed_ns`` after its image
    stamp (action k ends at ``(k + 1) * dt_ns``); ``horizon`` when all are past."""
    return first_action_with_lead(horizon, dt_ns=dt_ns, elapsed_ns=elapsed_ns, min_lead_ns=0)


def first_action_with_lead(horizon: int, *, dt_ns: int, elapsed_ns: int, min_lead_ns: int) -> int:
    """Index of the first action of a chunk reached at least ``min_lead_ns`` after
    ``elapsed_ns`` from its image stamp (action k at ``(k + 1) * dt_ns``; with no lead, the
    first one not past); ``horizon`` when there is none."""
    lead_ns = max(1, min_lead_ns)  # reached at the publication itself is past
    # the smallest k with (k + 1) * dt_ns >= elapsed_ns + lead_ns
    first = -(-(elapsed_ns + lead_ns) // dt_ns) - 1
    return min(horizon, max(0, first))


def first_action_to_send(chunk: ActionChunk, robot: RobotConfig, *, published_ns: int) -> int:
    """The first action of ``chunk`` the arm's commands hold when it is published at
    ``published_ns`` (``robot.min_lead_s`` after it or later); ``chunk.horizon``: none."""
    return first_action_with_lead(
        chunk.horizon,
        dt_ns=round(robot.dt * 1e9),
        elapsed_ns=published_ns - stamp_to_ns(chunk.header.stamp),
        min_lead_ns=round(robot.min_lead_s * 1e9),
    )


def nothing_left(robot: RobotConfig, *, horizon: int, latency_ns: int) -> str:
    """Why a chunk of ``horizon`` actions published ``latency_ns`` after its image stamp has
    no action left to send, in words (``'latency 118.0 ms > horizon x dt 100 ms'``)."""
    latency_ms = latency_ns / 1e6
    span = f'horizon x dt {horizon * robot.dt * 1e3:g} ms'
    if latency_ms >= horizon * robot.dt * 1e3:
        return f'latency {latency_ms:.1f} ms > {span}'
    return f'latency {latency_ms:.1f} ms + min_lead_s {robot.min_lead_s * 1e3:g} ms > {span}'


def arm_commands(
    chunk: ActionChunk, robot: RobotConfig, *, published_ns: int
) -> ArmCommands | None:
    """The arm's commands of ``chunk`` published at ``published_ns`` (see the module
    docstring), or None when no action is left to send.

    ``robot.dt`` is used rather than the chunk's float32 ``dt``.
    """
    dt_ns = round(robot.dt * 1e9)
    elapsed_ns = published_ns - stamp_to_ns(chunk.header.stamp)
    first = first_action_to_send(chunk, robot, published_ns=published_ns)
    if first == chunk.horizon:
        return None
    rows = np.frombuffer(chunk.actions, dtype=np.float32).reshape(chunk.horizon, chunk.dof)
    trajectory = twist = gripper = None
    if robot.publish_joint_trajectory:
        trajectory = JointTrajectory(joint_names=list(chunk.joint_names))
        trajectory.header.frame_id = chunk.header.frame_id
        if robot.joint_trajectory_start == 'now':
            trajectory.header.stamp = ns_to_stamp(published_ns)
        else:
            trajectory.header.stamp = Time()  # zero: the controller starts on receipt
        trajectory.points = [
            JointTrajectoryPoint(
                positions=[float(v) for v in rows[k]],
                time_from_start=ns_to_duration((k + 1) * dt_ns - elapsed_ns),
            )
            for k in range(first, chunk.horizon)
        ]
    if robot.publish_twist:
        twist = ee_twist(rows[first], dt_s=robot.dt, frame_id=chunk.header.frame_id)
        twist.header.stamp = ns_to_stamp(published_ns)
    if robot.publish_gripper:
        gripper = Float64(data=float(rows[first][GRIPPER_COLUMN]))
    return ArmCommands(trajectory=trajectory, twist=twist, gripper=gripper)


def ee_twist(action: np.ndarray, *, dt_s: float, frame_id: str) -> TwistStamped:
    """One ee_delta action (``x y z roll pitch yaw [gripper]``) as the twist that covers its
    delta in ``dt_s``, in ``frame_id`` (its stamp left to the caller)."""
    twist = TwistStamped()
    twist.header.frame_id = frame_id
    velocity = [float(v) / dt_s for v in action[:NUM_TWIST_COLUMNS]]
    linear, angular = twist.twist.linear, twist.twist.angular
    linear.x, linear.y, linear.z = velocity[:3]
    angular.x, angular.y, angular.z = velocity[3:]
    return twist


def step_rejected(refusal: Refusal) -> StepRejected:
    """The StepRejected message of a refused or failed step; its detail is bounded to
    ``MAX_DETAIL_CHARS`` (the start, and a marker with the full length)."""
    msg = StepRejected()
    msg.header.stamp = ns_to_stamp(refusal.stamp_ns)
    msg.robot_id = refusal.robot_id
    msg.step_seq = int(refusal.step_seq)
    msg.reason = int(getattr(StepRejected, _REASON_CONSTANTS[refusal.reason]))
    msg.detail = bounded(refusal.detail, MAX_DETAIL_CHARS)
    return msg
