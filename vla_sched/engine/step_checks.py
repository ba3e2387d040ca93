"""Checks every step request before it reaches a model: bad input becomes a StepFailure."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from vla_sched.engine.core_stats import record_failure
from vla_sched.ipc.messages import EngineInfo, FailureReason, StepFailure, StepRequest

if TYPE_CHECKING:
    from vla_sched.core.scheduling.metrics import SchedulerMetrics

MAX_IMAGE_SIDE = 4096


def _image_problem(images: tuple[np.ndarray, ...], *, num_images: int) -> str | None:
    """Why ``images`` are not the ``num_images`` uint8 [H, W, 3] images of one step, or None.

    An image is named by its place (``image 1`` is the first camera after the primary)."""
    if len(images) != num_images:
        count = f'{len(images)} image' + ('' if len(images) == 1 else 's')
        return f'step has {count}; the checkpoint takes {num_images} per step'
    for index, image in enumerate(images):
        name = 'image' if num_images == 1 else f'image {index}'
        if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
            return f'{name} must be uint8 [H, W, 3], got {image.dtype} {list(image.shape)}'
        if not (1 <= image.shape[0] <= MAX_IMAGE_SIDE and 1 <= image.shape[1] <= MAX_IMAGE_SIDE):
            return f'{name} side out of range 1..{MAX_IMAGE_SIDE}: {list(image.shape[:2])}'
    return None


def check_step_request(
    request: StepRequest, *, num_state: int, max_instruction_bytes: int, num_images: int
) -> StepFailure | None:
    """The reason ``request`` cannot be served, or None if it is well-formed."""

    def fail(reason: FailureReason, detail: str) -> StepFailure:
        return StepFailure(request.robot_id, request.step_seq, request.stamp_ns, reason, detail)

    problem = _image_problem(request.images, num_images=num_images)
    if problem is not None:
        return fail(FailureReason.MALFORMED_IMAGE, problem)
    state = request.state
    if state.ndim != 1 or (num_state and state.shape[0] != num_state):
        return fail(
            FailureReason.INVALID_STATE,
            f'state must have {num_state} values, got shape {list(state.shape)}',
        )
    if not np.isfinite(state).all():
        bad = [int(i) for i in np.flatnonzero(~np.isfinite(state))]
        return fail(FailureReason.INVALID_STATE, f'state has NaN or inf at {bad}')
    text = request.instruction
    if not text.strip():
        return fail(FailureReason.INVALID_INSTRUCTION, 'instruction is empty')
    num_bytes = len(text.encode('utf-8'))
    if num_bytes > max_instruction_bytes:
        return fail(
            FailureReason.INVALID_INSTRUCTION,
            f'instruction is {num_bytes} bytes, limit {max_instruction_bytes}',
        )
    if request.deadline_ns < request.stamp_ns:
        return fail(FailureReason.DEADLINE_MISSED, 'deadline is before the observation stamp')
    return None


def refuse_malformed(
    request: StepRequest, info: EngineInfo, metrics: SchedulerMetrics
) -> list[StepFailure]:
    """``[failure]`` for a step that cannot be served by the engine ``info`` describes
    (counted in ``metrics``), else ``[]``: the check both cores make before a step reaches
    their model."""
    failure = check_step_request(
        request,
        num_state=info.num_state,
        max_instruction_bytes=info.max_instruction_bytes,
        num_images=info.num_images,
    )
    if failure is None:
        return []
    record_failure(metrics, request.robot_id, failure.reason)
    return [failure]
