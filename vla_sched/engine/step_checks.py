"""Checks every step request before it reaches a model: bad input becomes a StepFailure.

An instruction is bounded twice: in UTF-8 bytes (``EngineInfo.max_instruction_bytes``, which
the node also checks) and in the model's tokens (``InstructionTokenLimit``: the family counts,
the engine only compares), so a short text that tokenizes long (emoji, CJK) cannot grow a
step's pass past what the others' deadlines allow.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

from vla_sched.engine.core_stats import record_failure
from vla_sched.ipc.messages import EngineInfo, FailureReason, StepFailure, StepRequest

if TYPE_CHECKING:
    from vla_sched.core.scheduling.metrics import SchedulerMetrics

MAX_IMAGE_SIDE = 4096
TOKEN_COUNT_CACHE_SIZE = 256  # instructions whose token counts are kept (robots repeat theirs)


@dataclass(frozen=True)
class InstructionTokenLimit:
    """The longest instruction in the model's tokens, and how to count them.

    Attributes:
        max_tokens: the bound (``EngineConfig.max_instruction_tokens``).
        count: an instruction's tokens (the family's ``ServedModel.instruction_tokens``);
            each text is counted once while it stays among the last few counted.
    """

    max_tokens: int
    count: Callable[[str], int]
    _cached: Callable[[str], int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f'max_tokens must be >= 1, got {self.max_tokens}')
        object.__setattr__(self, '_cached', lru_cache(TOKEN_COUNT_CACHE_SIZE)(self.count))

    def problem(self, text: str) -> str | None:
        """Why ``text`` is too long in tokens, or None."""
        num_tokens = self._cached(text)
        if num_tokens <= self.max_tokens:
            return None
        return f'instruction is {num_tokens} tokens, limit {self.max_tokens}'


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
    request: StepRequest,
    *,
    num_state: int,
    max_instruction_bytes: int,
    num_images: int,
    token_limit: InstructionTokenLimit | None = None,
) -> StepFailure | None:
    """The reason ``request`` cannot be served, or None if it is well-formed (its instruction
    counted in tokens only under ``token_limit``, after the byte bound)."""

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
    if not any(ch.isprintable() and not ch.isspace() for ch in text):
        return fail(FailureReason.INVALID_INSTRUCTION, 'instruction has no printable character')
    num_bytes = len(text.encode('utf-8'))
    if num_bytes > max_instruction_bytes:
        return fail(
            FailureReason.INVALID_INSTRUCTION,
            f'instruction is {num_bytes} bytes, limit {max_instruction_bytes}',
        )
    if token_limit is not None and (problem := token_limit.problem(text)) is not None:
        return fail(FailureReason.INVALID_INSTRUCTION, problem)
    if request.deadline_ns < request.stamp_ns:
        return fail(FailureReason.DEADLINE_MISSED, 'deadline is before the observation stamp')
    problem = _previous_actions_problem(request)
    if problem is not None:
        return fail(FailureReason.INVALID_STATE, problem)
    return None


def _previous_actions_problem(request: StepRequest) -> str | None:
    """Why a step's real-time-chunking inputs are malformed, or None (the engine compares
    the columns with the checkpoint's action size where it uses them)."""
    previous = request.previous_actions
    if previous.ndim != 2 or previous.dtype != np.float32:
        return f'previous actions must be float32 [n, dof], got {previous.dtype} {previous.shape}'
    if not np.isfinite(previous).all():
        return 'previous actions hold NaN or inf'
    if request.inference_delay < 0:
        return f'inference delay must be >= 0, got {request.inference_delay}'
    return None


def refuse_malformed(
    request: StepRequest,
    info: EngineInfo,
    metrics: SchedulerMetrics,
    *,
    token_limit: InstructionTokenLimit | None = None,
) -> list[StepFailure]:
    """``[failure]`` for a step that cannot be served by the engine ``info`` describes
    (counted in ``metrics``), else ``[]``: the check both cores make before a step reaches
    their model."""
    failure = check_step_request(
        request,
        num_state=info.num_state,
        max_instruction_bytes=info.max_instruction_bytes,
        num_images=info.num_images,
        token_limit=token_limit,
    )
    if failure is None:
        return []
    record_failure(metrics, request.robot_id, failure.reason)
    return [failure]
