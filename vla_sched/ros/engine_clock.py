"""Times the node sends to the engine, moved from the ROS clock to the engine's wall clock."""

from __future__ import annotations

import dataclasses
import time

from vla_sched.ipc.messages import StepRequest


def engine_clock(step: StepRequest, *, now_ns: int) -> StepRequest:
    """``step`` with its deadline and receipt time on the engine's clock (wall time).

    The node's clock is the ROS clock, which runs on simulated time under use_sim_time;
    the engine judges deadlines by wall time. The time left stays what it is on the ROS
    clock. The stamp is the robot's and travels unchanged.
    """
    offset = time.time_ns() - now_ns
    return dataclasses.replace(
        step, deadline_ns=step.deadline_ns + offset, received_ns=step.received_ns + offset
    )
