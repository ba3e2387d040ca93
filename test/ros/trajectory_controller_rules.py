"""What ros2_controllers' JointTrajectoryController accepts, as validate_trajectory_msg
(joint_trajectory_controller.cpp) checks a trajectory it receives: shared by the tests of the
node's own trajectory output and of the chunk executor's stand-in controller."""

from __future__ import annotations

import itertools

from vla_sched.ros.conversions import stamp_to_ns


def controller_refusal(traj, *, received_ns: int) -> str | None:
    """Why the controller would refuse ``traj`` received at ``received_ns``, or None.

    A zero ``header.stamp`` starts the trajectory on receipt; a non-zero one whose last
    point is already past is refused; the points' times must increase strictly and each
    point must hold one position per joint name.
    """
    if not traj.joint_names or not traj.points:
        return 'empty'
    start_ns = stamp_to_ns(traj.header.stamp)
    if start_ns != 0 and start_ns + stamp_to_ns(traj.points[-1].time_from_start) < received_ns:
        return 'non-zero start time that ends in the past'
    times = [stamp_to_ns(p.time_from_start) for p in traj.points]
    if any(b <= a for a, b in itertools.pairwise(times)):
        return 'times not strictly increasing'
    if any(len(p.positions) != len(traj.joint_names) for p in traj.points):
        return 'positions do not match joint_names'
    return None
