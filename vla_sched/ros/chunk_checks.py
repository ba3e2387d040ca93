"""Every field of an ActionChunk checked before the chunk executor keeps it.

``chunk_from_message`` turns a message into the executor's ``Chunk`` or refuses it with
``ChunkRefusedError``, whose ``reason`` is one of the executor's skip reasons:

- ``action_space``: an action space the sink does not play;
- ``bad_dt``: ``dt`` not finite, or outside ``[min_dt_ns, max_dt_ns]`` once rounded to whole
  microseconds (a float32 holds about 7 significant digits, so 0.2 s reads 0.2000000030 and
  would put every action boundary a few nanoseconds off the one the node meant);
- ``bad_shape``: no action, or ``horizon``, ``dof``, the number of action values and of joint
  names disagree;
- ``bad_columns``: fewer columns than the sink reads (``min_columns``: 6 for a twist, 7 with
  the gripper), or an empty or repeated joint name;
- ``non_finite``: a NaN or infinite action value.

Nothing else is raised, whatever the message holds; what the check does not see (the stamps
against the clock) is left to ``ChunkExecutor.receive``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from vla_sched.ros.conversions import stamp_to_ns
from vla_sched.ros.executor_chunk import Chunk


class ChunkRefusedError(ValueError):
    """A message that cannot be played: ``reason`` is a skip reason, ``detail`` says why."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True, slots=True)
class ChunkRules:
    """What a playable chunk is for one executor: its sink's action spaces, the columns the
    sink reads, and the bounds of ``dt`` in nanoseconds."""

    action_spaces: tuple[str, ...]
    min_columns: int
    min_dt_ns: int
    max_dt_ns: int

    def __post_init__(self) -> None:
        if self.min_columns < 1:
            raise ValueError(f'min_columns must be >= 1, got {self.min_columns}')
        if not 0 < self.min_dt_ns <= self.max_dt_ns:
            raise ValueError(
                f'need 0 < min_dt_ns <= max_dt_ns, got {self.min_dt_ns} and {self.max_dt_ns}'
            )


def dt_ns_of(dt_s: float) -> int | None:
    """An ActionChunk's float32 ``dt`` in nanoseconds, rounded to whole microseconds; None
    when it is not finite."""
    dt_s = float(dt_s)
    if not math.isfinite(dt_s):
        return None
    return round(dt_s * 1e6) * 1000


def chunk_from_message(msg, rules: ChunkRules) -> Chunk:
    """The executor's ``Chunk`` of the ActionChunk ``msg`` (see the module docstring).

    Raises:
        ChunkRefusedError: the reason and what was wrong.
    """
    seq = int(msg.step_seq)
    space = str(msg.action_space)
    if space not in rules.action_spaces:
        raise ChunkRefusedError(
            'action_space',
            f'chunk {seq}: action space {space!r}; this sink plays {list(rules.action_spaces)}',
        )
    dt_ns = dt_ns_of(msg.dt)
    if dt_ns is None or not rules.min_dt_ns <= dt_ns <= rules.max_dt_ns:
        raise ChunkRefusedError(
            'bad_dt',
            f'chunk {seq}: dt {float(msg.dt)!r} s is not within '
            f'[{rules.min_dt_ns / 1e9:g}, {rules.max_dt_ns / 1e9:g}] s',
        )
    horizon, dof = int(msg.horizon), int(msg.dof)
    num_values, num_names = len(msg.actions), len(msg.joint_names)
    if horizon < 1 or dof < 1 or num_values != horizon * dof or num_names != dof:
        raise ChunkRefusedError(
            'bad_shape',
            f'chunk {seq}: {num_values} action values and {num_names} joint names for '
            f'horizon {horizon} x dof {dof}',
        )
    names = tuple(str(name) for name in msg.joint_names)
    if dof < rules.min_columns:
        raise ChunkRefusedError(
            'bad_columns',
            f'chunk {seq}: {dof} {space} columns; this sink reads {rules.min_columns}',
        )
    if not all(names) or len(set(names)) != len(names):
        raise ChunkRefusedError(
            'bad_columns', f'chunk {seq}: empty or repeated joint names {names}'
        )
    actions = np.asarray(msg.actions, dtype=np.float64).reshape(horizon, dof)
    if not np.all(np.isfinite(actions)):
        raise ChunkRefusedError('non_finite', f'chunk {seq}: NaN or infinite action values')
    stamp_ns = stamp_to_ns(msg.header.stamp)
    return Chunk(
        step_seq=seq,
        stamp_ns=stamp_ns,
        dt_ns=dt_ns,
        deadline_ns=stamp_to_ns(msg.deadline),
        actions=actions,
        joint_names=names,
        action_space=space,
        frame_id=str(msg.header.frame_id),
    )
