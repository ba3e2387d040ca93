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
    from vla_sched.model.config.checkpoint_spec import CheckpointSpec
    from vla_sched.model.config.openvla_oft import OFTCheckpointSpec


def new_metrics() -> SchedulerMetrics:
    """Metrics with the scheduler's own window sizes, for a core without a scheduler."""
    config = SchedulerConfig()
    return SchedulerMetrics(
        window_size=config.latency_window_size,
        retract_window_ns=ms_to_ns(config.retract_window_ms),
    )


def num_state_values(spec: CheckpointSpec) -> int:
    """Length of the state vector the checkpoint's prompt takes (0: no state tokens)."""
    if not spec.prompt.state_tokens:
        return 0
    return next(iter(spec.proprio_statistics.values())).action_dim


PROMPT_LAYOUT_IMAGE_FIRST = 'image first: frames share only BOS'
PROMPT_LAYOUT_INSTRUCTION_FIRST = 'instruction first: steps share the instruction prefix'
PROMPT_LAYOUT_WHOLE_PASS = 'one bidirectional pass per step: steps share nothing'


def engine_info(
    spec: CheckpointSpec, *, model_name: str, max_instruction_bytes: int, random_weights: bool
) -> EngineInfo:
    return EngineInfo(
        model_name=model_name,
        num_state=num_state_values(spec),
        action_horizon=spec.action_horizon,
        action_dim=spec.action_dim,
        image_size=spec.preprocessing.image_size if spec.preprocessing else 0,
        max_instruction_bytes=max_instruction_bytes,
        random_weights=random_weights,
        prompt_layout=PROMPT_LAYOUT_IMAGE_FIRST
        if spec.prompt.image_first
        else (PROMPT_LAYOUT_INSTRUCTION_FIRST),
    )


def oft_engine_info(
    spec: OFTCheckpointSpec, *, model_name: str, max_instruction_bytes: int, random_weights: bool
) -> EngineInfo:
    """What an OpenVLA-OFT checkpoint takes and returns under its settings: every camera's
    image, the state when the settings use it, a chunk of ``chunk_len`` actions."""
    settings = spec.settings
    preprocessing = spec.base.preprocessing
    return EngineInfo(
        model_name=model_name,
        num_state=settings.proprio_dim if settings.use_proprio else 0,
        action_horizon=settings.chunk_len,
        action_dim=settings.action_dim,
        image_size=preprocessing.image_size if preprocessing else 0,
        max_instruction_bytes=max_instruction_bytes,
        random_weights=random_weights,
        prompt_layout=PROMPT_LAYOUT_WHOLE_PASS,
        num_images=settings.num_images,
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
    )
