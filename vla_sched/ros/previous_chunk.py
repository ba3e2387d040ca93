"""A real-time-chunking robot's previous chunk, as its next step carries it.

The node keeps the last chunk it published for the robot (its actions and image stamp).
Action ``j`` of a chunk stamped ``t`` covers ``[t + j dt, t + (j + 1) dt)``, so for a step
whose image is stamped ``s`` the actions still to run at that step's action times start at
``round((s - t) / dt)``; a chunk that ends before ``s`` leaves none. The inference delay is
how many of the new chunk's actions will have run before it arrives: the robot's measured
latency from image stamp to publish (its 95th percentile) in actions, rounded up and capped
at the chunk.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

NO_ACTIONS = np.zeros((0, 0), np.float32)
DELAY_PERCENTILE = 95.0


@dataclass(frozen=True, slots=True, eq=False)
class PublishedChunk:
    """A chunk the node published: its image stamp and float32 ``[H, dof]`` actions."""

    stamp_ns: int
    actions: np.ndarray

    def remaining_at(self, stamp_ns: int, *, dt_s: float) -> np.ndarray:
        """The actions still to run at the times of a step stamped ``stamp_ns`` (row ``k``
        at that step's action ``k``), or none."""
        offset = round((stamp_ns - self.stamp_ns) / (dt_s * 1e9))
        if offset < 0 or offset >= self.actions.shape[0]:
            return NO_ACTIONS
        return np.ascontiguousarray(self.actions[offset:], dtype=np.float32)


def inference_delay(latency_ms: float, *, dt_s: float, horizon: int) -> int:
    """Actions that run before a chunk arrives, from a latency (NaN: not measured yet: 0)."""
    if not math.isfinite(latency_ms) or latency_ms <= 0:
        return 0
    return min(horizon, math.ceil(latency_ms / 1000.0 / dt_s))
