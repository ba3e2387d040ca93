"""Capacity: the most robots a server serves at their control rate, and the one search for it.

One rule for every driver (through ROS, the engine core without ROS, the simulated GPU): a
robot count passes when, over the judged span, the robots get at least ``min_rate_share`` of
their target action rate and at least ``min_on_time_share`` of the steps that ended did so
within their deadline (a late result or a refusal is not on time). Latency percentiles are
measured and reported beside it, not judged: the deadline is the latency bound.

``search_capacity`` measures the counts in increasing order and stops once
``max_failures_in_row`` counts in a row failed (or the counts run out); with ``refine`` it
then measures the counts between the largest pass and the next failed count one by one, up
to the first that fails. The capacity is the largest count that passed (0: none passed).

``bisect_capacity`` finds the same largest count in fewer measurements where passing is
monotone in the count (every count below a pass passes): one robot first, then an optional
first probe (the target, say), then halving the span between the largest pass and the
smallest failure; for a run with a time limit (the prepared GPU run's serving part).

``judge`` turns how each step ended (``StepEnd``) into the ``CapacityMeasure`` of a window,
for the drivers that see every step (the engine core driven in-process, the simulator).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from bench.lib.stats import percentile
from bench.lib.tables import markdown_table

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
class CapacityMeasure:
    """What the criteria look at: one system at one robot count."""

    num_robots: int
    rate_share: float  # delivered action rate over the target
    on_time_share: float  # steps delivered within their deadline over the steps that ended
    latency_ms_p50: float  # image stamp to actions, reported, not judged
    latency_ms_p99: float


@dataclass(frozen=True, slots=True)
class CapacityCriteria:
    """When a robot count counts as served."""

    min_rate_share: float = 0.99  # of the target action rate
    min_on_time_share: float = 0.99  # of the steps that ended

    def __post_init__(self) -> None:
        for name in ('min_rate_share', 'min_on_time_share'):
            if not 0.0 < getattr(self, name) <= 1.0:
                raise ValueError(f'{name} must be in (0, 1], got {getattr(self, name)}')

    def failures(self, measure: CapacityMeasure) -> tuple[str, ...]:
        """What ``measure`` misses, in words; empty when it passes (NaN never passes)."""
        out = []
        if not measure.rate_share >= self.min_rate_share:
            out.append(f'rate {_percent(measure.rate_share)} < {_percent(self.min_rate_share)}')
        if not measure.on_time_share >= self.min_on_time_share:
            out.append(
                f'on time {_percent(measure.on_time_share)} < {_percent(self.min_on_time_share)}'
            )
        return tuple(out)

    def describe(self) -> str:
        return (
            f'>= {_percent(self.min_rate_share)} of the target action rate and '
            f'>= {_percent(self.min_on_time_share)} of steps within their deadline'
        )


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

    @property
    def first_failure_above(self) -> CapacityStep | None:
        """The smallest measured count above the capacity (it failed), if any."""
        above = [s for s in self.steps if s.measure.num_robots > self.capacity]
        return min(above, key=lambda s: s.measure.num_robots, default=None)

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


def bisect_capacity(
    system: str,
    max_robots: int,
    measure: Callable[[int], CapacityMeasure],
    criteria: CapacityCriteria,
    *,
    first_probe: int | None = None,
    on_step: Callable[[CapacityStep], None] | None = None,
) -> CapacitySearch:
    """The largest count up to ``max_robots`` that passes, by bisection (see the module
    doc): 1 robot, then ``first_probe`` if it lies in (1, max_robots], then the midpoints;
    about log2(max_robots) + 2 measurements. Stops at once when 1 robot fails."""
    if max_robots < 1:
        raise ValueError(f'max_robots must be >= 1, got {max_robots}')
    steps: list[CapacityStep] = []

    def passes(num_robots: int) -> bool:
        result = measure(num_robots)
        step = CapacityStep(result, criteria.failures(result))
        steps.append(step)
        if on_step is not None:
            on_step(step)
        return step.passed

    if passes(1):
        largest_pass, smallest_failure = 1, max_robots + 1
        probe = first_probe if first_probe is not None and 1 < first_probe <= max_robots else None
        while smallest_failure - largest_pass > 1:
            count = probe if probe is not None else (largest_pass + smallest_failure) // 2
            probe = None
            if passes(count):
                largest_pass = count
            else:
                smallest_failure = count
    return CapacitySearch(system, tuple(steps))


@dataclass(frozen=True, slots=True)
class StepEnd:
    """How one robot step ended (nanoseconds on the driver's clock)."""

    robot: int
    stamp_ns: int  # the image's
    end_ns: int
    delivered: bool  # actions came back (late or not)
    deadline_ns: int

    @property
    def on_time(self) -> bool:
        return self.delivered and self.end_ns <= self.deadline_ns


def judge(
    ends: Sequence[StepEnd], num_robots: int, window: tuple[int, int], num_images: int
) -> CapacityMeasure:
    """The window's measure: delivered steps over the ``num_images`` images stamped in
    ``window`` (a robot delivers one step per image at full rate), on-time steps over the
    steps that ended, latency percentiles of the delivered ones (image stamp to end)."""
    in_window = [e for e in ends if window[0] <= e.stamp_ns < window[1]]
    latencies = [(e.end_ns - e.stamp_ns) / 1e6 for e in in_window if e.delivered]
    return CapacityMeasure(
        num_robots=num_robots,
        rate_share=len(latencies) / num_images if num_images else math.nan,
        on_time_share=(
            sum(e.on_time for e in in_window) / len(in_window) if in_window else math.nan
        ),
        latency_ms_p50=percentile(latencies, 50),
        latency_ms_p99=percentile(latencies, 99),
    )


def headline_table(searches: Sequence[CapacitySearch], *, unit: str = 'robots') -> str:
    """Each system's capacity, its 1-robot latency and what the next count failed on."""
    rows = []
    for search in searches:
        one = search.one_robot
        first = search.first_failure_above
        stop = (
            f'{first.measure.num_robots}: {"; ".join(first.failures)}'
            if first is not None
            else 'no count failed'
        )
        rows.append(
            [
                search.system,
                search.capacity,
                _ms(one.latency_ms_p50) if one else 'n/a',
                _ms(one.latency_ms_p99) if one else 'n/a',
                stop,
            ]
        )
    headers = ['system', f'capacity ({unit})', '1 robot p50 ms', '1 robot p99 ms']
    return markdown_table([*headers, 'next count failed on'], rows)


def steps_table(searches: Sequence[CapacitySearch]) -> str:
    """Every measured count of every system."""
    rows = []
    for search in searches:
        for step in sorted(search.steps, key=lambda s: s.measure.num_robots):
            m = step.measure
            verdict = 'pass' if step.passed else 'fail: ' + '; '.join(step.failures)
            rows.append(
                [
                    search.system,
                    m.num_robots,
                    _percent(m.rate_share),
                    _percent(m.on_time_share),
                    _ms(m.latency_ms_p50),
                    _ms(m.latency_ms_p99),
                    verdict,
                ]
            )
    headers = ['system', 'robots', 'rate', 'on time', 'p50 ms', 'p99 ms', 'verdict']
    return markdown_table(headers, rows)


def _percent(share: float) -> str:
    return 'n/a' if math.isnan(share) else f'{100 * share:.1f}%'


def _ms(value: float) -> str:
    return 'n/a' if math.isnan(value) else f'{value:.0f}'
