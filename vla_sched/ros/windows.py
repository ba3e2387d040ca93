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

    def _prune(self, now_ns: int) -> None:
        cutoff = now_ns - self.window_ns
        while self._times and self._times[0] <= cutoff:
            self._times.popleft()
