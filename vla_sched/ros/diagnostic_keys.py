"""The names and keys of the node's /diagnostics statuses.

Names carry the node's fully qualified name, so that several nodes (one per GPU, each in its
namespace) never publish the same name: ``'<node>: scheduler'`` and ``'<node>: robot <id>'``
(e.g. ``'/gpu0/vla_sched: robot robot_0'``); hardware ids are ``<node>`` for the scheduler
and ``<node>/<id>`` for a robot. ``config/diagnostics_analyzers.yaml`` matches these names.

Keys, in the order rqt shows them: units and windows in the key (``action rate over 5 s
(Hz)``), one key per reason for counts by reason (``aborts: deadline_missed``); latency keys
name their two ends, and a jitter key its statistic (``p99 of |interval between chunks -
period_s|``). The scheduler's first key is the node's lifecycle state
(``unconfigured``, ``inactive``, ``active`` or ``finalized``), then the clock the node's ROS
time follows (``ros clock``: ``system``, ``sim`` once ``/clock`` runs under ``use_sim_time``,
``sim_no_clock`` while no ``/clock`` came) and the node's uptime on the steady clock; its
engine state is ``stopped`` while the node has no engine (unconfigured or finalized).
"""

from __future__ import annotations

from collections.abc import Iterable

from vla_sched.ipc.messages import FailureReason
from vla_sched.ros.robot_slot import LATENCY_WINDOW_CHUNKS

NO_DATA = 'n/a'
SCHEDULER_SUFFIX = ': scheduler'
ROBOT_INFIX = ': robot '
REASONS = tuple(reason.value for reason in FailureReason)
# The engine's own windows (its SchedulerConfig defaults; no parameter changes them).
ENGINE_LATENCY_WINDOW = 1024  # samples per latency percentile window
ENGINE_RETRACT_WINDOW_S = 10.0

STEP_LATENCY_P50_KEY = (
    f'engine step latency (arrival to finish) p50 over last {ENGINE_LATENCY_WINDOW} steps (ms)'
)
STEP_LATENCY_P99_KEY = STEP_LATENCY_P50_KEY.replace(' p50 ', ' p99 ')
ITL_P50_KEY = f'inter-token latency p50 over last {ENGINE_LATENCY_WINDOW} tokens (ms)'
ITL_P99_KEY = ITL_P50_KEY.replace(' p50 ', ' p99 ')
TTFT_P50_KEY = (
    'engine time to first token (arrival to first token) p50 over last '
    f'{ENGINE_LATENCY_WINDOW} steps (ms)'
)
RETRACTS_WINDOW_KEY = f'retracts in last {ENGINE_RETRACT_WINDOW_S:g} s'
CACHE_HIT_KEY = 'radix cache hit rate (%)'
LIFECYCLE_STATE_KEY = 'lifecycle state'
ROS_CLOCK_KEY = 'ros clock'
NODE_UPTIME_KEY = 'node uptime (s)'
SYSTEM_CLOCK, SIM_CLOCK, SIM_NO_CLOCK = 'system', 'sim', 'sim_no_clock'  # ROS_CLOCK_KEY values
ENGINE_STATE_KEY = 'engine state'
RESTART_ATTEMPT_KEY = 'engine restart attempt'
NEXT_RESTART_KEY = 'next engine restart in (s)'
BAD_FRAMES_FROM_ENGINE_KEY = 'bad frames from the engine'
BAD_FRAMES_FROM_NODE_KEY = 'bad frames from the node'
E2E_P50_KEY = f'latency (image stamp to publish) p50 over last {LATENCY_WINDOW_CHUNKS} chunks (ms)'
E2E_P95_KEY = E2E_P50_KEY.replace(' p50 ', ' p95 ')
E2E_P99_KEY = E2E_P50_KEY.replace(' p50 ', ' p99 ')
PUBLISH_JITTER_KEY = (
    'chunk publish jitter (p99 of |interval between chunks - period_s|) over last '
    f'{LATENCY_WINDOW_CHUNKS} chunks (ms)'
)
STATE_AGE_KEY = 'joint state age (s)'
ALL_PAST_KEY = 'chunks with no action left to execute'

