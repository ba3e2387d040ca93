"""Per-step outcome counters of an engine core, turned into ``EngineStats`` snapshots."""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field

import numpy as np

from vla_sched.ipc.messages import EngineStats, FailureReason, RobotStats


class LatencyWindow:
    """The last ``size`` latencies (ms) with their p50 and p99."""

    def __init__(self, size: int = 512) -> None:
        self._values: deque[float] = deque(maxlen=size)

    def add(self, value_ms: float) -> None:
        self._values.append(float(value_ms))

    def extend(self, values_ms) -> None:
        self._values.extend(float(v) for v in values_ms)

    def percentile(self, q: float) -> float:
        return float(np.percentile(self._values, q)) if self._values else 0.0

    def __len__(self) -> int:
        return len(self._values)


@dataclass(slots=True)
class _RobotCounters:
    num_steps_done: int = 0
    num_deadline_misses: int = 0
    num_superseded: int = 0
    num_retracts: int = 0
    num_aborts: int = 0
    num_cached_prefix_tokens: int = 0
    ttft_ms: LatencyWindow = field(default_factory=LatencyWindow)
    itl_ms: LatencyWindow = field(default_factory=LatencyWindow)


class CoreStats:
    """What happened to the steps an engine core handled, per robot and in total."""

    def __init__(self) -> None:
        self.step_ms = LatencyWindow()
        self.itl_ms = LatencyWindow()
        self.aborts_by_reason: Counter[str] = Counter()
        self._robots: dict[str, _RobotCounters] = {}

    def robot(self, robot_id: str) -> _RobotCounters:
        return self._robots.setdefault(robot_id, _RobotCounters())

    def record_done(
        self,
        robot_id: str,
        *,
        step_ms: float,
        ttft_ms: float,
        itl_ms: list[float],
        num_cached_prefix_tokens: int,
        late: bool,
    ) -> None:
        counters = self.robot(robot_id)
        counters.num_steps_done += 1
        counters.num_deadline_misses += int(late)
        counters.num_cached_prefix_tokens = num_cached_prefix_tokens
        counters.ttft_ms.add(ttft_ms)
        counters.itl_ms.extend(itl_ms)
        self.step_ms.add(step_ms)
        self.itl_ms.extend(itl_ms)

    def record_failure(self, robot_id: str, reason: FailureReason) -> None:
        counters = self.robot(robot_id)
        if reason is FailureReason.SUPERSEDED:
            counters.num_superseded += 1
            return
        if reason is FailureReason.DEADLINE_MISSED:
            counters.num_deadline_misses += 1
        counters.num_aborts += 1
        self.aborts_by_reason[reason.value] += 1

    def record_retract(self, robot_id: str) -> None:
        self.robot(robot_id).num_retracts += 1

    def snapshot(
        self,
        now_ns: int,
        *,
        num_waiting: int,
        num_running: int,
        chunked_rid: str,
        num_retracts_total: int,
        num_retracts_window: int,
        num_delayed_prefills: int,
        kv_use_percent: float,
        cache_hit_rate: float,
    ) -> EngineStats:
        robots = {
            rid: RobotStats(
                num_steps_done=c.num_steps_done,
                num_deadline_misses=c.num_deadline_misses,
                num_superseded=c.num_superseded,
                num_retracts=c.num_retracts,
                num_aborts=c.num_aborts,
                num_cached_prefix_tokens=c.num_cached_prefix_tokens,
                ttft_ms_p50=c.ttft_ms.percentile(50),
                itl_ms_p50=c.itl_ms.percentile(50),
                itl_ms_p99=c.itl_ms.percentile(99),
            )
            for rid, c in self._robots.items()
        }
        return EngineStats(
            sent_ns=now_ns,
            num_waiting=num_waiting,
            num_running=num_running,
            chunked_rid=chunked_rid,
            num_retracts_total=num_retracts_total,
            num_retracts_window=num_retracts_window,
            num_delayed_prefills=num_delayed_prefills,
            kv_use_percent=kv_use_percent,
            cache_hit_rate=cache_hit_rate,
            step_ms_p50=self.step_ms.percentile(50),
            step_ms_p99=self.step_ms.percentile(99),
            itl_ms_p50=self.itl_ms.percentile(50),
            itl_ms_p99=self.itl_ms.percentile(99),
            aborts_by_reason=dict(self.aborts_by_reason),
            robots=robots,
        )
