"""Sliding windows for the node's health numbers: latency percentiles and event rates.

Times are integer nanoseconds passed in by the caller, so everything here is testable with a
fake clock.
"""

from __future__ import annotations

from collections import deque

import numpy as np


class MsLatencyWindow:
    """The last ``capacity`` latencies (ms) and their percentiles."""

    def __init__(self, capacity: int = 256) -> None:
        if capacity < 1:
            raise ValueError(f'capacity must be >= 1, got {capacity}')
        self._values: deque[float] = deque(maxlen=capacity)

    def add(self, value_ms: float) -> None:
        self._values.append(float(value_ms))

    def __len__(self) -> int:
        return len(self._values)

    def percentile(self, q: float) -> float:
        """The ``q``-th percentile (0..100), or NaN when empty."""
        if not self._values:
            return float('nan')
        return float(np.percentile(np.fromiter(self._values, dtype=np.float64), q))


class EventWindow:
    """Times of recent events, to count them and rate them over the last ``window_ns``."""

    def __init__(self, window_ns: int) -> None:
        if window_ns <= 0:
            raise ValueError(f'window_ns must be > 0, got {window_ns}')
        self.window_ns = int(window_ns)
        self._times: deque[int] = deque()

    def add(self, now_ns: int) -> None:
        self._times.append(int(now_ns))

    def count(self, now_ns: int) -> int:
        """Events in ``(now - window, now]``."""
        self._prune(now_ns)
        return len(self._times)

    def rate_hz(self, now_ns: int, *, since_ns: int | None = None) -> float:
        """Events per second over the window, or over ``[since_ns, now]`` if that is shorter."""
        span_ns = self.window_ns
        if since_ns is not None:
            span_ns = min(span_ns, max(0, now_ns - since_ns))
        if span_ns <= 0:
            return 0.0
        return self.count(now_ns) * 1e9 / span_ns

    def clear(self) -> None:
        self._times.clear()

    def _prune(self, now_ns: int) -> None:
        cutoff = now_ns - self.window_ns
        while self._times and self._times[0] <= cutoff:
            self._times.popleft()


class CountingThrottle:
    """At most one report per ``interval_ns``, each with the number of events since the last.

    ``add`` counts an event and ``due`` hands out the count (then resets it) when a report
    may be made; events that came too soon wait for a later ``add`` or ``due``.
    """

    def __init__(self, interval_ns: int) -> None:
        if interval_ns <= 0:
            raise ValueError(f'interval_ns must be > 0, got {interval_ns}')
        self.interval_ns = int(interval_ns)
        self.num_pending = 0
        self._last_report_ns: int | None = None

    def add(self, now_ns: int) -> int:
        """Count one event; the number to report now (0: none yet)."""
        self.num_pending += 1
        return self.due(now_ns)

    def due(self, now_ns: int) -> int:
        """Events to report now: 0 when there are none or the last report was too recent."""
        if self.num_pending == 0:
            return 0
        last = self._last_report_ns
        if last is not None and now_ns - last < self.interval_ns:
            return 0
        count, self.num_pending, self._last_report_ns = self.num_pending, 0, int(now_ns)
        return count
