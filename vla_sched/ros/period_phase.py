"""When a ``periodic`` robot's steps fire: on its own phase of its period.

Each robot is given a phase, a fraction of its period (the node spreads them by robot index:
robot ``i`` of ``n`` at ``i / n``), and fires at the times ``phase * period + k * period``
of the clock (``k`` whole). A step taken a little late (a timer's latency) does not move the
next one off the grid. After a stall (a step that came back late, a node that could not run)
the robot does not fire at once, as every robot stalled with it would: once its due time is
more than ``PHASE_TOLERANCE`` of a period past, it fires at its next phase time, so the robots'
steps stay spread across the period instead of locking into one phase for good.

The robot's first step fires when its first observation is ready; its phase holds from the
second on.
"""

from __future__ import annotations

PHASE_TOLERANCE = 0.25  # of a period: how late a due step still fires at once


class PeriodSchedule:
    """The due times of one periodic robot (see the module docstring).

    Args:
        period_ns: the robot's period.
        phase: its phase, a fraction of the period in [0, 1).
    """

    def __init__(self, period_ns: int, *, phase: float = 0.0) -> None:
        if not 0.0 <= phase < 1.0:
            raise ValueError(f'phase must be in [0, 1), got {phase}')
        if period_ns <= 0:
            raise ValueError(f'period_ns must be positive, got {period_ns}')
        self.period_ns = period_ns
        self.phase = phase
        self.next_due_ns: int | None = None  # None: due now (no step taken yet)
        self.num_realigned = 0  # stalls after which the robot went back to its phase

    @property
    def phase_ns(self) -> int:
        return round(self.phase * self.period_ns)

    def set_period(self, period_ns: int) -> None:
        if period_ns <= 0:
            raise ValueError(f'period_ns must be positive, got {period_ns}')
        self.period_ns = period_ns

    def phase_time_after(self, t_ns: int) -> int:
        """The first of the robot's phase times strictly after ``t_ns``."""
        k = (t_ns - self.phase_ns) // self.period_ns + 1
        return self.phase_ns + k * self.period_ns

    def is_due(self, now_ns: int) -> bool:
        """Whether the robot's period has come at ``now_ns``. A due time more than
        ``PHASE_TOLERANCE`` of a period past is moved to the robot's phase: the latest phase
        time if that is within the tolerance (due now), else the next one."""
        due = self.next_due_ns
        if due is None:
            return True
        if now_ns < due:
            return False
        tolerance_ns = self.period_ns * PHASE_TOLERANCE
        if now_ns - due <= tolerance_ns:
            return True
        latest = self.phase_time_after(now_ns) - self.period_ns
        self.num_realigned += 1
        if now_ns - latest <= tolerance_ns:
            self.next_due_ns = latest
            return True
        self.next_due_ns = latest + self.period_ns
        return False

    def advance(self, now_ns: int) -> None:
        """A step was taken at ``now_ns``: the next is due at the next phase time."""
        self.next_due_ns = self.phase_time_after(now_ns)
