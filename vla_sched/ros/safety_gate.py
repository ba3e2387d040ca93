"""The safety gate: a chunk's actions checked against the measured joint state and the
robot's limits before the executor keeps it.

For the actions that can still be played (from the one covering the chunk's arrival on):

- ``position_limit``: every position within ``[lower, upper]``;
- ``start_jump``: the first of them at most ``velocity x T`` from the measured position,
  ``T`` the time until it is reached, at least ``dt``;
- ``velocity_limit``: ``|a[k+1] - a[k]| / dt`` at most the velocity limit;
- ``acceleration_limit``: ``|a[k+2] - 2 a[k+1] + a[k]| / dt^2`` at most the acceleration limit.

A chunk can be refused before any of these: ``no_joint_state`` (no measured position of one
of its joints yet), ``stale_joint_state`` (the last one received more than ``max_state_age``
ago on the executor's clock) and ``no_limits`` (a joint the limits do not name). Mode
``refuse`` refuses a chunk that fails a check; ``clip`` moves it within the limits (one
pass from the measured position: each step's velocity clipped, then its change of velocity,
then the position) and checks it again, refusing it if it still fails. Each chunk is counted
once per mode and reason, the first check it failed (``refused`` and ``clipped``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vla_sched.ros.chunk_executor import Chunk, GateVerdict
from vla_sched.ros.urdf_limits import JointLimits

GATE_MODES = ('off', 'clip', 'refuse')
INPUT_REASONS = ('no_joint_state', 'stale_joint_state', 'no_limits')
CHECK_REASONS = ('position_limit', 'start_jump', 'velocity_limit', 'acceleration_limit')
GATE_REASONS = INPUT_REASONS + CHECK_REASONS
_TOLERANCE = 1e-9  # of each bound, for float rounding


@dataclass(frozen=True, slots=True)
class Violation:
    """The first broken check: its reason and what broke it."""

    reason: str
    detail: str


def _bounds(names: tuple[str, ...], limits: dict[str, JointLimits]) -> dict[str, np.ndarray]:
    table = [limits[name] for name in names]
    return {
        field: np.array([getattr(lim, field) for lim in table], dtype=np.float64)
        for field in ('lower', 'upper', 'velocity', 'acceleration')
    }


def first_violation(
    rows: np.ndarray,
    names: tuple[str, ...],
    bounds: dict[str, np.ndarray],
    *,
    measured: np.ndarray,
    start_s: float,
    dt_s: float,
) -> Violation | None:
    """The first check ``rows`` (``[n, dof]``, the actions still to play) fails, or None."""
    lower, upper = bounds['lower'], bounds['upper']
    velocity, acceleration = bounds['velocity'], bounds['acceleration']
    outside = (rows < lower - _TOLERANCE) | (rows > upper + _TOLERANCE)
    if outside.any():
        k, j = np.argwhere(outside)[0]
        return Violation(
            'position_limit',
            f'{names[j]} {rows[k, j]:.4g} at action +{k} outside [{lower[j]:.4g}, {upper[j]:.4g}]',
        )
    jump = np.abs(rows[0] - measured)
    allowed = velocity * start_s
    if (jump > allowed + _TOLERANCE).any():
        j = int(np.argmax(jump - allowed))
        return Violation(
            'start_jump',
            f'{names[j]} jumps {jump[j]:.4g} from the measured {measured[j]:.4g} in '
            f'{start_s * 1e3:.0f} ms (at most {allowed[j]:.4g})',
        )
    speeds = np.diff(rows, axis=0) / dt_s
    fast = np.abs(speeds) > velocity + _TOLERANCE
    if fast.any():
        k, j = np.argwhere(fast)[0]
        return Violation(
            'velocity_limit',
            f'{names[j]} moves at {abs(speeds[k, j]):.4g}/s after action +{k} (at most '
            f'{velocity[j]:.4g})',
        )
    accelerations = np.diff(speeds, axis=0) / dt_s
    hard = np.abs(accelerations) > acceleration + _TOLERANCE
    if hard.any():
        k, j = np.argwhere(hard)[0]
        return Violation(
            'acceleration_limit',
            f'{names[j]} accelerates at {abs(accelerations[k, j]):.4g}/s^2 after action +{k} '
            f'(at most {acceleration[j]:.4g})',
        )
    return None


def clipped(
    rows: np.ndarray,
    bounds: dict[str, np.ndarray],
    *,
    measured: np.ndarray,
    start_s: float,
    dt_s: float,
) -> np.ndarray:
    """``rows`` moved within the limits in one pass from ``measured`` (see the module
    docstring); the result is to be checked again."""
    out = rows.copy()
    previous, speed = measured, None
    for k in range(len(out)):
        step_s = start_s if k == 0 else dt_s
        velocity = np.clip((out[k] - previous) / step_s, -bounds['velocity'], bounds['velocity'])
        if speed is not None:
            change = bounds['acceleration'] * dt_s
            velocity = np.clip(velocity, speed - change, speed + change)
        position = np.clip(previous + velocity * step_s, bounds['lower'], bounds['upper'])
        if k > 0:
            speed = (position - previous) / dt_s
        previous = out[k] = position
    return out


class SafetyGate:
    """The gate of one executor: its mode, the limits, the newest measured joint state and
    what it refused and clipped (by reason)."""

    def __init__(
        self, *, mode: str, limits: dict[str, JointLimits], max_state_age_ns: int
    ) -> None:
        if mode not in GATE_MODES:
            raise ValueError(f'unknown safety gate mode {mode!r}')
        self.mode = mode
        self.limits = dict(limits)
        self.max_state_age_ns = max_state_age_ns
        self.refused = dict.fromkeys(GATE_REASONS, 0)
        self.clipped = dict.fromkeys(CHECK_REASONS, 0)
        self.checked = 0
        self._positions: dict[str, float] = {}
        self._received_ns: dict[str, int] = {}

    @property
    def enabled(self) -> bool:
        return self.mode != 'off'

    def measure(self, names, positions, now_ns: int) -> None:
        """Record a joint state (sensor_msgs/JointState's names and positions) received at
        ``now_ns``; non-finite positions are left out."""
        for name, value in zip(names, positions, strict=False):
            if np.isfinite(value):
                self._positions[str(name)] = float(value)
                self._received_ns[str(name)] = now_ns

    def has_state(self, names) -> bool:
        """Whether a position of each of ``names`` was measured."""
        return all(name in self._positions for name in names)

    def __call__(self, chunk: Chunk, start: int, now_ns: int) -> GateVerdict:
        """The verdict on ``chunk``'s actions from ``start`` on, kept at ``now_ns``."""
        self.checked += 1
        names = chunk.joint_names
        refusal = self._input_refusal(names, now_ns)
        if refusal is not None:
            return self._refuse(refusal)
        rows = chunk.actions[start:]
        bounds = _bounds(names, self.limits)
        measured = np.array([self._positions[n] for n in names], dtype=np.float64)
        dt_s = chunk.dt_ns / 1e9
        start_s = max(dt_s, (chunk.reached_ns(start) - now_ns) / 1e9)
        timing = {'measured': measured, 'start_s': start_s, 'dt_s': dt_s}
        violation = first_violation(rows, names, bounds, **timing)
        if violation is None:
            return GateVerdict(chunk.actions)
        if self.mode == 'refuse':
            return self._refuse(violation)
        fixed = clipped(rows, bounds, **timing)
        again = first_violation(fixed, names, bounds, **timing)
        if again is not None:
            return self._refuse(Violation(again.reason, f'clipped, still: {again.detail}'))
        self.clipped[violation.reason] += 1
        return GateVerdict(np.concatenate([chunk.actions[:start], fixed]), violation.detail)

    def check_target(
        self, names: tuple[str, ...], target: np.ndarray, duration_s: float, now_ns: int
    ) -> GateVerdict:
        """The verdict on moving to ``target`` in ``duration_s`` (the safe position): within
        the position limits, and within the velocity limits from the measured position."""
        refusal = self._input_refusal(names, now_ns)
        if refusal is None:
            measured = np.array([self._positions[n] for n in names], dtype=np.float64)
            refusal = first_violation(
                target[None, :],
                names,
                _bounds(names, self.limits),
                measured=measured,
                start_s=duration_s,
                dt_s=duration_s,
            )
        if refusal is not None:
            return self._refuse(refusal)
        return GateVerdict(target[None, :])

    def _input_refusal(self, names: tuple[str, ...], now_ns: int) -> Violation | None:
        missing = [n for n in names if n not in self.limits]
        if missing:
            return Violation('no_limits', f'no limits for joints {missing}')
        unmeasured = [n for n in names if n not in self._positions]
        if unmeasured:
            return Violation('no_joint_state', f'no measured position of joints {unmeasured}')
        oldest = min(self._received_ns[n] for n in names)
        if now_ns - oldest > self.max_state_age_ns:
            return Violation(
                'stale_joint_state',
                f'joint state {(now_ns - oldest) / 1e9:.3f} s old (at most '
                f'{self.max_state_age_ns / 1e9:g} s)',
            )
        return None

    def _refuse(self, violation: Violation) -> GateVerdict:
        self.refused[violation.reason] += 1
        return GateVerdict(None, f'{violation.reason}: {violation.detail}')
