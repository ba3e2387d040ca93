"""How the chunk executor merges the chunks it keeps at the seam between two of them.

Times are the robot's clock in nanoseconds. Each kept chunk has its arrival time and the time
it takes over (``Kept.takes_over_ns``); at a time ``at_ns`` the *leader* is the newest chunk
that covers ``at_ns`` and has taken over (else the newest that covers it: with nothing older
to play, a chunk plays at once). The ticks follow the leader's action boundaries. The modes
(``MERGE_MODES``):

- ``latest``: the new chunk from the current time on: it is re-timed to start on arrival
  (its action 0 now, action k reached ``(k + 1) * dt`` after arrival), as a client that plays
  each chunk from its start does; the older chunks are dropped.
- ``aligned`` (``off`` is its former name): by action timestamps, dropping the past: the new
  chunk's action that covers the time is played at once, the older chunks are dropped.
- ``blend``: a cross-fade over the overlap, for the joints named in ``blend_joints`` only:
  with the previous merged row ``m`` and the newer chunk's action ``a``, ``(1 - w) m + w a``
  where ``w`` rises linearly from 0 at the newer chunk's arrival to 1 at the end of the chunk
  it overlaps (so nothing jumps on arrival); every other column is the leader's.
- ``temporal_ensemble``: ACT's, ``sum(w_i * a_i) / sum(w_i)``, ``w_i = exp(-m * i)``, i = 0 for
  the oldest chunk that covers the time.
- ``rtc``: real-time chunking's seam: the new chunk's first actions, those the previous chunk
  had already committed while the new one was computed (the frozen prefix), are not taken
  from it; it takes over at its first action boundary at or after the later of its
  publication (``header.stamp + total_ms``, the chunk's own timing) and its arrival. Until
  then the previous chunk plays on; a chunk with nothing older to follow plays at once.

A gripper column (a name containing ``gripper`` or ``finger``: ee_delta's ``gripper``) is
never averaged in any mode: it is always the leader's value, so an open/close command stays
open or closed.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from vla_sched.ros.executor_chunk import Chunk

MERGE_MODES = ('latest', 'aligned', 'blend', 'temporal_ensemble', 'rtc', 'off')
GRIPPER_WORDS = ('gripper', 'finger')
# Modes in which only the leader plays (the older chunks are dropped once it does).
SINGLE_CHUNK_MODES = ('latest', 'aligned', 'rtc', 'off')


def is_gripper(name: str) -> bool:
    """Whether the column ``name`` is a gripper's (never averaged)."""
    lowered = name.lower()
    return any(word in lowered for word in GRIPPER_WORDS)


@dataclass(frozen=True, slots=True)
class Kept:
    """A chunk kept for playing: when it arrived and from when it may lead."""

    chunk: Chunk
    arrived_ns: int
    takes_over_ns: int


def ensemble_weights(count: int, m: float) -> np.ndarray:
    """ACT's temporal ensembling weights ``exp(-m * i)`` for ``count`` chunks, oldest first
    (i = 0), normalised to sum to 1."""
    weights = np.exp(-m * np.arange(count, dtype=np.float64))
    return weights / weights.sum()


def frozen_prefix(chunk: Chunk, *, arrived_ns: int, published_ns: int) -> int:
    """The actions of ``chunk`` the previous chunk committed before it could take over: those
    whose interval starts before the later of its publication and its arrival."""
    ready_ns = max(arrived_ns, published_ns)
    return min(chunk.horizon, max(0, math.ceil((ready_ns - chunk.stamp_ns) / chunk.dt_ns)))


@dataclass(frozen=True, slots=True)
class MergeRule:
    """One merge mode with its parameters (see the module docstring)."""

    mode: str
    ensemble_m: float = 0.0
    blend_joints: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if self.mode not in MERGE_MODES:
            raise ValueError(f'unknown merge mode {self.mode!r}')
        if not math.isfinite(self.ensemble_m) or self.ensemble_m < 0:
            raise ValueError(f'ensemble_m must be finite and >= 0, got {self.ensemble_m}')
        grippers = sorted(j for j in self.blend_joints if is_gripper(j))
        if grippers:
            raise ValueError(f'blend_joints {grippers}: a gripper is never blended')

    @property
    def single_chunk(self) -> bool:
        return self.mode in SINGLE_CHUNK_MODES

    def admit(self, chunk: Chunk, *, arrived_ns: int, published_ns: int) -> Kept:
        """``chunk`` as kept on arrival: re-timed for ``latest``, with its take-over time."""
        if self.mode == 'latest':
            chunk = _retimed(chunk, arrived_ns)
            return Kept(chunk, arrived_ns, chunk.stamp_ns)
        if self.mode == 'rtc':
            frozen = frozen_prefix(chunk, arrived_ns=arrived_ns, published_ns=published_ns)
            return Kept(chunk, arrived_ns, chunk.stamp_ns + frozen * chunk.dt_ns)
        return Kept(chunk, arrived_ns, chunk.stamp_ns)

    def leader(self, kept: list[Kept], at_ns: int) -> Kept | None:
        """The chunk whose action boundaries the ticks follow at ``at_ns``, or None."""
        covering = [k for k in kept if k.chunk.index_at(at_ns) is not None]
        if not covering:
            return None
        leading = [k for k in covering if k.takes_over_ns <= at_ns]
        return (leading or covering)[-1]

    def contributors(self, kept: list[Kept], at_ns: int, leader: Kept) -> list[Kept]:
        """The kept chunks whose actions make the row at ``at_ns``, oldest first."""
        if self.single_chunk:
            return [leader]
        return [
            k
            for k in kept
            if k.chunk.stamp_ns <= leader.chunk.stamp_ns and k.chunk.index_at(at_ns) is not None
        ]

    def row(self, kept: list[Kept], at_ns: int, leader: Kept) -> np.ndarray:
        """The merged action at ``at_ns`` (``leader`` covers it)."""
        chunks = self.contributors(kept, at_ns, leader)
        lead = leader.chunk
        own = lead.actions[lead.index_at(at_ns)]
        if len(chunks) == 1:
            return own.copy()
        rows = np.stack([k.chunk.actions[k.chunk.index_at(at_ns)] for k in chunks])
        if self.mode == 'temporal_ensemble':
            merged = ensemble_weights(len(chunks), self.ensemble_m) @ rows
            blended = [not is_gripper(name) for name in lead.joint_names]
        else:
            merged = _cross_fade(chunks, rows, at_ns)
            blended = [
                name in self.blend_joints and not is_gripper(name) for name in lead.joint_names
            ]
        return np.where(blended, merged, own)


def _cross_fade(chunks: list[Kept], rows: np.ndarray, at_ns: int) -> np.ndarray:
    """``blend``'s row: each newer chunk faded in over its overlap with the one before."""
    merged = rows[0]
    for before, newer, row in zip(chunks, chunks[1:], rows[1:], strict=False):
        start, end = newer.arrived_ns, before.chunk.end_ns
        weight = 1.0 if end <= start else min(1.0, max(0.0, (at_ns - start) / (end - start)))
        merged = (1.0 - weight) * merged + weight * row
    return merged


def _retimed(chunk: Chunk, start_ns: int) -> Chunk:
    """``chunk`` with its actions from ``start_ns`` on (its deadline moved alike)."""
    shift = start_ns - chunk.stamp_ns
    return dataclasses.replace(chunk, stamp_ns=start_ns, deadline_ns=chunk.deadline_ns + shift)
