"""Percentiles of measured samples: an empty window has no percentile (NaN, shown as n/a)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) of ``values``, or NaN for no values.

    An empty window is never 0: a benchmark that measured nothing must not read as fast.
    """
    if not 0.0 <= q <= 100.0:
        raise ValueError(f'q must be in [0, 100], got {q}')
    return float(np.percentile(values, q)) if len(values) else math.nan


def mean(values: Sequence[float]) -> float:
    """The mean of ``values``, or NaN for no values."""
    return float(np.mean(values)) if len(values) else math.nan
