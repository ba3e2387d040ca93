"""Play action chunks out on the robot's clock, never an action that is no longer valid.

Times are the robot's clock in nanoseconds, passed in by the caller. As in ``outputs``,
action k of a chunk whose image is stamped ``t`` covers ``[t + k * dt, t + (k + 1) * dt)``
and is reached at the end of its interval; a chunk is over at ``t + horizon * dt``.

- Admission (``receive``): a chunk that arrives after its end is skipped
  (``ended_before_arrival``), one whose last action would be reached less than ``min_lead_ns``
  after arrival too (``ends_within_lead``), one that arrives after its ``deadline`` (the
  latest time its first action may start) is ``past_deadline``; so is one of an action space
  the sink does not play, one stamped more than ``max_stamp_skew_ns`` ahead of the clock (it
  would hold every later chunk back as out of order until its stamp), or one not newer than
  the newest kept chunk. Then the safety gate, when given, checks (and may clip) the actions
  that can still be played, or refuses the chunk (``safety_gate``): nothing unchecked is
  kept. A chunk whose joint names or action space differ from the kept ones replaces them.
  The message's own fields are checked before (``chunk_checks``); what was skipped is
  counted by reason, the last one kept with why.
- A tick (``tick``) plays the action that covers its time, merged with the other kept chunks
  by the merge mode (``merge``: latest, aligned, blend, temporal_ensemble, rtc). With
  ``lookahead`` the command also holds the later actions of the leading chunk, each merged at
  the start of its interval.
- Minimum lead: no command holds an action reached less than ``min_lead_ns`` after the tick
  (transport to the controller and one controller period). Such an action is dropped, not
  clamped: the command starts with the next action, at its own time; clamping would send the
  position to be reached later than the chunk says, and a point reached on arrival is a jump.
  So a trajectory stamped at the tick is accepted by a controller that receives it less than
  ``min_lead_ns`` later, whenever the chunk arrived.
- Hold (starvation): when no kept chunk has an action left to play the tick returns None; the
  caller sends nothing new (a zero twist once, as it enters the hold) and the controller
  holds the last position. The holds are counted and timed (``ExecutorCounts``). A chunk
  never plays an action after its end, and an older chunk never outlives the newest one.
- ``next_tick_ns``: the next interval start of the leading chunk (after the first action it
  can still send), or the start or take-over of a newer kept chunk if that comes first, so
  the ticks fall on its action boundaries, one per dt; None when nothing is kept.
- The executed action period: the time between two ticks that each sent a new action
  (``action_periods``, the last 256, in ms), not across a hold.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from vla_sched.ros.executor_chunk import Chunk
from vla_sched.ros.merge import Kept, MergeRule
from vla_sched.ros.text_bounds import MAX_VALUE_CHARS, bounded
from vla_sched.ros.windows import MsLatencyWindow

BLEND_OFF = 'off'
BLEND_ENSEMBLE = 'temporal_ensemble'
# Why a chunk was never played (the keys of ``ExecutorCounts.skipped``); ``bad_dt``,
# ``bad_shape``, ``bad_columns`` and ``non_finite`` are the message checks' (``chunk_checks``),
# ``malformed`` a message that could not be read at all, ``safety_gate`` the gate's refusal.
SKIP_REASONS = (
    'ended_before_arrival',
    'ends_within_lead',
    'past_deadline',
    'superseded',
    'action_space',
    'out_of_order',
    'future_stamp',
    'safety_gate',
    'bad_dt',
    'bad_shape',
    'bad_columns',
    'non_finite',
    'malformed',
)
DEFAULT_MAX_STAMP_SKEW_NS = 1_000_000_000
# Transport to the controller (3-6 ms measured on one host) and one period of a 100 Hz
# controller: the least time between a tick and the first point it sends.
DEFAULT_MIN_LEAD_NS = 15_000_000
PERIOD_WINDOW_ACTIONS = 256


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
    held_ns: int = 0  # time spent in the holds that ended
    longest_hold_ns: int = 0
    skipped: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SKIP_REASONS, 0))
    last_skip: tuple[str, str] | None = None  # (reason, detail) of the last chunk skipped


@dataclass(frozen=True, slots=True)
class GateVerdict:
    """What a safety gate says of a chunk: the actions to keep (clipped or not), or None
    when it is refused, and why."""

    actions: np.ndarray | None
    detail: str = ''


# The safety gate: (chunk, the action that covers its arrival (0 before its start), the
# arrival) -> its verdict on the actions from that one on.
Gate = Callable[[Chunk, int, int], GateVerdict]


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
        min_lead_ns: int = DEFAULT_MIN_LEAD_NS,
        blend_joints: tuple[str, ...] = (),
    ) -> None:
        if max_stamp_skew_ns < 0:
            raise ValueError(f'max_stamp_skew_ns must be >= 0, got {max_stamp_skew_ns}')
        if min_lead_ns < 0:
            raise ValueError(f'min_lead_ns must be >= 0, got {min_lead_ns}')
        self.merge = MergeRule(blending, ensemble_m, frozenset(blend_joints))
        self.action_spaces = action_spaces
        self.max_stamp_skew_ns = max_stamp_skew_ns
        self.min_lead_ns = min_lead_ns
        self.blending = blending
        self.ensemble_m = ensemble_m
        self.lookahead = lookahead
        self.counts = ExecutorCounts()
        self.action_periods = MsLatencyWindow(PERIOD_WINDOW_ACTIONS)
        self._kept: list[Kept] = []  # oldest first
        self._played: set[int] = set()  # id() of the kept chunks that gave an action
        self._newest_stamp_ns: int | None = None
        self._executing = False
        self._hold_since_ns: int | None = None
        self._last_target: int | None = None  # when the last new action is reached
        self._last_action_ns: int | None = None  # the tick that sent the last new action
        self.newest_joint_names: tuple[str, ...] = ()  # of the newest chunk kept

    @property
    def admitted_any(self) -> bool:
        """Whether a chunk was ever kept for playing."""
        return self._newest_stamp_ns is not None

    @property
    def holding(self) -> bool:
        """True once something was played and nothing valid is left to play."""
        return not self._executing and self.counts.actions_executed > 0

    @property
    def hold_since_ns(self) -> int | None:
        """When the hold going on began, or None while playing (or before the first action)."""
        return self._hold_since_ns

    def hold_ns(self, now_ns: int) -> int:
        """How long the hold going on has lasted at ``now_ns`` (0 while playing)."""
        return 0 if self._hold_since_ns is None else max(0, now_ns - self._hold_since_ns)

    def newest_age_ns(self, now_ns: int) -> int | None:
        """Age of the newest chunk admitted (from its image stamp), or None before the first."""
        return None if self._newest_stamp_ns is None else now_ns - self._newest_stamp_ns

    def skip(self, reason: str, detail: str = '') -> None:
        """Count a chunk that was never played, for ``reason`` (one of ``SKIP_REASONS``)."""
        self.counts.skipped[reason] += 1
        if reason != 'superseded':  # a played-over chunk says nothing about the input
            self.counts.last_skip = (reason, bounded(detail, MAX_VALUE_CHARS))

    def first_playable(self, chunk: Chunk, now_ns: int) -> int | None:
        """The first action of ``chunk`` reached at least ``min_lead_ns`` after ``now_ns`` (and
        not before its interval), or None when none is."""
        index = chunk.index_at(now_ns)
        if index is None:
            index = 0 if now_ns < chunk.stamp_ns else chunk.horizon
        while index < chunk.horizon and chunk.reached_ns(index) - now_ns < self.min_lead_ns:
            index += 1
        return index if index < chunk.horizon else None

    def receive(
        self,
        chunk: Chunk,
        now_ns: int,
        *,
        published_ns: int | None = None,
        gate: Gate | None = None,
    ) -> str | None:
        """Keep ``chunk`` for playing; the reason it is skipped instead, or None.

        ``published_ns``: when the chunk was published (``header.stamp + total_ms``; the
        arrival when not known), from which ``rtc`` knows its frozen prefix. ``gate``: the
        safety gate every kept chunk passes."""
        reason = detail = None
        seq = chunk.step_seq
        late_ms = (now_ns - chunk.stamp_ns) / 1e6
        if chunk.action_space not in self.action_spaces:
            reason = 'action_space'
            detail = f'chunk {seq}: action space {chunk.action_space!r}'
        elif chunk.stamp_ns > now_ns + self.max_stamp_skew_ns:
            reason = 'future_stamp'
            detail = f'chunk {seq}: stamped {(chunk.stamp_ns - now_ns) / 1e9:.3f} s ahead'
        elif now_ns >= chunk.end_ns:
            reason = 'ended_before_arrival'
            detail = (
                f'chunk {seq}: arrived {late_ms:.1f} ms after its stamp, after its end '
                f'(horizon {chunk.horizon} x dt {chunk.dt_ns / 1e6:g} ms)'
            )
        elif now_ns > chunk.deadline_ns:
            reason = 'past_deadline'
            detail = (
                f'chunk {seq}: arrived {(now_ns - chunk.deadline_ns) / 1e6:.1f} ms after its '
                'deadline'
            )
        elif self._newest_stamp_ns is not None and chunk.stamp_ns <= self._newest_stamp_ns:
            reason = 'out_of_order'
            detail = f'chunk {seq}: not newer than the newest chunk'
        if reason is not None:
            self.skip(reason, detail)
            return reason
        kept = self.merge.admit(
            chunk, arrived_ns=now_ns, published_ns=now_ns if published_ns is None else published_ns
        )
        first = self.first_playable(kept.chunk, now_ns)
        if first is None:
            self.skip(
                'ends_within_lead',
                f'chunk {seq}: its last action is reached {(chunk.end_ns - now_ns) / 1e6:.1f} '
                f'ms after arrival, under the minimum lead {self.min_lead_ns / 1e6:g} ms',
            )
            return 'ends_within_lead'
        if gate is not None:
            covering = kept.chunk.index_at(now_ns)
            verdict = gate(kept.chunk, 0 if covering is None else covering, now_ns)
            if verdict.actions is None:
                self.skip('safety_gate', f'chunk {seq}: {verdict.detail}')
                return 'safety_gate'
            kept = replace(kept, chunk=replace(kept.chunk, actions=verdict.actions))
        if self._kept and (
            chunk.joint_names != self._kept[-1].chunk.joint_names
            or chunk.action_space != self._kept[-1].chunk.action_space
        ):
            self._drop(self._kept)  # another layout: nothing of the old ones is merged
        self._kept.append(kept)
        self._newest_stamp_ns = chunk.stamp_ns
        self.newest_joint_names = chunk.joint_names
        return None

    def tick(self, now_ns: int) -> Command | None:
        """The command to send at ``now_ns``, or None to hold (see the module docstring)."""
        self._drop([k for k in self._kept if k.chunk.end_ns <= now_ns])
        leader, first = self._leading(now_ns)
        if leader is None:
            self._enter_hold(now_ns)
            return None
        lead = leader.chunk
        if self.merge.single_chunk:
            self._drop([k for k in self._kept if k.chunk.stamp_ns < lead.stamp_ns])
        last = lead.horizon if self.lookahead else first + 1
        starts = [max(now_ns, lead.stamp_ns + k * lead.dt_ns) for k in range(first, last)]
        rows = np.stack([self._row(at_ns, leader) for at_ns in starts])
        reached = tuple(lead.reached_ns(k) for k in range(first, last))
        for kept in self.merge.contributors(self._kept, now_ns, leader):
            if id(kept) not in self._played:
                self._played.add(id(kept))
                self.counts.chunks_executed += 1
        self._record_action(now_ns, reached[0])
        return Command(
            at_ns=now_ns,
            rows=rows,
            reached_ns=reached,
            dt_ns=lead.dt_ns,
            joint_names=lead.joint_names,
            action_space=lead.action_space,
            frame_id=lead.frame_id,
        )

    def next_tick_ns(self, now_ns: int) -> int | None:
        """When the next tick is due after ``now_ns``: the end of the interval of the first
        action the leading chunk can still send (its end included, where a hold begins), or
        the start or take-over of a newer kept chunk if that comes first; None when nothing
        is kept."""
        due = [k.chunk.stamp_ns for k in self._kept if k.chunk.stamp_ns > now_ns]
        due += [k.takes_over_ns for k in self._kept if k.takes_over_ns > now_ns]
        leader, first = self._leading(now_ns)
        if leader is not None:
            due.append(leader.chunk.reached_ns(first))
        return min(due) if due else None

    def _leading(self, now_ns: int) -> tuple[Kept | None, int]:
        """The leading chunk at ``now_ns`` and its first action it can still send; when the
        merge mode's leader has none left (its last action is within the lead), a newer
        chunk that covers the time leads at once (rtc's take-over comes early rather than
        a hold); (None, 0) when no kept chunk can send anything."""
        leader = self.merge.leader(self._kept, now_ns)
        if leader is None:
            return None, 0
        first = self.first_playable(leader.chunk, now_ns)
        if first is not None:
            return leader, first
        for kept in reversed(self._kept):
            if kept.chunk.stamp_ns > leader.chunk.stamp_ns:
                first = self.first_playable(kept.chunk, now_ns)
                if first is not None and kept.chunk.index_at(now_ns) is not None:
                    return kept, first
        return None, 0

    def _row(self, at_ns: int, leader: Kept) -> np.ndarray:
        """The merged action at ``at_ns``; the leader's alone where it no longer covers."""
        if leader.chunk.index_at(at_ns) is None:
            return leader.chunk.actions[-1].copy()
        return self.merge.row(self._kept, at_ns, self.merge.leader(self._kept, at_ns) or leader)

    def _record_action(self, now_ns: int, target: int) -> None:
        """Count a command sent at ``now_ns``; time it when it sends a new action."""
        if self._hold_since_ns is not None:
            self._end_hold(now_ns)
        if target != self._last_target:
            if self._executing and self._last_action_ns is not None:
                self.action_periods.add((now_ns - self._last_action_ns) / 1e6)
            self._last_action_ns = now_ns
            self._last_target = target
        self.counts.actions_executed += 1
        self._executing = True

    def _enter_hold(self, now_ns: int) -> None:
        if self._executing:
            self.counts.holds += 1
            self._hold_since_ns = now_ns
        elif self._hold_since_ns is not None:
            self._update_hold(now_ns)
        self._executing = False

    def _update_hold(self, now_ns: int) -> None:
        self.counts.longest_hold_ns = max(self.counts.longest_hold_ns, self.hold_ns(now_ns))

    def _end_hold(self, now_ns: int) -> None:
        self._update_hold(now_ns)
        self.counts.held_ns += self.hold_ns(now_ns)
        self._hold_since_ns = None

    def _drop(self, kept: list[Kept]) -> None:
        for k in list(kept):
            if id(k) not in self._played:
                self.skip('superseded')
            self._played.discard(id(k))
            self._kept.remove(k)
