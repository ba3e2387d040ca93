"""/diagnostics statuses of the node: one for the scheduler, one per robot.

Pure functions of the engine's view (``EngineView``, with the latest ``EngineStats``), each
robot's ``RobotView`` and the thresholds; the caller passes the time, so every level can be
tested without a node. Names are what ``config/diagnostics_analyzers.yaml`` matches:
``'vla_sched: scheduler'`` and ``'vla_sched: robot <id>'``.

Latency keys name their two ends: the scheduler's ``engine step latency (arrival to
finish)`` runs from a step's arrival in the engine to its finish there; a robot's ``latency
(image stamp to publish)`` from its image's stamp to the chunk's publication by the node.
A robot's engine numbers (retracts, cached session prefix tokens, time to first token,
inter-token latency) come from the latest ``EngineStats`` and read ``n/a`` without one.

Levels, scheduler: ERROR when the engine is dead (or restarting); WARN while it starts, when
steps were retracted in the last window, or when more than ``queue_warn_threshold`` steps
wait; OK otherwise. Robot: ERROR when no image came for ``silent_robot_s``; WARN when its
action rate is below ``rate_warn_fraction`` of its target or a step of it was refused in
the last window; OK otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from vla_sched.ipc.messages import EngineStats, RobotStats
from vla_sched.ros.engine_link import DEAD, READY, EngineView
from vla_sched.ros.node_config import DiagnosticsConfig
from vla_sched.ros.robot_slot import RobotView

if TYPE_CHECKING:
    from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus

SCHEDULER_STATUS_NAME = 'vla_sched: scheduler'
ROBOT_STATUS_PREFIX = 'vla_sched: robot '
OK, WARN, ERROR = 0, 1, 2  # diagnostic_msgs/DiagnosticStatus levels

ENGINE_KEYS = (
    'engine state',
    'engine mode',
    'engine pid',
    'model',
    'prompt layout',
    'engine restarts',
    'engine last error',
    'engine heartbeat age (s)',
)
STATS_KEYS = (
    'waiting queue depth',
    'running batch size',
    'chunked request',
    'retracts total',
    'retracts in window',
    'aborts by reason',
    'delayed prefills',
    'KV pool use (%)',
    'radix cache hit rate',
    'engine step latency (arrival to finish) p50 (ms)',
    'engine step latency (arrival to finish) p99 (ms)',
    'inter-token latency p50 (ms)',
    'inter-token latency p99 (ms)',
)
SCHEDULER_KEYS = (*ENGINE_KEYS, *STATS_KEYS, 'stats age (s)')
ENGINE_ROBOT_KEYS = (
    'cached session prefix tokens',
    'retracts',
    'engine time to first token (arrival to first token) p50 (ms)',
    'inter-token latency p50 (ms)',
    'inter-token latency p99 (ms)',
)
ROBOT_KEYS = (
    'action rate (Hz)',
    'target rate (Hz)',
    'latency (image stamp to publish) p50 (ms)',
    'latency (image stamp to publish) p99 (ms)',
    'chunks published',
    'deadline misses',
    'superseded observations',
    'refused steps',
    'refused in window',
    'last error',
    *ENGINE_ROBOT_KEYS,
    'seconds since last image',
)


@dataclass(frozen=True, slots=True)
class StatusData:
    """A status before it becomes a message: name, level, summary, key/values."""

    name: str
    level: int
    message: str
    hardware_id: str
    values: tuple[tuple[str, str], ...]


def robot_status_name(robot_id: str) -> str:
    return f'{ROBOT_STATUS_PREFIX}{robot_id}'


def status_names(robot_ids: Iterable[str]) -> list[str]:
    """Every status name the node publishes for these robots."""
    return [SCHEDULER_STATUS_NAME, *(robot_status_name(r) for r in robot_ids)]


def _num(value: float, digits: int = 1) -> str:
    return 'n/a' if value is None or not math.isfinite(value) else f'{value:.{digits}f}'


def _counts(counts: Mapping[str, int]) -> str:
    items = [f'{k}={v}' for k, v in sorted(counts.items()) if v]
    return ', '.join(items) if items else 'none'


def scheduler_data(view: EngineView, cfg: DiagnosticsConfig, *, hardware_id: str) -> StatusData:
    """The scheduler status from the engine's view (stats may be missing while it is down)."""
    stats = view.stats if view.state == READY else None
    level, message = _scheduler_level(view, stats, cfg)
    values = [
        ('engine state', view.state),
        ('engine mode', view.mode),
        ('engine pid', str(view.pid) if view.pid is not None else 'in-process'),
        ('model', view.model_name + (' (random weights)' if view.random_weights else '')),
        ('prompt layout', view.prompt_layout or 'n/a'),
        ('engine restarts', str(view.num_restarts)),
        ('engine last error', view.last_error or 'none'),
        ('engine heartbeat age (s)', _num(view.heartbeat_age_s, 2)),
    ]
    values.extend(_stats_values(stats))
    values.append(('stats age (s)', _num(view.stats_age_s, 2) if stats else 'n/a'))
    return StatusData(SCHEDULER_STATUS_NAME, level, message, hardware_id, tuple(values))


def _scheduler_level(
    view: EngineView, stats: EngineStats | None, cfg: DiagnosticsConfig
) -> tuple[int, str]:
    if view.state == DEAD:
        when = '' if view.restart_in_s is None else f'; restart in {view.restart_in_s:.1f} s'
        return ERROR, f'engine dead: {view.last_error}{when}'
    if view.state != READY:
        return WARN, f'engine starting ({view.state_age_s:.1f} s)'
    if stats is None:
        return OK, 'engine ready; no statistics yet'
    problems = []
    if stats.num_retracts_window > 0:
        problems.append(f'{stats.num_retracts_window} retracts in the last window (KV pool full)')
    if stats.num_waiting > cfg.queue_warn_threshold:
        problems.append(f'{stats.num_waiting} steps waiting (> {cfg.queue_warn_threshold})')
    if problems:
        return WARN, '; '.join(problems)
    return OK, f'{stats.num_running} running, {stats.num_waiting} waiting'


