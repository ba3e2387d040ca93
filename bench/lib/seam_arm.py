"""A simulated joint-space arm behind a JointTrajectoryController, for the seam benchmark.

Each command the chunk executor sends (one point: ``row`` reached at ``reached_ns``) starts a
linear trajectory from the controller's current setpoint to ``row``, reached at
``reached_ns``, then held, as JointTrajectoryController interpolates a one-point trajectory.
The arm follows the setpoint at the control rate through a first-order lag of time constant
``tau_ns`` (0: a perfect tracker). A command takes effect at the first control cycle at or
after it is sent. Times are a simulated clock in nanoseconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from bench.lib.stats import percentile


@dataclass(frozen=True, slots=True)
class MotionStats:
    """Percentiles of the executed motion's norm over the joints (per second, cubed for jerk)."""

    velocity_p50: float
    velocity_p99: float
    velocity_max: float
    jerk_p50: float
    jerk_p99: float
    jerk_max: float
    num_samples: int


class SimulatedArm:
    """The arm's position at each control cycle (``times_ns``, ``positions``)."""

    def __init__(
        self, position: np.ndarray, *, start_ns: int, control_period_ns: int, tau_ns: int
    ) -> None:
        if control_period_ns <= 0 or tau_ns < 0:
            raise ValueError(f'control period {control_period_ns} ns, tau {tau_ns} ns')
        self.control_period_ns = control_period_ns
        self.alpha = 1.0 if tau_ns == 0 else -math.expm1(-control_period_ns / tau_ns)
        self.position = np.asarray(position, np.float64).copy()
        self.now_ns = start_ns
        self._from = self.position.copy()  # the trajectory being followed
        self._to = self.position.copy()
        self._sent_ns = start_ns
        self._reached_ns = start_ns
        self.times_ns: list[int] = [start_ns]
        self.positions: list[np.ndarray] = [self.position.copy()]

    def setpoint_at(self, at_ns: int) -> np.ndarray:
        """The controller's setpoint at ``at_ns`` (on the current trajectory)."""
        span = self._reached_ns - self._sent_ns
        if span <= 0 or at_ns >= self._reached_ns:
            return self._to.copy()
        fraction = max(0.0, (at_ns - self._sent_ns) / span)
        return self._from + fraction * (self._to - self._from)

    def command(self, row: np.ndarray, *, sent_ns: int, reached_ns: int) -> None:
        """A one-point trajectory: ``row`` reached at ``reached_ns``, from the setpoint now."""
        self.advance(sent_ns)
        self._from = self.setpoint_at(sent_ns)
        self._to = np.asarray(row, np.float64).copy()
        self._sent_ns, self._reached_ns = sent_ns, reached_ns

    def advance(self, until_ns: int) -> None:
        """Run the control cycles up to ``until_ns``."""
        while self.now_ns + self.control_period_ns <= until_ns:
            self.now_ns += self.control_period_ns
            target = self.setpoint_at(self.now_ns)
            self.position += self.alpha * (target - self.position)
            self.times_ns.append(self.now_ns)
            self.positions.append(self.position.copy())

    def motion(self, since_ns: int) -> MotionStats:
        """Velocity and jerk of the cycles from ``since_ns`` on (finite differences)."""
        times = np.asarray(self.times_ns)
        positions = np.stack(self.positions)[times >= since_ns]
        h = self.control_period_ns / 1e9
        velocity = np.linalg.norm(np.diff(positions, axis=0), axis=1) / h
        jerk = np.linalg.norm(np.diff(positions, n=3, axis=0), axis=1) / h**3
        return MotionStats(
            velocity_p50=percentile(velocity, 50),
            velocity_p99=percentile(velocity, 99),
            velocity_max=float(velocity.max()) if velocity.size else math.nan,
            jerk_p50=percentile(jerk, 50),
            jerk_p99=percentile(jerk, 99),
            jerk_max=float(jerk.max()) if jerk.size else math.nan,
            num_samples=int(positions.shape[0]),
        )
