"""Play action chunks out on the robot's clock, never an action that is no longer valid.

Times are the robot's clock in nanoseconds, passed in by the caller. As in ``outputs``,
action k of a chunk whose image is stamped ``t`` covers ``[t + k * dt, t + (k + 1) * dt)``
and is reached at the end of its interval; a chunk is over at ``t + horizon * dt``.

- Admission (``receive``): a chunk that arrives after its ``deadline`` (the latest time its
  first action may start) or with no action left is skipped, and so is one of an action
  space the sink does not play, one stamped more than ``max_stamp_skew_ns`` ahead of the
  clock (it would hold every later chunk back as out of order until its stamp), or one not
  newer than the newest kept chunk. A chunk whose joint names or action space differ from
  the kept ones replaces them. The message's own fields are checked before
  (``chunk_checks``); what was skipped is counted by reason, the last one kept with why.
- A tick (``tick``) plays the action that covers its time. ``blending`` ``off``: the newest
  chunk that covers it, alone; the older chunks are dropped, and those never played count as
  superseded. ``temporal_ensemble``: every kept chunk that covers it, blended as ACT's
  temporal ensembling does, ``sum(w_i * a_i) / sum(w_i)`` with ``w_i = exp(-m * i)``, i = 0 for
  the oldest chunk. With ``lookahead`` the command also holds the later actions of the newest
  chunk, each blended the same way at the start of its interval.
- Hold: when no kept chunk covers the tick's time the tick returns None; the caller sends
  nothing new (a zero twist once, as it enters the hold). A chunk never plays an action after
  its end, and an older chunk never outlives the newest one.
- ``next_tick_ns``: the next interval start of the newest chunk that covers the time (or the
  start of a newer one), so the ticks fall on its action boundaries, one per dt; None when
  nothing is kept.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from vla_sched.ros.text_bounds import MAX_VALUE_CHARS, bounded

BLEND_OFF = 'off'
BLEND_ENSEMBLE = 'temporal_ensemble'
# Why a chunk was never played (the keys of ``ExecutorCounts.skipped``); ``bad_dt``,
# ``bad_shape``, ``bad_columns`` and ``non_finite`` are the message checks' (``chunk_checks``),
# ``malformed`` a message that could not be read at all.
SKIP_REASONS = (
    'past_deadline',
    'superseded',
    'action_space',
    'out_of_order',
    'future_stamp',
    'bad_dt',
    'bad_shape',
    'bad_columns',
    'non_finite',
    'malformed',
)
DEFAULT_MAX_STAMP_SKEW_NS = 1_000_000_000


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


@dataclass(frozen=True, slots=True)
class Command:
    """What one tick sends: ``rows[j]`` is to be reached at ``reached_ns[j]`` (strictly
    increasing, every one after the tick); row 0 is the current action."""

    at_ns: int
    rows: np.ndarray
    reached_ns: tuple[int, ...]
    dt_ns: int
    joint_names: tuple[str, ...]
    action_space: str
    frame_id: str


@dataclass(slots=True)
class ExecutorCounts:
    """What the executor did since it started."""

    actions_executed: int = 0  # ticks that sent a command
    chunks_executed: int = 0  # chunks that gave at least one played action
    holds: int = 0  # times it stopped with nothing valid left, after playing something
    skipped: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SKIP_REASONS, 0))
    last_skip: tuple[str, str] | None = None  # (reason, detail) of the last chunk skipped


def ensemble_weights(count: int, m: float) -> np.ndarray:
    """ACT's temporal ensembling weights ``exp(-m * i)`` for ``count`` chunks, oldest first
    (i = 0), normalised to sum to 1."""
    weights = np.exp(-m * np.arange(count, dtype=np.float64))
    return weights / weights.sum()


class ChunkExecutor:
    """The chunks kept for playing and the rules of the module docstring."""

    def __init__(
        self,
        *,
        action_spaces: tuple[str, ...],
        blending: str,
        ensemble_m: float,
        lookahead: bool,
        max_stamp_skew_ns: int = DEFAULT_MAX_STAMP_SKEW_NS,
    ) -> None:
        if blending not in (BLEND_OFF, BLEND_ENSEMBLE):
            raise ValueError(f'unknown blending {blending!r}')
        if not math.isfinite(ensemble_m) or ensemble_m < 0:
            raise ValueError(f'ensemble_m must be finite and >= 0, got {ensemble_m}')
        if max_stamp_skew_ns < 0:
            raise ValueError(f'max_stamp_skew_ns must be >= 0, got {max_stamp_skew_ns}')
        self.action_spaces = action_spaces
        self.max_stamp_skew_ns = max_stamp_skew_ns
        self.blending = blending
        self.ensemble_m = ensemble_m
        self.lookahead = lookahead
        self.counts = ExecutorCounts()
        self._chunks: list[Chunk] = []  # oldest first
        self._played: set[int] = set()  # id() of the kept chunks that gave an action
        self._newest_stamp_ns: int | None = None
        self._executing = False

    @property
    def admitted_any(self) -> bool:
        """Whether a chunk was ever kept for playing."""
        return self._newest_stamp_ns is not None

    @property
    def holding(self) -> bool:
        """True once something was played and nothing valid is left to play."""
        return not self._executing and self.counts.actions_executed > 0

    def newest_age_ns(self, now_ns: int) -> int | None:
        """Age of the newest chunk admitted (from its image stamp), or None before the first."""
        return None if self._newest_stamp_ns is None else now_ns - self._newest_stamp_ns

    def skip(self, reason: str, detail: str = '') -> None:
        """Count a chunk that was never played, for ``reason`` (one of ``SKIP_REASONS``)."""
        self.counts.skipped[reason] += 1
        if reason != 'superseded':  # a played-over chunk says nothing about the input
            self.counts.last_skip = (reason, bounded(detail, MAX_VALUE_CHARS))

    def receive(self, chunk: Chunk, now_ns: int) -> str | None:
        """Keep ``chunk`` for playing; the reason it is skipped instead, or None."""
        reason = detail = None
        seq = chunk.step_seq
        if chunk.action_space not in self.action_spaces:
            reason = 'action_space'
            detail = f'chunk {seq}: action space {chunk.action_space!r}'
        elif chunk.stamp_ns > now_ns + self.max_stamp_skew_ns:
            reason = 'future_stamp'
            detail = f'chunk {seq}: stamped {(chunk.stamp_ns - now_ns) / 1e9:.3f} s ahead'
        elif now_ns > chunk.deadline_ns or now_ns >= chunk.end_ns:
            reason = 'past_deadline'
            detail = f'chunk {seq}: received past its deadline or its end'
        elif self._newest_stamp_ns is not None and chunk.stamp_ns <= self._newest_stamp_ns:
            reason = 'out_of_order'
            detail = f'chunk {seq}: not newer than the newest chunk'
        if reason is not None:
            self.skip(reason, detail)
            return reason
        if self._chunks and (
            chunk.joint_names != self._chunks[-1].joint_names
            or chunk.action_space != self._chunks[-1].action_space
        ):
            self._drop(self._chunks)  # another layout: nothing of the old ones is blended
        self._chunks.append(chunk)
        self._newest_stamp_ns = chunk.stamp_ns
        return None

    def tick(self, now_ns: int) -> Command | None:
        """The command to send at ``now_ns``, or None to hold (see the module docstring)."""
        self._drop([c for c in self._chunks if c.end_ns <= now_ns])
        covering = [c for c in self._chunks if c.index_at(now_ns) is not None]
        if not covering:
            if self._executing:
                self.counts.holds += 1
            self._executing = False
            return None
        newest = covering[-1]
        if self.blending == BLEND_OFF:
            self._drop([c for c in self._chunks if c.stamp_ns < newest.stamp_ns])
        current = newest.index_at(now_ns)
        times = [now_ns]
        if self.lookahead:
            times += [
                newest.stamp_ns + k * newest.dt_ns for k in range(current + 1, newest.horizon)
            ]
        rows = np.stack([self._blend(at_ns, newest) for at_ns in times])
        reached = tuple(newest.reached_ns(k) for k in range(current, current + len(times)))
        for chunk in self._contributors(now_ns, newest):
            if id(chunk) not in self._played:
                self._played.add(id(chunk))
                self.counts.chunks_executed += 1
        self.counts.actions_executed += 1
        self._executing = True
        return Command(
            at_ns=now_ns,
            rows=rows,
            reached_ns=reached,
            dt_ns=newest.dt_ns,
            joint_names=newest.joint_names,
            action_space=newest.action_space,
            frame_id=newest.frame_id,
        )

    def next_tick_ns(self, now_ns: int) -> int | None:
        """When the next tick is due after ``now_ns``: the next interval start (its end
        included, where a hold begins) of the newest chunk that covers ``now_ns``, or the
        start of a newer kept chunk if that comes first; None when nothing is kept."""
        due = [c.stamp_ns for c in self._chunks if c.stamp_ns > now_ns]
        covering = [c for c in self._chunks if c.index_at(now_ns) is not None]
        if covering:
            newest = covering[-1]
            due.append(newest.reached_ns(newest.index_at(now_ns)))
        return min(due) if due else None

    def _contributors(self, at_ns: int, newest: Chunk) -> list[Chunk]:
        """The chunks whose actions are played at ``at_ns``, oldest first."""
        if self.blending == BLEND_OFF:
            return [newest]
        return [
            c
            for c in self._chunks
            if c.stamp_ns <= newest.stamp_ns and c.index_at(at_ns) is not None
        ]

    def _blend(self, at_ns: int, newest: Chunk) -> np.ndarray:
        chunks = self._contributors(at_ns, newest)
        rows = np.stack([c.actions[c.index_at(at_ns)] for c in chunks])
        weights = ensemble_weights(len(chunks), self.ensemble_m)
        return weights @ rows

    def _drop(self, chunks: list[Chunk]) -> None:
        for chunk in list(chunks):
            if id(chunk) not in self._played:
                self.skip('superseded')
            self._played.discard(id(chunk))
            self._chunks.remove(chunk)
