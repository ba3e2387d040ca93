"""/diagnostics statuses of the node: one for the scheduler, one per robot.

Pure functions of the engine's view (``EngineView``, with the latest ``EngineStats``), each
robot's ``RobotView`` and the thresholds; the caller passes the time, so every level can be
tested without a node.

Names and keys are in ``diagnostic_keys``.

Values, as rqt shows them: one number or one word per key, units and windows in the key
(``action rate over 5 s (Hz)``), ``n/a`` for every value that has no data, free text bounded
to ``MAX_VALUE_CHARS``. Counts by reason get a key per reason (``aborts: deadline_missed``).
Latency keys name their two ends: the scheduler's engine step latency runs from a step's
arrival in the engine to its finish there; a robot's from its image's stamp to the chunk's
publication by the node. A robot's publish jitter is the p99 of ``|interval between two of its
chunks' publications - period_s|``. A robot's engine numbers come from the latest ``EngineStats``.

Refused frames are counted both ways: ``bad frames from the engine`` by the node over
its life, ``bad frames from the node`` by the running engine (from its ``EngineStats``).
A dead engine's status says when it restarts and the restart's number in its row of
restarts (``engine restart attempt``, 0 once the engine has run long enough to end the row).

The node reports in every lifecycle state: the scheduler status carries the lifecycle state,
and the engine's state is ``stopped`` while the node has none (``stopped_engine``: unconfigured
or finalized, with the error of a configure that failed).

Levels, scheduler: ERROR when the engine is dead; WARN while the node is not active (its
message says what it refuses and until when), under ``use_sim_time`` when no ``/clock``
came ``NO_CLOCK_WARN_S`` after start-up (the message starts with it), while the engine
starts, for ``window_s`` after it came back from a restart, when steps were retracted in the
engine's retract window, or when more than ``queue_warn_threshold`` steps wait; OK
otherwise. Robot: STALE until its first image ("waiting for first image", with the node's
uptime on the steady clock, which runs also while sim time stands still); ERROR when no
image came for ``silent_robot_s``; WARN while the node is not active ("not served"), when a
step of it was refused in the last window, when a chunk of it was published with no action
left to execute in the last window (the message says why: ``latency 118.0 ms > horizon x dt
100 ms``, or the latency plus ``min_lead_s``), when its ``vla/joint_trajectory`` carries the
placeholder joint names ``a0``, ``a1``, ..., or when its action rate is below
``rate_warn_fraction`` of its target (the message says whether its camera is too slow, the
engine is not answering (its steps timed out) or the node is too slow); OK otherwise.
Messages put the cause first.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from vla_sched.ipc.messages import EngineStats, FailureReason, RobotStats
from vla_sched.ros.diagnostic_keys import (
    BAD_FRAMES_FROM_ENGINE_KEY,
    BAD_FRAMES_FROM_NODE_KEY,
    CACHE_HIT_KEY,
    DEADLINE_WAITS_KEY,
    DECODE_STEP_COST_KEY,
    ENGINE_RETRACT_WINDOW_S,
    ENGINE_ROBOT_KEYS,
    ENGINE_STATE_KEY,
    ITL_P50_KEY,
    ITL_P99_KEY,
    LIFECYCLE_STATE_KEY,
    NEXT_RESTART_KEY,
    NO_DATA,
    NODE_UPTIME_KEY,
    PREFILL_COST_KEY,
    REASONS,
    RESTART_ATTEMPT_KEY,
    RETRACTS_WINDOW_KEY,
    ROS_CLOCK_KEY,
    SIM_NO_CLOCK,
    STATS_KEYS,
    STEP_LATENCY_P50_KEY,
    STEP_LATENCY_P99_KEY,
    SYSTEM_CLOCK,
    robot_hardware_id,
    robot_keys,
    robot_status_name,
    scheduler_status_name,
    window_text,
)
from vla_sched.ros.engine_link import DEAD, READY, EngineView
from vla_sched.ros.node_config import DiagnosticsConfig
from vla_sched.ros.robot_slot import RobotView
from vla_sched.ros.text_bounds import MAX_MESSAGE_CAUSE_CHARS, MAX_VALUE_CHARS, bounded

if TYPE_CHECKING:
    from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus

OK, WARN, ERROR, STALE = 0, 1, 2, 3  # diagnostic_msgs/DiagnosticStatus levels
ACTIVE = 'active'  # the lifecycle state in which the node serves its robots
STOPPED = 'stopped'  # the engine state while the node has no engine
NO_CLOCK_WARN_S = 3.0  # under use_sim_time, no /clock this long after start-up is a WARN
# What a node that is not active does, by lifecycle state.
_NOT_SERVING = {
    'unconfigured': 'every step is refused until the node is configured and activated',
    'inactive': 'every step is refused until the node is activated',
    'finalized': 'the node serves no more steps',
}


@dataclass(frozen=True, slots=True)
class StatusData:
    """A status before it becomes a message: name, level, summary, key/values."""

    name: str
    level: int
    message: str
    hardware_id: str
    values: tuple[tuple[str, str], ...]


def _num(value: float | None, digits: int = 1) -> str:
    return NO_DATA if value is None or not math.isfinite(value) else f'{value:.{digits}f}'


def _text(value: str) -> str:
    return value or NO_DATA


def _cause(text: str) -> str:
    return bounded(text, MAX_MESSAGE_CAUSE_CHARS)


def _by_reason(prefix: str, counts: Mapping[str, int]) -> list[tuple[str, str]]:
    """One key per known reason, then any other reason the counts hold."""
    extra = sorted(set(counts) - set(REASONS))
    return [(f'{prefix}: {r}', str(int(counts.get(r, 0)))) for r in (*REASONS, *extra)]


def _status(
    name: str, level: int, message: str, hardware_id: str, values: Iterable[tuple[str, str]]
) -> StatusData:
    return StatusData(
        name,
        level,
        bounded(message, MAX_VALUE_CHARS),
        hardware_id,
        tuple((k, bounded(v, MAX_VALUE_CHARS)) for k, v in values),
    )


def stopped_engine(mode: str, *, last_error: str = '') -> EngineView:
    """The view of the engine a node without one reports (``last_error``: why the node
    could not start one)."""
    nan = float('nan')
    return EngineView(
        state=STOPPED,
        mode=mode,
        pid=None,
        model_name='',
        random_weights=False,
        prompt_layout='',
        heartbeat_age_s=nan,
        state_age_s=nan,
        num_restarts=0,
        restart_attempt=0,
        since_restart_s=nan,
        uptime_s=nan,
        last_error=last_error,
        restart_in_s=None,
        stats=None,
        stats_age_s=nan,
    )


def scheduler_data(
    view: EngineView,
    cfg: DiagnosticsConfig,
    *,
    node_name: str,
    robots: Sequence[RobotView] = (),
    lifecycle_state: str = ACTIVE,
    ros_clock: str = SYSTEM_CLOCK,
    uptime_s: float = math.nan,
) -> StatusData:
    """The scheduler status from the engine's view (stats may be missing while it is down);
    ``robots`` give the worst robot its deadline misses; ``ros_clock`` is what the node's
    ROS time follows (``ROS_CLOCK_KEY``'s values), ``uptime_s`` the node's time since
    start-up on the steady clock."""
    stats = view.stats if view.state == READY else None
    level, message = _scheduler_level(view, stats, cfg, lifecycle_state)
    if ros_clock == SIM_NO_CLOCK and uptime_s >= NO_CLOCK_WARN_S:
        level = max(level, WARN)
        message = f'sim time on, no /clock received ({uptime_s:.1f} s since start-up); {message}'
    pid = str(view.pid) if view.pid is not None else 'in-process'
    values = [
        (LIFECYCLE_STATE_KEY, lifecycle_state),
        (ROS_CLOCK_KEY, ros_clock),
        (NODE_UPTIME_KEY, _num(uptime_s)),
        (ENGINE_STATE_KEY, view.state),
        ('engine mode', view.mode),
        ('engine pid', NO_DATA if view.state == STOPPED else pid),
        ('model', view.model_name + (' (random weights)' if view.random_weights else '')),
        ('prompt layout', _text(view.prompt_layout)),
        ('engine restarts', str(view.num_restarts)),
        (RESTART_ATTEMPT_KEY, str(view.restart_attempt)),
        (NEXT_RESTART_KEY, _num(view.restart_in_s)),
        ('time since last engine restart (s)', _num(view.since_restart_s)),
        ('engine uptime (s)', _num(view.uptime_s)),
        ('engine last error', _text(view.last_error)),
        ('engine heartbeat age (s)', _num(view.heartbeat_age_s, 2)),
        (BAD_FRAMES_FROM_ENGINE_KEY, str(view.num_bad_frames)),
    ]
    values.extend(_stats_values(stats, robots))
    values.append(('stats age (s)', _num(view.stats_age_s, 2) if stats else NO_DATA))
    return _status(scheduler_status_name(node_name), level, message, node_name, values)


def _scheduler_level(
    view: EngineView, stats: EngineStats | None, cfg: DiagnosticsConfig, lifecycle_state: str
) -> tuple[int, str]:
    if view.state == DEAD:
        when = (
            ''
            if view.restart_in_s is None
            else f'; restart in {view.restart_in_s:.1f} s (attempt {view.restart_attempt})'
        )
        return ERROR, f'engine dead: {_cause(view.last_error)}{when}'
    if lifecycle_state != ACTIVE:
        engine = f'engine {view.state}'
        if view.state == STOPPED:
            engine = f'no engine ({_cause(view.last_error)})' if view.last_error else 'no engine'
        until = _NOT_SERVING.get(lifecycle_state, 'every step is refused')
        return WARN, f'{lifecycle_state}: {until}; {engine}'
    if view.state != READY:
        after = f' after a crash: {_cause(view.last_error)}' if view.num_restarts else ''
        return WARN, f'engine starting ({view.state_age_s:.1f} s){after}'
    problems = []
    if view.num_restarts and view.uptime_s < cfg.window_s:
        problems.append(
            f'engine back for {view.uptime_s:.1f} s after a crash: {_cause(view.last_error)}'
        )
    if stats is not None and stats.num_retracts_window > 0:
        problems.append(
            f'KV pool full: {stats.num_retracts_window} retracts in the last '
            f'{window_text(ENGINE_RETRACT_WINDOW_S)}'
        )
    if stats is not None and stats.num_waiting > cfg.queue_warn_threshold:
        problems.append(
            f'queue too long: {stats.num_waiting} steps waiting (> {cfg.queue_warn_threshold})'
        )
    if problems:
        return WARN, '; '.join(problems)
    if stats is None:
        return OK, 'engine ready; no statistics yet'
    return OK, f'{stats.num_running} running, {stats.num_waiting} waiting'


def _worst_robot(
    stats: EngineStats, robots: Sequence[RobotView]
) -> tuple[str, RobotStats | None, int | None]:
    """The robot with the highest inter-token latency p99 in the engine's window."""
    timed = {rid: s for rid, s in stats.robots.items() if math.isfinite(s.itl_ms_p99)}
    if not timed:
        return NO_DATA, None, None
    rid = max(sorted(timed), key=lambda r: timed[r].itl_ms_p99)
    misses = next((r.num_deadline_misses for r in robots if r.robot_id == rid), None)
    return rid, timed[rid], misses


def _stats_values(stats: EngineStats | None, robots: Sequence[RobotView]) -> list[tuple[str, str]]:
    if stats is None:
        return [(key, NO_DATA) for key in STATS_KEYS]
    worst_id, worst, worst_misses = _worst_robot(stats, robots)
    return [
        ('waiting queue depth', str(stats.num_waiting)),
        ('running batch size', str(stats.num_running)),
        ('chunked request', _text(stats.chunked_rid)),
        ('retracts total', str(stats.num_retracts_total)),
        (RETRACTS_WINDOW_KEY, str(stats.num_retracts_window)),
        *_by_reason('aborts', stats.aborts_by_reason),
        ('delayed prefills', str(stats.num_delayed_prefills)),
        (DEADLINE_WAITS_KEY, str(stats.num_deadline_waits)),
        (PREFILL_COST_KEY, _num(stats.prefill_us_per_token, 2)),
        (DECODE_STEP_COST_KEY, _num(stats.decode_step_ms, 2)),
        ('KV pool use (%)', _num(stats.kv_use_percent)),
        (CACHE_HIT_KEY, _num(100.0 * stats.cache_hit_rate)),
        (STEP_LATENCY_P50_KEY, _num(stats.arrival_to_finish_ms_p50, 2)),
        (STEP_LATENCY_P99_KEY, _num(stats.arrival_to_finish_ms_p99, 2)),
        (ITL_P50_KEY, _num(stats.itl_ms_p50, 2)),
        (ITL_P99_KEY, _num(stats.itl_ms_p99, 2)),
        ('worst robot', worst_id),
        ('worst robot inter-token latency p99 (ms)', _num(worst and worst.itl_ms_p99, 2)),
        ('worst robot deadline misses', NO_DATA if worst_misses is None else str(worst_misses)),
        (BAD_FRAMES_FROM_NODE_KEY, str(stats.num_bad_frames_received)),
    ]


def robot_data(
    view: RobotView,
    engine_robot: RobotStats | None,
    cfg: DiagnosticsConfig,
    *,
    node_name: str,
    lifecycle_state: str = ACTIVE,
    uptime_s: float = math.nan,
) -> StatusData:
    """One robot's status; ``engine_robot`` (None: unknown) adds what only the engine knows;
    ``uptime_s`` (the node's, on the steady clock) is how long it has waited for its first
    image (NaN: the slot's own age on the ROS clock)."""
    level, message = _robot_level(view, cfg, lifecycle_state, uptime_s)
    keys = robot_keys(view.window_s)
    values = (
        _num(view.action_rate_hz, 2),
        _num(view.image_rate_hz, 2),
        _num(view.target_rate_hz, 2),
        _num(view.since_last_chunk_s, 2),
        _num(view.silent_s, 2) if view.seen_image else NO_DATA,
        _num(view.state_age_s, 2),
        _num(view.stamp_to_publish_ms_p50),
        _num(view.stamp_to_publish_ms_p95),
        _num(view.stamp_to_publish_ms_p99),
        _num(view.publish_jitter_ms_p99),
        str(view.num_chunks),
        str(view.num_deadline_misses),
        str(view.num_superseded),
        str(view.num_chunks_all_past),
        str(view.num_all_past_window),
        *(v for _, v in _by_reason('refused', view.refused_by_reason)),
        str(view.num_refused_window),
        _text(view.last_error),
        _num(view.last_error_age_s, 2),
        *_engine_robot_values(engine_robot),
    )
    extra = sorted(set(view.refused_by_reason) - set(REASONS))
    if extra:  # a reason this version does not know: keep every count visible
        at = keys.index(f'refused in last {window_text(view.window_s)}')
        keys = (*keys[:at], *(f'refused: {r}' for r in extra), *keys[at:])
    return _status(
        robot_status_name(node_name, view.robot_id),
        level,
        message,
        robot_hardware_id(node_name, view.robot_id),
        zip(keys, values, strict=True),
    )


def _engine_robot_values(stats: RobotStats | None) -> list[str]:
    if stats is None:
        return [NO_DATA] * len(ENGINE_ROBOT_KEYS)
    return [
        str(stats.num_cached_session_prefix_tokens),
        str(stats.num_retracts),
        _num(stats.ttft_ms_p50, 2),
        _num(stats.itl_ms_p50, 2),
        _num(stats.itl_ms_p99, 2),
    ]


def _robot_level(
    view: RobotView, cfg: DiagnosticsConfig, lifecycle_state: str, uptime_s: float
) -> tuple[int, str]:
    if not view.seen_image:
        waited_s = uptime_s if math.isfinite(uptime_s) else view.silent_s
        return STALE, f'waiting for first image ({waited_s:.1f} s since start-up)'
    if view.silent_s > cfg.silent_robot_s:
        return ERROR, f'silent: no image for {view.silent_s:.1f} s'
    window = window_text(view.window_s)
    if lifecycle_state != ACTIVE:
        refused = view.num_refused_window
        return WARN, f'not served: node {lifecycle_state} ({refused} refused in the last {window})'
    problems = []
    if view.num_refused_window > 0:
        problems.append(
            f'{_cause(view.last_error)} ({view.num_refused_window} refused in the last {window})'
        )
    if view.num_all_past_window > 0:
        problems.append(
            f'{_cause(view.all_past_cause)}: {view.num_all_past_window} chunks with no action '
            f'left to execute in the last {window}'
        )
    names = view.placeholder_joint_names
    if names:
        problems.append(
            f'joint names {names[0]}..{names[-1]} sent to a JointTrajectoryController are '
            f'placeholders: set robots.{view.robot_id}.action_joint_names to its joints'
        )
    floor_hz = cfg.rate_warn_fraction * view.target_rate_hz
    if view.rate_judged and view.action_rate_hz < floor_hz:
        rates = (
            f'actions {view.action_rate_hz:.2f} Hz, images {view.image_rate_hz:.2f} Hz, '
            f'target {view.target_rate_hz:.2f} Hz over {window}'
        )
        if view.image_rate_hz < floor_hz:
            problems.append(f'camera too slow: {rates}')
        elif view.last_error.startswith(FailureReason.ENGINE_TIMEOUT.value):
            problems.append(f'engine not answering: {rates}')
        else:
            since = _num(view.since_last_chunk_s)
            problems.append(f'node too slow: {rates}; last chunk {since} s ago')
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
    node_name: str,
    lifecycle_state: str = ACTIVE,
    ros_clock: str = SYSTEM_CLOCK,
    uptime_s: float = math.nan,
) -> DiagnosticArray:
    """The whole /diagnostics message: the scheduler status, then one status per robot.

    ``node_name`` is the publishing node's fully qualified name (``get_fully_qualified_name``);
    ``lifecycle_state`` the label of its lifecycle state; ``ros_clock`` and ``uptime_s`` as
    for ``scheduler_data``.
    """
    # Imported here so that the status rules above import without ROS installed.
    from diagnostic_msgs.msg import DiagnosticArray

    robots = list(robots)
    engine_robots = engine.stats.robots if engine.stats is not None else {}
    statuses = [
        scheduler_data(
            engine,
            cfg,
            node_name=node_name,
            robots=robots,
            lifecycle_state=lifecycle_state,
            ros_clock=ros_clock,
            uptime_s=uptime_s,
        )
    ]
    statuses.extend(
        robot_data(
            view,
            engine_robots.get(view.robot_id),
            cfg,
            node_name=node_name,
            lifecycle_state=lifecycle_state,
            uptime_s=uptime_s,
        )
        for view in robots
    )
    msg = DiagnosticArray(status=[to_message(s) for s in statuses])
    msg.header.stamp = stamp
    return msg
