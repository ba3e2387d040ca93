"""Deterministic camera frames for simulated robots, benchmarks and tests (no ROS needed)."""

from __future__ import annotations

import numpy as np


def synthetic_frame(index: int, *, width: int, height: int) -> np.ndarray:
    """A deterministic RGB frame: a gradient with a square that moves with ``index``."""
    ys, xs = np.mgrid[0:height, 0:width]
    frame = np.empty((height, width, 3), dtype=np.uint8)
    frame[..., 0] = (xs * 255 // max(1, width - 1)).astype(np.uint8)
    frame[..., 1] = (ys * 255 // max(1, height - 1)).astype(np.uint8)
    frame[..., 2] = (index * 7) % 256
    side = max(2, min(width, height) // 4)
    x0 = (index * 3) % max(1, width - side)
    y0 = (index * 2) % max(1, height - side)
    frame[y0 : y0 + side, x0 : x0 + side] = (255, 255, 255)
    return frame