ENGINE_KEYS = (
    ENGINE_STATE_KEY,
    'engine mode',
    'engine pid',
    'model',
    'prompt layout',
    'engine restarts',
    RESTART_ATTEMPT_KEY,
    NEXT_RESTART_KEY,
    'time since last engine restart (s)',
    'engine uptime (s)',
    'engine last error',
    'engine heartbeat age (s)',
    BAD_FRAMES_FROM_ENGINE_KEY,
)
# Pass sizing by deadline (the scheduler's measured costs and the steps it held back).
DEADLINE_WAITS_KEY = 'steps held for a later pass (deadlines)'
PREFILL_COST_KEY = 'measured prefill cost (us per token)'
DECODE_STEP_COST_KEY = 'measured decode step (ms)'
STATS_KEYS = (
    'waiting queue depth',
    'running batch size',
    'chunked request',
    'retracts total',
    RETRACTS_WINDOW_KEY,
    *(f'aborts: {reason}' for reason in REASONS),
    'delayed prefills',
    DEADLINE_WAITS_KEY,
    PREFILL_COST_KEY,
    DECODE_STEP_COST_KEY,
    'KV pool use (%)',
    CACHE_HIT_KEY,
    STEP_LATENCY_P50_KEY,
    STEP_LATENCY_P99_KEY,
    ITL_P50_KEY,
    ITL_P99_KEY,
    'worst robot',
    'worst robot inter-token latency p99 (ms)',
    'worst robot deadline misses',
    BAD_FRAMES_FROM_NODE_KEY,
)
SCHEDULER_KEYS = (
    LIFECYCLE_STATE_KEY,
    ROS_CLOCK_KEY,
    NODE_UPTIME_KEY,
    *ENGINE_KEYS,
    *STATS_KEYS,
    'stats age (s)',
)
ENGINE_ROBOT_KEYS = (
    'cached session prefix tokens',
    'retracts',
    TTFT_P50_KEY,
    ITL_P50_KEY,
    ITL_P99_KEY,
)


def robot_keys(window_s: float) -> tuple[str, ...]:
    """A robot status's keys, in order, for a node whose diagnostics window is ``window_s``."""
    window = window_text(window_s)
    return (
        f'action rate over {window} (Hz)',
        f'image input rate over {window} (Hz)',
        'target rate (Hz)',
        'time since last chunk (s)',
        'time since last image (s)',
        STATE_AGE_KEY,
        E2E_P50_KEY,
        E2E_P95_KEY,
        E2E_P99_KEY,
        PUBLISH_JITTER_KEY,
        'chunks published',
        'deadline misses',
        'superseded observations',
        ALL_PAST_KEY,
        all_past_window_key(window_s),
        *(f'refused: {reason}' for reason in REASONS),
        f'refused in last {window}',
        'last error',
        'time since last error (s)',
        *ENGINE_ROBOT_KEYS,
    )


def all_past_window_key(window_s: float) -> str:
    """The key of a robot's chunks with no action left to execute in the last ``window_s``."""
    return f'{ALL_PAST_KEY} in last {window_text(window_s)}'


def scheduler_status_name(node_name: str) -> str:
    """The scheduler's status name for the node whose fully qualified name is ``node_name``."""
    return f'{node_name}{SCHEDULER_SUFFIX}'


def robot_status_name(node_name: str, robot_id: str) -> str:
    return f'{node_name}{ROBOT_INFIX}{robot_id}'


def robot_hardware_id(node_name: str, robot_id: str) -> str:
    return f'{node_name}/{robot_id}'


def is_scheduler_status(name: str) -> bool:
    """Whether ``name`` is a scheduler status (of any vla_sched node)."""
    return name.endswith(SCHEDULER_SUFFIX)


def status_names(node_name: str, robot_ids: Iterable[str]) -> list[str]:
    """Every status name the node ``node_name`` publishes for these robots."""
    return [
        scheduler_status_name(node_name),
        *(robot_status_name(node_name, r) for r in robot_ids),
    ]


def window_text(window_s: float) -> str:
    """A diagnostics window as its keys and messages write it (``'5 s'``)."""
    return f'{window_s:g} s'
