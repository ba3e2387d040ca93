"""Build the messages the node publishes: ActionChunk, JointTrajectory and StepRejected."""

from __future__ import annotations

import numpy as np
from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

from vla_sched.ipc.messages import FailureReason, StepResult
from vla_sched.msg import ActionChunk, StepRejected
from vla_sched.ros.conversions import ns_to_duration, ns_to_stamp
from vla_sched.ros.node_config import RobotConfig
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


def joint_trajectory(chunk: ActionChunk, *, dt_s: float) -> JointTrajectory:
    """The chunk as a JointTrajectory: point k at ``time_from_start = k * dt_s``.

    ``dt_s`` is the robot's configured ``dt`` (the chunk holds it only as float32).
    """
    traj = JointTrajectory()
    traj.header = chunk.header
    traj.joint_names = list(chunk.joint_names)
    rows = np.frombuffer(chunk.actions, dtype=np.float32).reshape(chunk.horizon, chunk.dof)
    traj.points = [
        JointTrajectoryPoint(
            positions=[float(v) for v in row],
            time_from_start=ns_to_duration(round(k * dt_s * 1e9)),
        )
        for k, row in enumerate(rows)
    ]
    return traj


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
