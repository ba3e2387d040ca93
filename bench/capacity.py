"""Capacity: the most robots a server serves at their control rate, found by stepping up.

A robot count passes when, over the measured span, the robots get at least
``min_rate_share`` of their target action rate, at least ``min_on_time_share`` of the steps
that ended did so on time (delivered before their deadline, not refused), and the p99
latency (image stamp to actions) is at most ``max_p99_ms``. ``search_capacity`` measures the
counts in increasing order and stops once ``max_failures_in_row`` counts in a row failed (or
the counts run out); with ``refine`` it then measures the counts between the largest pass and
the next failed count one by one, up to the first that fails. The capacity is the largest
count that passed (0: none passed).

The control loop through ROS (``bench/control_loop.py --capacity``) and the projection on a
simulated GPU (``bench/capacity_projection.py``) judge by these same rules. No ROS here.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any

# Robot counts to step through (``robot_ladder`` cuts it at a maximum).
ROBOT_LADDER = (1, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 24, 28, 32, 40, 48, 56, 64)


def robot_ladder(max_robots: int) -> tuple[int, ...]:
    """The ladder's counts up to ``max_robots`` (which is added if it is not a rung)."""
    if max_robots < 1:
        raise ValueError(f'max_robots must be >= 1, got {max_robots}')
    counts = [n for n in ROBOT_LADDER if n <= max_robots]
    if counts[-1] != max_robots:
        counts.append(max_robots)
    return tuple(counts)


@dataclass(frozen=True, slots=True)
class CapacityCriteria:
    """When a robot count counts as served."""

    min_rate_share: float = 0.99  # of the target action rate
    min_on_time_share: float = 0.99  # of the steps that ended
    max_p99_ms: float = 250.0  # image stamp to actions

    def __post_init__(self) -> None:
        for name in ('min_rate_share', 'min_on_time_share'):
            if not 0.0 < getattr(self, name) <= 1.0:
                raise ValueError(f'{name} must be in (0, 1], got {getattr(self, name)}')
        if not self.max_p99_ms > 0:
            raise ValueError(f'max_p99_ms must be > 0, got {self.max_p99_ms}')

    def failures(self, measure: CapacityMeasure) -> tuple[str, ...]:
        """What ``measure`` misses, in words; empty when it passes (NaN never passes)."""
        out = []
        if not measure.rate_share >= self.min_rate_share:
            out.append(f'rate {_percent(measure.rate_share)} < {_percent(self.min_rate_share)}')
        if not measure.on_time_share >= self.min_on_time_share:
            out.append(
                f'on time {_percent(measure.on_time_share)} < {_percent(self.min_on_time_share)}'
            )
        if not measure.latency_ms_p99 <= self.max_p99_ms:
            out.append(f'p99 {measure.latency_ms_p99:.1f} ms > {self.max_p99_ms:g} ms')
        return tuple(out)

    def describe(self) -> str:
        return (
            f'>= {_percent(self.min_rate_share)} of the target action rate, '
            f'>= {_percent(self.min_on_time_share)} of steps on time, '
            f'p99 latency <= {self.max_p99_ms:.0f} ms'
        )


@dataclass(frozen=True, slots=True)
class CapacityMeasure:
    """What the criteria look at: one system at one robot count."""

    num_robots: int
    rate_share: float  # delivered action rate over the target
    on_time_share: float  # steps delivered before their deadline over the steps that ended
    latency_ms_p50: float
    latency_ms_p99: float


@dataclass(frozen=True, slots=True)
class CapacityStep:
    """One measured count and what it missed."""

    measure: CapacityMeasure
    failures: tuple[str, ...]

    @property
    def passed(self) -> bool:
        return not self.failures


