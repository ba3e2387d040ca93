"""The control loop's plan, its per-point summary, and its tables (``bench/control_loop.py``).

The systems are the vla_sched node with each of the engine's cores (``engine.core``):
``scheduled`` (scheduler, paged KV, batching) and ``sequential`` (one step at a time through
transformers ``generate``, what single-robot VLA servers do), and ``scheduled_oft``: the
scheduled core on an OpenVLA-OFT folder (``LoopPlan.oft_model_path``, the LIBERO preset: two
cameras and the state per step, chunks of 8 actions from one pass). A ``LoopPoint`` is one
system at one robot count, summarized over the measured windows; ``markdown_tables`` prints
every system per robot count and the ratios scheduled / sequential;
``LoopPoint.capacity_measure`` is what the capacity rule (``bench/lib/capacity.py``) judges.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import dataclass
from typing import Any

from bench.lib.capacity import CapacityMeasure
from bench.lib.ros_fleet import STAGES, FleetWindow
from bench.lib.tables import markdown_table
from vla_sched.engine.config import CORES
from vla_sched.ros.node_config import TRIGGERS

OFT_SYSTEM = 'scheduled_oft'  # the scheduled core serving LoopPlan.oft_model_path
# The scheduled core serving LoopPlan.pi0_model_path, batching every robot's steps, and the
# same core one step at a time (scheduler.max_running_requests 1: openpi's server model).
PI0_SYSTEM = 'scheduled_pi0'
PI0_ONE_AT_A_TIME = 'one_at_a_time_pi0'
PI0_SYSTEMS = (PI0_SYSTEM, PI0_ONE_AT_A_TIME)
# The same two for LoopPlan.smolvla_model_path (one at a time: LeRobot's async server).
SMOLVLA_SYSTEM = 'scheduled_smolvla'
SMOLVLA_ONE_AT_A_TIME = 'one_at_a_time_smolvla'
SMOLVLA_SYSTEMS = (SMOLVLA_SYSTEM, SMOLVLA_ONE_AT_A_TIME)
# The node's engine.core, then OpenVLA-OFT's, then pi0's, then SmolVLA's.
SYSTEMS = (*CORES, OFT_SYSTEM, *PI0_SYSTEMS, *SMOLVLA_SYSTEMS)


@dataclass(frozen=True, slots=True)
class LoopPlan:
    """What to run: robot counts, rates, windows, checkpoint, the systems (engine cores, and
    ``scheduled_oft`` on ``oft_model_path``) and node parameters for all of them
    (``node_params``: dotted names, e.g. ``scheduler.enable_overlap``)."""

    robot_counts: tuple[int, ...] = (1, 2, 4, 8, 16)
    period_s: float = 0.1
    camera_rate_hz: float = 0.0  # 0: one image per period
    trigger: str = 'on_image'
    budget_s: float = 0.5
    warmup_s: float = 4.0
    duration_s: float = 10.0
    num_windows: int = 2
    model_path: str = ''
    device: str = 'cpu'
    node_params: dict[str, Any] = dataclasses.field(default_factory=dict)
    start_timeout_s: float = 300.0
    systems: tuple[str, ...] = CORES
    oft_model_path: str = ''  # an OpenVLA-OFT folder of the LIBERO preset's shapes
    pi0_model_path: str = ''  # a pi0 folder (two cameras, eight state values)
    smolvla_model_path: str = ''  # a SmolVLA folder (two cameras, six state values)

    def __post_init__(self) -> None:
        if not self.robot_counts or min(self.robot_counts) < 1:
            raise ValueError(f'robot counts must be >= 1, got {self.robot_counts}')
        for name in ('period_s', 'budget_s', 'duration_s'):
            if not getattr(self, name) > 0:
                raise ValueError(f'{name} must be > 0, got {getattr(self, name)}')
        if self.camera_rate_hz < 0 or self.trigger not in TRIGGERS:
            raise ValueError(f'camera_rate_hz must be >= 0 and trigger one of {TRIGGERS}')
        if self.warmup_s < 0 or self.num_windows < 1:
            raise ValueError('warmup_s must be >= 0 and num_windows >= 1')
        unknown = set(self.systems) - set(SYSTEMS)
        if unknown or not self.systems:
            raise ValueError(f'systems must be among {SYSTEMS}, got {self.systems}')
        if (OFT_SYSTEM in self.systems) != bool(self.oft_model_path):
            raise ValueError(f'system {OFT_SYSTEM} and oft_model_path go together')
        if bool(set(PI0_SYSTEMS) & set(self.systems)) != bool(self.pi0_model_path):
            raise ValueError(f'systems {PI0_SYSTEMS} and pi0_model_path go together')
        if bool(set(SMOLVLA_SYSTEMS) & set(self.systems)) != bool(self.smolvla_model_path):
            raise ValueError(f'systems {SMOLVLA_SYSTEMS} and smolvla_model_path go together')


@dataclass
class LoopPoint:
    """One system at one robot count: the median of its windows."""

    system: str
    num_robots: int
    target_actions_per_s: float
    actions_per_s: list[float]  # every window
    chunks_per_s: float
    latency_ms_p50: float
    latency_ms_p99: float
    miss_rate: float
    num_retracts: int
    num_chunks: int
    num_rejected: int
    rejected_by_reason: dict[str, int]
    cpu_percent: dict[str, float]  # of one core, median over windows: node, engine, robots
    stage_ms_p50: dict[str, float]  # the server's queue/prefill/decode/total, medians
    actions_per_s_overall: float  # every window's chunks over their summed duration
    on_time_rate: float  # chunks not late over the steps that ended (chunks + refusals)

    def row(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def capacity_measure(self) -> CapacityMeasure:
        """The action rate over every window against the target, the on-time share and the
        latency percentiles over every chunk."""
        return CapacityMeasure(
            num_robots=self.num_robots,
            rate_share=self.actions_per_s_overall / self.target_actions_per_s,
            on_time_share=self.on_time_rate,
            latency_ms_p50=self.latency_ms_p50,
            latency_ms_p99=self.latency_ms_p99,
        )


def summarize(
    system: str,
    num_robots: int,
    plan: LoopPlan,
    windows: list[FleetWindow],
    retracts: list[int],
    cpu: list[dict[str, float]] | None = None,
) -> LoopPoint:
    """Median over windows; latency percentiles over every chunk of every window."""
    horizon = _horizon(windows)
    actions = [w.num_chunks * horizon / w.duration_s for w in windows]
    latencies = [x for w in windows for x in w.latencies_ms]
    num_chunks = sum(w.num_chunks for w in windows)
    ended = sum(w.num_chunks + w.num_rejected for w in windows)
    misses = sum(w.num_misses for w in windows)
    on_time = num_chunks - sum(w.num_late_chunks for w in windows)
    total_s = sum(w.duration_s for w in windows)
    by_reason: dict[str, int] = {}
    for w in windows:
        for robot in w.robots:
            for reason, count in robot['rejected'].items():
                by_reason[reason] = by_reason.get(reason, 0) + count
    merged = FleetWindow(duration_s=0.0, robots=[], latencies_ms=latencies)
    return LoopPoint(
        system=system,
        num_robots=num_robots,
        target_actions_per_s=num_robots * horizon / plan.period_s,
        actions_per_s=actions,
        chunks_per_s=statistics.median(w.num_chunks / w.duration_s for w in windows),
        latency_ms_p50=merged.latency_ms(50),
        latency_ms_p99=merged.latency_ms(99),
        miss_rate=misses / ended if ended else math.nan,
        num_retracts=sum(retracts),
        num_chunks=num_chunks,
        num_rejected=sum(w.num_rejected for w in windows),
        rejected_by_reason=by_reason,
        cpu_percent={k: statistics.median(c[k] for c in cpu) for k in cpu[0]} if cpu else {},
        stage_ms_p50={stage: _median_stage(windows, stage) for stage in STAGES},
        actions_per_s_overall=num_chunks * horizon / total_s if total_s > 0 else math.nan,
        on_time_rate=on_time / ended if ended else math.nan,
    )


def _median_stage(windows: list[FleetWindow], stage: str) -> float:
    values = [x for w in windows for x in w.stages_ms.get(stage, [])]
    return statistics.median(values) if values else math.nan


def _horizon(windows: list[FleetWindow]) -> int:
    for w in windows:
        for robot in w.robots:
            if robot.get('first_chunk'):
                return int(robot['first_chunk']['horizon'])
    return 1


def format_point(p: LoopPoint) -> str:
    lo, hi = min(p.actions_per_s), max(p.actions_per_s)
    return (
        f'{p.system:>9} N={p.num_robots:<3} actions/s {statistics.median(p.actions_per_s):7.1f} '
        f'({lo:.1f}-{hi:.1f}) of {p.target_actions_per_s:.0f}, latency p50/p99 '
        f'{p.latency_ms_p50:.0f}/{p.latency_ms_p99:.0f} ms, misses {100 * p.miss_rate:.1f}%, '
        f'retracts {p.num_retracts}, rejected {p.rejected_by_reason}, CPU % '
        + ', '.join(f'{k} {v:.0f}' for k, v in p.cpu_percent.items())
        + ', server ms p50 '
        + ', '.join(f'{k} {v:.0f}' for k, v in p.stage_ms_p50.items())
    )


def markdown_tables(points: list[LoopPoint]) -> str:
    """Both systems per N, then the ratios scheduled / sequential."""
    rows = [
        [
            p.num_robots,
            p.system,
            f'{statistics.median(p.actions_per_s):.1f} '
            f'({min(p.actions_per_s):.1f}-{max(p.actions_per_s):.1f})',
            f'{p.target_actions_per_s:.0f}',
            f'{p.latency_ms_p50:.0f}',
            f'{p.latency_ms_p99:.0f}',
            f'{100 * p.miss_rate:.1f}%',
            p.num_retracts,
            _cpu_cell(p.cpu_percent),
        ]
        for p in sorted(points, key=lambda p: (p.num_robots, SYSTEMS.index(p.system)))
    ]
    headers = ['robots', 'system', 'actions/s (median, min-max)', 'target', 'latency p50 ms']
    headers += ['latency p99 ms', 'deadline misses', 'retracts', 'CPU % node / engine / robots']
    out = markdown_table(headers, rows)
    by_key = {(p.system, p.num_robots): p for p in points}
    ratios = []
    for n in sorted({p.num_robots for p in points}):
        ours, base = by_key.get(('scheduled', n)), by_key.get(('sequential', n))
        if ours is None or base is None:
            continue
        speedup = statistics.median(ours.actions_per_s) / statistics.median(base.actions_per_s)
        ratios.append(
            [
                n,
                f'{speedup:.2f}x',
                ours.latency_ms_p99 / base.latency_ms_p99,
                ours.latency_ms_p50 / base.latency_ms_p50,
            ]
        )
    if ratios:
        headers = ['robots', 'actions/s scheduled / sequential', 'p99 latency ratio']
        out += '\n\n' + markdown_table([*headers, 'p50 latency ratio'], ratios)
    return out


def _cpu_cell(cpu: dict[str, float]) -> str:
    if not cpu:
        return 'n/a'
    return ' / '.join('-' if math.isnan(v) else f'{v:.0f}' for v in cpu.values())
