"""Counters and latency windows of the scheduler, for the engine's stats and benchmarks.

They answer a robot engineer's three questions: were steps retracted (total, in the last
window, per robot), does a new image make running robots' inter-token latency jump (ITL
windows per robot and in total), and does the next step reuse the cached prefix
(cache-hit tokens). Times are integer nanoseconds of the scheduler's clock; windows report
milliseconds.

Only events are counted here. What the scheduler holds at an instant (queue depth, running
batch, chunked request, KV use) is read from the scheduler itself when a snapshot is taken.

Latency windows name their two ends:
    ``ttft``: first ``add_request`` to the first output token;
    ``itl``: one output token to the next;
    ``arrival_to_finish``: first ``add_request`` to the finish of a completed step;
    ``admitted_to_finish``: first admission to the finish of a completed step.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field

import numpy as np

from vla_sched.core.scheduling.pass_cost import PassCostModel


class LatencyWindow:
    """The last ``size`` latency samples (nanoseconds).

    The samples live in one ``int64`` ring allocated up front, so a window's memory is fixed
    from its first sample on: a long-running engine's windows do not grow while they fill
    (a deque of Python ints grows by about 40 bytes per sample until it is full).
    """

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f'size must be >= 1, got {size}')
        self._ring = np.zeros(size, dtype=np.int64)
        self._num_samples = 0  # ever added; the newest is at (_num_samples - 1) % size

    def __len__(self) -> int:
        return min(self._num_samples, self._ring.size)

    def add(self, ns: int) -> None:
        self._ring[self._num_samples % self._ring.size] = ns
        self._num_samples += 1

    def samples(self) -> np.ndarray:
        """The kept samples, oldest first (a copy)."""
        size = self._ring.size
        if self._num_samples <= size:
            return self._ring[: self._num_samples].copy()
        start = self._num_samples % size
        return np.concatenate((self._ring[start:], self._ring[:start]))

    def percentile_ms(self, q: float) -> float:
        """The ``q``-th percentile (0-100) in milliseconds; NaN when empty (no sample is not
        a latency of zero: ``/diagnostics`` shows it as n/a)."""
        if not self._num_samples:
            return float('nan')
        kept = self._ring[: len(self)].astype(np.float64)
        return float(np.percentile(kept, q)) / 1e6

    def max_ms(self) -> float:
        """The largest sample in milliseconds; NaN when empty."""
        return int(self._ring[: len(self)].max()) / 1e6 if self._num_samples else float('nan')


@dataclass
class RobotCounters:
    """Cumulative counters and latency windows of one robot.

    ``num_cached_tokens`` sums, over the robot's first admissions, the prompt tokens found
    in the radix cache.
    """

    window_size: int
    num_steps_done: int = 0
    num_deadline_misses: int = 0
    num_superseded: int = 0
    num_retracts: int = 0
    num_cached_tokens: int = 0
    ttft: LatencyWindow = field(init=False)
    itl: LatencyWindow = field(init=False)
    arrival_to_finish: LatencyWindow = field(init=False)

    def __post_init__(self) -> None:
        self.ttft = LatencyWindow(self.window_size)
        self.itl = LatencyWindow(self.window_size)
        self.arrival_to_finish = LatencyWindow(self.window_size)


class SchedulerMetrics:
    """Everything the scheduler counts.

    Args:
        window_size: samples per latency window.
        retract_window_ns: length of the sliding window of ``num_retracts_in_window``.
    """

    def __init__(self, *, window_size: int, retract_window_ns: int) -> None:
        self.window_size = window_size
        self.retract_window_ns = retract_window_ns
        self.num_retracts_total = 0
        self._retract_stamps: deque[int] = deque()
        self.aborts_by_reason: Counter[str] = Counter()
        self.num_delayed_prefills = 0
        self.num_preemptions = 0
        self.num_deadline_waits = 0  # a step left for a later pass to keep deadlines
        self.pass_cost = PassCostModel()  # measured pass costs (``pass_cost``)
        self.num_cached_tokens = 0
        self.num_prompt_tokens = 0
        self.itl = LatencyWindow(window_size)
        self.arrival_to_finish = LatencyWindow(window_size)
        self.admitted_to_finish = LatencyWindow(window_size)
        self.robots: dict[str, RobotCounters] = {}

    def robot(self, robot_id: str) -> RobotCounters:
        counters = self.robots.get(robot_id)
        if counters is None:
            counters = self.robots[robot_id] = RobotCounters(self.window_size)
        return counters

    def _robot_of(self, robot_id: str | None) -> RobotCounters | None:
        return None if robot_id is None else self.robot(robot_id)

    # ---- events ----------------------------------------------------------------------

    def record_retract(self, robot_id: str | None, now_ns: int) -> None:
        self.num_retracts_total += 1
        self._retract_stamps.append(now_ns)
        self.num_retracts_in_window(now_ns)  # drop stamps past the window: bounded by it
        if (robot := self._robot_of(robot_id)) is not None:
            robot.num_retracts += 1

    def num_retracts_in_window(self, now_ns: int) -> int:
        while self._retract_stamps and self._retract_stamps[0] <= now_ns - self.retract_window_ns:
            self._retract_stamps.popleft()
        return len(self._retract_stamps)

    def record_abort(self, robot_id: str | None, reason: str) -> None:
        self.aborts_by_reason[reason] += 1
        robot = self._robot_of(robot_id)
        if robot is not None and reason == 'superseded':
            robot.num_superseded += 1

    def record_deadline_miss(self, robot_id: str | None) -> None:
        if (robot := self._robot_of(robot_id)) is not None:
            robot.num_deadline_misses += 1

    def record_cache_hit(self, robot_id: str | None, cached: int, prompt: int) -> None:
        """A first admission matched ``cached`` of its ``prompt`` tokens in the tree."""
        self.num_cached_tokens += cached
        self.num_prompt_tokens += prompt
        if (robot := self._robot_of(robot_id)) is not None:
            robot.num_cached_tokens += cached

    def record_first_token(self, robot_id: str | None, arrival_to_first_token_ns: int) -> None:
        if (robot := self._robot_of(robot_id)) is not None:
            robot.ttft.add(arrival_to_first_token_ns)

    def record_itl(self, robot_id: str | None, itl_ns: int) -> None:
        self.itl.add(itl_ns)
        if robot_id is not None:
            self.robot(robot_id).itl.add(itl_ns)

    def record_step_done(self, robot_id: str | None, arrival_to_finish_ns: int) -> None:
        """A step completed ``arrival_to_finish_ns`` after its first ``add_request``."""
        self.arrival_to_finish.add(arrival_to_finish_ns)
        if (robot := self._robot_of(robot_id)) is not None:
            robot.num_steps_done += 1
            robot.arrival_to_finish.add(arrival_to_finish_ns)

    def record_admitted_to_finish(self, admitted_to_finish_ns: int) -> None:
        """A completed step took ``admitted_to_finish_ns`` from its first admission."""
        self.admitted_to_finish.add(admitted_to_finish_ns)

    @property
    def cache_hit_rate(self) -> float:
        """Cached prompt tokens / prompt tokens over first admissions."""
        return self.num_cached_tokens / self.num_prompt_tokens if self.num_prompt_tokens else 0.0