def _stats_values(stats: EngineStats | None) -> list[tuple[str, str]]:
    if stats is None:
        return [(key, 'n/a') for key in STATS_KEYS]
    return [
        ('waiting queue depth', str(stats.num_waiting)),
        ('running batch size', str(stats.num_running)),
        ('chunked request', stats.chunked_rid or 'none'),
        ('retracts total', str(stats.num_retracts_total)),
        ('retracts in window', str(stats.num_retracts_window)),
        ('aborts by reason', _counts(stats.aborts_by_reason)),
        ('delayed prefills', str(stats.num_delayed_prefills)),
        ('KV pool use (%)', _num(stats.kv_use_percent)),
        ('radix cache hit rate', _num(stats.cache_hit_rate, 3)),
        (
            'engine step latency (arrival to finish) p50 (ms)',
            _num(stats.arrival_to_finish_ms_p50, 2),
        ),
        (
            'engine step latency (arrival to finish) p99 (ms)',
            _num(stats.arrival_to_finish_ms_p99, 2),
        ),
        ('inter-token latency p50 (ms)', _num(stats.itl_ms_p50, 2)),
        ('inter-token latency p99 (ms)', _num(stats.itl_ms_p99, 2)),
    ]


def robot_data(
    view: RobotView, engine_robot: RobotStats | None, cfg: DiagnosticsConfig
) -> StatusData:
    """One robot's status; ``engine_robot`` (None: unknown) adds what only the engine knows."""
    level, message = _robot_level(view, cfg)
    values = (
        ('action rate (Hz)', _num(view.action_rate_hz, 2)),
        ('target rate (Hz)', _num(view.target_rate_hz, 2)),
        ('latency (image stamp to publish) p50 (ms)', _num(view.stamp_to_publish_ms_p50)),
        ('latency (image stamp to publish) p99 (ms)', _num(view.stamp_to_publish_ms_p99)),
        ('chunks published', str(view.num_chunks)),
        ('deadline misses', str(view.num_deadline_misses)),
        ('superseded observations', str(view.num_superseded)),
        ('refused steps', _counts(view.refused_by_reason)),
        ('refused in window', str(view.num_refused_window)),
        ('last error', view.last_error or 'none'),
        *_engine_robot_values(engine_robot),
        ('seconds since last image', _num(view.silent_s, 2) if view.seen_image else 'never'),
    )
    name = robot_status_name(view.robot_id)
    return StatusData(name, level, message, view.robot_id, values)


def _engine_robot_values(stats: RobotStats | None) -> list[tuple[str, str]]:
    if stats is None:
        return [(key, 'n/a') for key in ENGINE_ROBOT_KEYS]
    return [
        ('cached session prefix tokens', str(stats.num_cached_session_prefix_tokens)),
        ('retracts', str(stats.num_retracts)),
        (
            'engine time to first token (arrival to first token) p50 (ms)',
            _num(stats.ttft_ms_p50, 2),
        ),
        ('inter-token latency p50 (ms)', _num(stats.itl_ms_p50, 2)),
        ('inter-token latency p99 (ms)', _num(stats.itl_ms_p99, 2)),
    ]


def _robot_level(view: RobotView, cfg: DiagnosticsConfig) -> tuple[int, str]:
    if view.silent_s > cfg.silent_robot_s:
        if not view.seen_image:
            return ERROR, f'silent: no image since start-up {view.silent_s:.1f} s ago'
        return ERROR, f'silent: no image for {view.silent_s:.1f} s'
    problems = []
    floor_hz = cfg.rate_warn_fraction * view.target_rate_hz
    if view.rate_judged and view.action_rate_hz < floor_hz:
        problems.append(
            f'action rate {view.action_rate_hz:.2f} Hz below target {view.target_rate_hz:.2f} Hz'
        )
    if view.num_refused_window > 0:
        problems.append(f'{view.num_refused_window} refused in the last window: {view.last_error}')
    if problems:
        return WARN, '; '.join(problems)
    p99 = _num(view.stamp_to_publish_ms_p99)
    return OK, f'{view.action_rate_hz:.2f} Hz, image stamp to publish p99 {p99} ms'


def to_message(data: StatusData) -> DiagnosticStatus:
    """A ``diagnostic_msgs/DiagnosticStatus`` from ``data``."""
    # Imported here so that the status rules above import without ROS installed.
    from diagnostic_msgs.msg import DiagnosticStatus, KeyValue

    return DiagnosticStatus(
        level=bytes([data.level]),
        name=data.name,
        message=data.message,
        hardware_id=data.hardware_id,
        values=[KeyValue(key=k, value=v) for k, v in data.values],
    )


def diagnostic_array(
    engine: EngineView,
    robots: Iterable[RobotView],
    cfg: DiagnosticsConfig,
    *,
    stamp,
    hardware_id: str,
) -> DiagnosticArray:
    """The whole /diagnostics message: the scheduler status, then one status per robot."""
    # Imported here so that the status rules above import without ROS installed.
    from diagnostic_msgs.msg import DiagnosticArray

    engine_robots = engine.stats.robots if engine.stats is not None else {}
    statuses = [scheduler_data(engine, cfg, hardware_id=hardware_id)]
    statuses.extend(robot_data(view, engine_robots.get(view.robot_id), cfg) for view in robots)
    msg = DiagnosticArray(status=[to_message(s) for s in statuses])
    msg.header.stamp = stamp
    return msg
