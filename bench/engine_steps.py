"""Control steps for benchmarks that drive an engine core directly (no ROS, no transport)."""

from __future__ import annotations

import numpy as np

from vla_sched.ipc.messages import StepRequest
from vla_sched.synthetic_frames import synthetic_frame

DEFAULT_INSTRUCTION = 'pick up the red block'


def step_request(
    robot: int,
    seq: int,
    *,
    now_ns: int,
    image_size: int = 64,
    instruction: str = DEFAULT_INSTRUCTION,
    budget_s: float = 600.0,
) -> StepRequest:
    """Step ``seq`` of ``robot_<robot>``: a fresh synthetic frame, no state, stamped and
    received at ``now_ns``, due ``budget_s`` later."""
    return StepRequest(
        robot_id=f'robot_{robot}',
        step_seq=seq,
        stamp_ns=now_ns,
        deadline_ns=now_ns + int(budget_s * 1e9),
        received_ns=now_ns,
        image=synthetic_frame(seq * 31 + robot, width=image_size, height=image_size),
        state=np.zeros(0, np.float32),
        instruction=instruction,
        instruction_version=1,
    )
