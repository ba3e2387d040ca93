"""Inter-token gaps of finished steps, split by whether a prefill pass ran inside the gap.

A running robot's inter-token latency jumps when another robot's new image is prefilled
between two of its tokens. ``itl_gaps`` classifies every gap between two consecutive tokens
of each finished request by whether an extend (prefill) pass overlapped it; ``ItlSummary``
gives the percentiles of both kinds. The engine core measured on a real model
(``bench/itl_jump.py``) and the simulator (``bench/sim_policies.py``) judge the same way.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from bench.lib.stats import percentile
from vla_sched.core.forward_batch import ForwardMode
from vla_sched.core.scheduling.request import Req
from vla_sched.testing.sim_runner import StepRecord

NS_PER_MS = 1_000_000


def itl_gaps(done: Sequence[Req], steps: Sequence[StepRecord]) -> tuple[list[float], list[float]]:
    """Inter-token gaps (ms) of ``done``'s requests: those no prefill pass overlapped, and
    those one did (a pass overlaps a gap when it starts before the gap ends and ends after
    the gap starts)."""
    extend = ForwardMode.EXTEND
    prefills = sorted((s.start_ns, s.end_ns) for s in steps if s.forward_mode is extend)
    starts = np.array([s for s, _ in prefills], dtype=np.int64)
    ends = np.array([e for _, e in prefills], dtype=np.int64)
    clean, hit = [], []
    for req in done:
        for prev, cur in itertools.pairwise(req.times.token_ns):
            i = int(np.searchsorted(starts, cur, side='left'))
            overlapped = i > 0 and bool((ends[:i] > prev).any())
            (hit if overlapped else clean).append((cur - prev) / NS_PER_MS)
    return clean, hit


@dataclass(frozen=True, slots=True)
class ItlSummary:
    """Percentiles (ms) of the gaps without and with a prefill inside; NaN where none."""

    clean_p50: float
    clean_p99: float
    prefill_p50: float
    prefill_p99: float
    max: float
    prefill_gap_share: float  # of all gaps; NaN without gaps

    @classmethod
    def of(cls, clean: Sequence[float], hit: Sequence[float]) -> ItlSummary:
        num_gaps = len(clean) + len(hit)
        return cls(
            clean_p50=percentile(clean, 50),
            clean_p99=percentile(clean, 99),
            prefill_p50=percentile(hit, 50),
            prefill_p99=percentile(hit, 99),
            max=max([*clean, *hit], default=float('nan')),
            prefill_gap_share=len(hit) / num_gaps if num_gaps else float('nan'),
        )
