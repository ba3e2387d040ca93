"""What both engine cores report: their ``EngineInfo`` and ``EngineStats`` snapshots.

Both cores count into the scheduler's ``SchedulerMetrics`` (the scheduled core through its
scheduler, the sequential one directly), so the frontend sees one set of numbers with one
meaning whichever core runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from vla_sched.core.scheduling.metrics import SchedulerMetrics
from vla_sched.core.scheduling.scheduler_config import SchedulerConfig, ms_to_ns
from vla_sched.ipc.messages import EngineInfo, EngineStats, FailureReason, RobotStats

if TYPE_CHECKING:
    from vla_sched.model.families.protocol import ServedModel


def new_metrics() -> SchedulerMetrics:
    """Metrics with the scheduler's own window sizes, for a core without a scheduler."""
    config = SchedulerConfig()
    return SchedulerMetrics(
        window_size=config.latency_window_size,
        retract_window_ns=ms_to_ns(config.retract_window_ms),
    )


def engine_info(
    served: ServedModel, *, max_instruction_bytes: int, random_weights: bool
) -> EngineInfo:
    """What the served checkpoint takes and returns, as its family describes a step."""
    shape = served.shape
    return EngineInfo(
        model_name=served.model_name,
        num_state=shape.num_state,
        action_horizon=shape.action_horizon,
        action_dim=shape.action_dim,
        image_size=shape.image_size,
        max_instruction_bytes=max_instruction_bytes,
        random_weights=random_weights,
        prompt_layout=shape.prompt_layout,
        num_images=shape.num_images,
    )


def record_failure(metrics: SchedulerMetrics, robot_id: str, reason: FailureReason) -> None:
    """Count a step refused before it reached a scheduler."""
    metrics.record_abort(robot_id, reason.value)
    if reason is FailureReason.DEADLINE_MISSED:
        metrics.record_deadline_miss(robot_id)


def engine_stats(
    metrics: SchedulerMetrics,
    now_ns: int,
    *,
    num_waiting: int,
    num_running: int,
    chunked_rid: str,
    kv_use_percent: float,
    session_prefix_tokens: Mapping[str, int] | None = None,
) -> EngineStats:
    """A snapshot of ``metrics`` and of what the core holds now (queue, batch, KV use).

    ``session_prefix_tokens`` is each robot's session prefix tokens held in the radix cache
    (none: the core keeps no sessions).
    """
    prefix_tokens = session_prefix_tokens or {}
    robots = {
        robot_id: RobotStats(
            num_retracts=c.num_retracts,
            num_cached_session_prefix_tokens=prefix_tokens.get(robot_id, 0),
            ttft_ms_p50=c.ttft.percentile_ms(50),
            itl_ms_p50=c.itl.percentile_ms(50),
            itl_ms_p99=c.itl.percentile_ms(99),
        )
        for robot_id, c in metrics.robots.items()
    }
    return EngineStats(
        sent_ns=now_ns,
        num_waiting=num_waiting,
        num_running=num_running,
        chunked_rid=chunked_rid,
        num_retracts_total=metrics.num_retracts_total,
        num_retracts_window=metrics.num_retracts_in_window(now_ns),
        num_delayed_prefills=metrics.num_delayed_prefills,
        kv_use_percent=kv_use_percent,
        cache_hit_rate=metrics.cache_hit_rate,
        arrival_to_finish_ms_p50=metrics.arrival_to_finish.percentile_ms(50),
        arrival_to_finish_ms_p99=metrics.arrival_to_finish.percentile_ms(99),
        itl_ms_p50=metrics.itl.percentile_ms(50),
        itl_ms_p99=metrics.itl.percentile_ms(99),
        aborts_by_reason=dict(metrics.aborts_by_reason),
        robots=robots,
        num_deadline_waits=metrics.num_deadline_waits,
        prefill_us_per_token=_us_per_token(metrics),
        decode_step_ms=_decode_step_ms(metrics),
    )


def _us_per_token(metrics: SchedulerMetrics) -> float:
    line = metrics.pass_cost.prefill_line()
    return float('nan') if line is None else line[1] / 1e3


def _decode_step_ms(metrics: SchedulerMetrics) -> float:
    step = metrics.pass_cost.decode_step_ns()
    return float('nan') if step is None else step / 1e6