@dataclass(frozen=True, slots=True)
class CapacitySearch:
    """The counts one system was measured at, in order, and its capacity."""

    system: str
    steps: tuple[CapacityStep, ...]

    @property
    def capacity(self) -> int:
        return max((s.measure.num_robots for s in self.steps if s.passed), default=0)

    @property
    def one_robot(self) -> CapacityMeasure | None:
        return next((s.measure for s in self.steps if s.measure.num_robots == 1), None)

    def row(self) -> dict[str, Any]:
        return {
            'system': self.system,
            'capacity': self.capacity,
            'steps': [{**asdict(s.measure), 'failures': list(s.failures)} for s in self.steps],
        }


def search_capacity(
    system: str,
    counts: Iterable[int],
    measure: Callable[[int], CapacityMeasure],
    criteria: CapacityCriteria,
    *,
    max_failures_in_row: int = 2,
    refine: bool = False,
    on_step: Callable[[CapacityStep], None] | None = None,
) -> CapacitySearch:
    """Measure ``counts`` in increasing order until ``max_failures_in_row`` fail in a row;
    with ``refine``, then the counts skipped between the largest pass and the next failure."""
    if max_failures_in_row < 1:
        raise ValueError(f'max_failures_in_row must be >= 1, got {max_failures_in_row}')
    steps: list[CapacityStep] = []

    def take(num_robots: int) -> CapacityStep:
        result = measure(num_robots)
        step = CapacityStep(result, criteria.failures(result))
        steps.append(step)
        if on_step is not None:
            on_step(step)
        return step

    failures_in_row = 0
    for num_robots in sorted(set(counts)):
        failures_in_row = 0 if take(num_robots).passed else failures_in_row + 1
        if failures_in_row >= max_failures_in_row:
            break
    if refine:
        capacity = CapacitySearch(system, tuple(steps)).capacity
        failed = [s.measure.num_robots for s in steps if s.measure.num_robots > capacity]
        for num_robots in range(capacity + 1, min(failed, default=capacity + 1)):
            if not take(num_robots).passed:
                break
    return CapacitySearch(system, tuple(steps))


def headline_table(searches: list[CapacitySearch], *, unit: str = 'robots') -> str:
    """Each system's capacity and its 1-robot latency."""
    lines = [
        f'| system | capacity ({unit}) | 1 robot p50 ms | 1 robot p99 ms | next count failed on |',
        '|---|---|---|---|---|',
    ]
    for search in searches:
        one = search.one_robot
        p50 = _ms(one.latency_ms_p50) if one else 'n/a'
        p99 = _ms(one.latency_ms_p99) if one else 'n/a'
        above = [s for s in search.steps if s.measure.num_robots > search.capacity]
        first = min(above, key=lambda s: s.measure.num_robots, default=None)
        stop = (
            f'{first.measure.num_robots}: {"; ".join(first.failures)}'
            if first is not None
            else 'no count failed'
        )
        lines.append(f'| {search.system} | {search.capacity} | {p50} | {p99} | {stop} |')
    return '\n'.join(lines)


def steps_table(searches: list[CapacitySearch]) -> str:
    """Every measured count of every system."""
    lines = [
        '| system | robots | rate | on time | p50 ms | p99 ms | verdict |',
        '|---|---|---|---|---|---|---|',
    ]
    for search in searches:
        for step in sorted(search.steps, key=lambda s: s.measure.num_robots):
            m = step.measure
            verdict = 'pass' if step.passed else 'fail: ' + '; '.join(step.failures)
            lines.append(
                f'| {search.system} | {m.num_robots} | {_percent(m.rate_share)} '
                f'| {_percent(m.on_time_share)} | {_ms(m.latency_ms_p50)} '
                f'| {_ms(m.latency_ms_p99)} | {verdict} |'
            )
    return '\n'.join(lines)


def _percent(share: float) -> str:
    return 'n/a' if math.isnan(share) else f'{100 * share:.1f}%'


def _ms(value: float) -> str:
    return 'n/a' if math.isnan(value) else f'{value:.0f}'
