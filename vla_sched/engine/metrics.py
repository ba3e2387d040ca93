"""Counters and latency windows of the scheduler, for ``/diagnostics`` and benchmarks.

They answer a robot engineer's three questions: were steps retracted (total, in the last
window, per robot), does a new image make running robots' inter-token latency jump (ITL
windows per robot), and does the next step reuse the cached prefix (cache-hit tokens).
Times are integer nanoseconds of the scheduler's clock; windows report milliseconds.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field

import numpy as np


class LatencyWindow:
    """The last ``size`` latency samples (nanoseconds)."""

    def __init__(self, size: int) -> None:
        self._samples: deque[int] = deque(maxlen=size)

    def __len__(self) -> int:
        return len(self._samples)

    def add(self, ns: int) -> None:
        self._samples.append(int(ns))

    def percentile_ms(self, q: float) -> float:
        """The ``q``-th percentile (0-100) in milliseconds; 0.0 when empty."""
        if not self._samples:
            return 0.0
        return float(np.percentile(np.fromiter(self._samples, dtype=np.float64), q)) / 1e6

    def max_ms(self) -> float:
        return max(self._samples) / 1e6 if self._samples else 0.0


@dataclass
class RobotCounters:
    """Cumulative counters and latency windows of one robot."""

    window_size: int
    num_steps_done: int = 0
    num_deadline_misses: int = 0
    num_superseded: int = 0
    num_retracts: int = 0
    num_aborts: int = 0
    num_cached_prefix_tokens: int = 0
    num_prompt_tokens: int = 0
    ttft: LatencyWindow = field(init=False)
    itl: LatencyWindow = field(init=False)
    step_latency: LatencyWindow = field(init=False)

    def __post_init__(self) -> None:
        self.ttft = LatencyWindow(self.window_size)
        self.itl = LatencyWindow(self.window_size)
        self.step_latency = LatencyWindow(self.window_size)


class SchedulerMetrics:
    """Everything the scheduler counts.

    Args:
        window_size: samples per latency window.
        retract_window_ns: length of the sliding window of ``num_retracts_in_window``.
    """

    def __init__(self, *, window_size: int, retract_window_ns: int) -> None:
        self.window_size = window_size
        self.retract_window_ns = retract_window_ns
        self.num_waiting = 0
        self.num_running = 0
        self.chunked_rid = ''
        self.token_usage = 0.0
        self.new_token_ratio = 0.0
        self.num_retracts_total = 0
        self._retract_stamps: deque[int] = deque()
        self.aborts_by_reason: Counter[str] = Counter()
        self.num_delayed_prefills = 0
        self.num_preemptions = 0
        self.num_cached_tokens = 0
        self.num_prompt_tokens = 0
        self.num_prefill_batches = 0
        self.num_decode_batches = 0
        self.num_steps_done = 0
        self.ttft = LatencyWindow(window_size)
        self.itl = LatencyWindow(window_size)
        self.step_latency = LatencyWindow(window_size)
        self.service = LatencyWindow(window_size)  # admission to finish of completed steps
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
        if (robot := self._robot_of(robot_id)) is not None:
            robot.num_retracts += 1

    def num_retracts_in_window(self, now_ns: int) -> int:
        while self._retract_stamps and self._retract_stamps[0] <= now_ns - self.retract_window_ns:
            self._retract_stamps.popleft()
        return len(self._retract_stamps)

    def record_abort(self, robot_id: str | None, reason: str) -> None:
        self.aborts_by_reason[reason] += 1
        if (robot := self._robot_of(robot_id)) is not None:
            robot.num_aborts += 1
            if reason == 'superseded':
                robot.num_superseded += 1

    def record_deadline_miss(self, robot_id: str | None) -> None:
        if (robot := self._robot_of(robot_id)) is not None:
            robot.num_deadline_misses += 1

    def record_cache_hit(self, robot_id: str | None, cached: int, prompt: int) -> None:
        """A first admission matched ``cached`` of its ``prompt`` tokens in the tree."""
        self.num_cached_tokens += cached
        self.num_prompt_tokens += prompt
        if (robot := self._robot_of(robot_id)) is not None:
            robot.num_cached_prefix_tokens += cached
            robot.num_prompt_tokens += prompt

    def record_first_token(self, robot_id: str | None, ttft_ns: int) -> None:
        self.ttft.add(ttft_ns)
        if (robot := self._robot_of(robot_id)) is not None:
            robot.ttft.add(ttft_ns)

    def record_itl(self, robot_id: str | None, itl_ns: int) -> None:
        self.itl.add(itl_ns)
        if (robot := self._robot_of(robot_id)) is not None:
            robot.itl.add(itl_ns)

    def record_step_done(self, robot_id: str | None, latency_ns: int) -> None:
        self.num_steps_done += 1
        self.step_latency.add(latency_ns)
        if (robot := self._robot_of(robot_id)) is not None:
            robot.num_steps_done += 1
            robot.step_latency.add(latency_ns)

    def record_service(self, service_ns: int) -> None:
        """A completed step took ``service_ns`` from its first admission to its finish."""
        self.service.add(service_ns)

    @property
    def cache_hit_rate(self) -> float:
        """Cached prompt tokens / prompt tokens over first admissions."""
        return self.num_cached_tokens / self.num_prompt_tokens if self.num_prompt_tokens else 0.0
