"""One ActionChunk as the chunk executor plays it: plain data and its action timing.

Action ``k`` of a chunk stamped ``t`` covers ``[t + k dt, t + (k + 1) dt)`` and is reached at
the end of its interval.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class Chunk:
    """One ActionChunk as plain data: ``actions`` is ``[horizon, dof]`` float64."""

    step_seq: int
    stamp_ns: int
    dt_ns: int
    deadline_ns: int
    actions: np.ndarray
    joint_names: tuple[str, ...]
    action_space: str
    frame_id: str

    def __post_init__(self) -> None:
        if self.dt_ns <= 0:
            raise ValueError(f'chunk {self.step_seq}: dt must be positive, got {self.dt_ns} ns')
        if self.actions.ndim != 2 or self.actions.shape[0] == 0:
            raise ValueError(f'chunk {self.step_seq}: no [horizon, dof] actions')
        if self.actions.shape[1] != len(self.joint_names):
            raise ValueError(
                f'chunk {self.step_seq}: {self.actions.shape[1]} action columns for '
                f'{len(self.joint_names)} joint names'
            )
        if not np.all(np.isfinite(self.actions)):
            raise ValueError(f'chunk {self.step_seq}: non-finite actions')

    @property
    def horizon(self) -> int:
        return self.actions.shape[0]

    @property
    def end_ns(self) -> int:
        return self.stamp_ns + self.horizon * self.dt_ns

    def index_at(self, at_ns: int) -> int | None:
        """The action that covers ``at_ns``, or None before the chunk's start or after its end."""
        if at_ns < self.stamp_ns or at_ns >= self.end_ns:
            return None
        return (at_ns - self.stamp_ns) // self.dt_ns

    def reached_ns(self, index: int) -> int:
        """When action ``index`` is reached: the end of its interval."""
        return self.stamp_ns + (index + 1) * self.dt_ns
