"""Steps reach the engine with deadlines on its wall clock, whatever the ROS clock says."""

from __future__ import annotations

import time

import numpy as np

from vla_sched.ipc.messages import StepRequest
from vla_sched.ros.engine_link import engine_clock

SIM_NOW_NS = 42 * 10**9  # a simulated ROS clock, far from wall time


def test_time_left_is_kept_when_the_ros_clock_is_simulated():
    step = StepRequest(
        robot_id='arm', step_seq=1, stamp_ns=SIM_NOW_NS - 10**8,
        deadline_ns=SIM_NOW_NS + 4 * 10**8, received_ns=SIM_NOW_NS - 5 * 10**7,
        images=(np.zeros((2, 2, 3), np.uint8),), state=np.zeros(0, np.float32),
        instruction='go', instruction_version=1,
    )  # fmt: skip
    before = time.time_ns()
    sent = engine_clock(step, now_ns=SIM_NOW_NS)
    after = time.time_ns()
    assert before + 4 * 10**8 <= sent.deadline_ns <= after + 4 * 10**8
    assert before - 5 * 10**7 <= sent.received_ns <= after - 5 * 10**7
    assert sent.stamp_ns == step.stamp_ns  # the robot's stamp comes back unchanged
    assert sent.images is step.images
