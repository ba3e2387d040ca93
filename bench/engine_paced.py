"""The engine core driven the way a node drives it, without ROS: checked and paced runs.

``ScheduledCore`` (scheduler, paged KV, the checkpoint's model runner) is driven in this
process, one ``step`` per scheduler iteration, as the node's engine loop does; no rclpy, no
ZMQ, no cv_bridge is imported, so this runs on a bare GPU machine.

- ``run_checked``: a few robots, each sending its next step when the previous one ended;
  ``check_integrity()`` after every scheduler step, and every step must end as exactly one
  ``StepResult`` or ``StepFailure`` (none lost, none twice, none unknown), results with
  finite actions of the checkpoint's shape.
- ``run_paced``: N robots (``bench/lib/fleets.py``: a camera at ``period_s``, phases spread
  over the period, at most one step in flight, the newest waiting frame wins: the node's
  ``on_image`` trigger), a fresh random frame per image. Per robot count, the images stamped
  in a window of ``duration_s`` after a warm-up are judged, each followed until its step
  ends: step latency from send to result (p50/p99), the age of the frame at the result
  (stamp to result, p99), the share of ended steps that met their ``deadline_ms``, actions/s
  delivered against the target N x horizon / period, and frames superseded while waiting;
  ``PacedPoint.capacity`` is the window's measure for the one capacity rule
  (``bench/lib/capacity.py``). The engine delivers late steps marked late
  (``late_policy='deliver_late'``), so the latencies are the real ones.
- ``--capacity``: the capacity search (``search_capacity``) over the robot ladder, a paced
  window per count on the same core; with ``--bisect`` the bisection (``bisect_capacity``),
  which needs fewer windows. ``--mixed-passes on|off`` sets the scheduler's mixed passes
  explicitly (default: what the engine derives for the device).

    python -m bench.engine_paced --robots 1 4 --duration 3            # tiny checkpoint, CPU
    python -m bench.engine_paced --capacity --max-robots 16           # the capacity search
    python -m bench.engine_paced --model-path DIR --device cuda --cuda-graphs --json out.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench.lib.capacity import (
    CapacityCriteria,
    CapacityMeasure,
    CapacitySearch,
    bisect_capacity,
    headline_table,
    robot_ladder,
    search_capacity,
    steps_table,
)
from bench.lib.fleets import Fleet, FleetTiming, robot_index, step_request
from bench.lib.stats import percentile
from bench.lib.tables import markdown_table as render_table
from vla_sched.engine.assembly import assemble_core
from vla_sched.engine.config import EngineConfig
from vla_sched.engine.scheduled_core import ScheduledCore
from vla_sched.ipc.messages import StepFailure, StepRequest, StepResult

INSTRUCTION = 'pick up the red block'
FRAME_SIZE = 224


def make_core(
    model_path: str,
    *,
    device: str,
    cuda_graphs: bool,
    max_running_requests: int = 64,
    mixed_passes: bool | None = None,
) -> ScheduledCore:
    """The engine core on ``model_path`` with late steps delivered (marked late).

    ``mixed_passes`` turns mixed passes (a prefill pass also decodes the running requests,
    the scheduler's ``enable_mixed_chunk``) on or off in the scheduler settings the core is
    given; None keeps what the engine derives for the device.
    """
    config = EngineConfig(
        model_path=model_path,
        device=device,
        cuda_graphs=cuda_graphs,
        late_policy='deliver_late',
        max_running_requests=max_running_requests,
    )
    parts = assemble_core(config)
    if mixed_passes is not None:
        scheduler_config = dataclasses.replace(
            parts.scheduler_config, enable_mixed_chunk=mixed_passes
        )
        parts = dataclasses.replace(parts, scheduler_config=scheduler_config)
    return ScheduledCore(parts)


def fresh_frame(seed: int, size: int = FRAME_SIZE) -> np.ndarray:
    """A random RGB frame: a new content hash every time, as a camera's would be."""
    return np.random.default_rng(seed).integers(0, 256, (size, size, 3), dtype=np.uint8)


def camera_request(
    robot: int, seq: int, *, stamp_ns: int, deadline_ns: int, num_state: int,
    num_images: int = 1,
) -> StepRequest:  # fmt: skip
    """Step ``seq`` of ``robot_<robot>`` with a fresh random frame per camera, sent now."""
    seed = zlib.crc32(f'{robot}/{seq}/{stamp_ns}'.encode())
    others = tuple(
        fresh_frame(zlib.crc32(f'{robot}/{seq}/{stamp_ns}/{camera}'.encode()))
        for camera in range(1, num_images)
    )
    return step_request(
        robot, seq, stamp_ns=stamp_ns, deadline_ns=deadline_ns, received_ns=time.time_ns(),
        frame=fresh_frame(seed), num_state=num_state, other_frames=others,
    )  # fmt: skip


# --- the checked run ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CheckedRun:
    """What a checked run saw: every step's ending, and how many integrity checks passed."""

    num_robots: int
    num_steps_sent: int
    num_results: int
    num_failures: int
    failure_reasons: dict[str, int]
    num_integrity_checks: int
    action_shape: tuple[int, ...]
    seconds: float


class StepLedgerError(AssertionError):
    """A step ended twice, never ended, or an ending named no sent step."""


def run_checked(
    core: ScheduledCore, *, num_robots: int, steps_per_robot: int, timeout_s: float = 300.0
) -> CheckedRun:
    """Drive ``num_robots`` robots for ``steps_per_robot`` steps each (see the module doc)."""
    started = time.monotonic()
    num_state = core.info.num_state
    next_seq = dict.fromkeys(range(num_robots), 1)
    open_steps: set[tuple[str, int]] = set()
    ended: dict[tuple[str, int], str] = {}
    reasons: dict[str, int] = {}
    action_shape: tuple[int, ...] = ()
    num_checks = 0

    def end(out: StepResult | StepFailure) -> None:
        nonlocal action_shape
        key = (out.robot_id, out.step_seq)
        if key in ended:
            raise StepLedgerError(f'step {key} ended twice ({ended[key]}, then again)')
        if key not in open_steps:
            raise StepLedgerError(f'an ending for a step never sent: {key}')
        open_steps.discard(key)
        if isinstance(out, StepResult):
            ended[key] = 'result'
            if not np.isfinite(out.actions).all():
                raise AssertionError(f'step {key}: non-finite actions')
            if action_shape and out.actions.shape != action_shape:
                raise AssertionError(f'step {key}: actions {out.actions.shape} != {action_shape}')
            action_shape = out.actions.shape
        else:
            ended[key] = f'failure {out.reason.name}'
            reasons[out.reason.name] = reasons.get(out.reason.name, 0) + 1

    def send(robot: int) -> None:
        seq = next_seq[robot]
        next_seq[robot] += 1
        now = time.time_ns()
        request = camera_request(
            robot, seq, stamp_ns=now, deadline_ns=now + 60 * 10**9, num_state=num_state,
            num_images=core.info.num_images,
        )  # fmt: skip
        open_steps.add((request.robot_id, seq))
        for failure in core.submit(request, now):
            end(failure)

    for robot in next_seq:
        send(robot)
    while open_steps or core.has_work():
        if time.monotonic() - started > timeout_s:
            raise StepLedgerError(f'steps never ended within {timeout_s} s: {sorted(open_steps)}')
        outs = core.step(time.time_ns())
        core.check_integrity()
        num_checks += 1
        for out in outs:
            end(out)
            if next_seq[robot_index(out.robot_id)] <= steps_per_robot:
                send(robot_index(out.robot_id))
        if open_steps and not core.has_work():
            raise StepLedgerError(f'the core is idle with steps open: {sorted(open_steps)}')
    num_sent = sum(seq - 1 for seq in next_seq.values())
    if len(ended) != num_sent:
        raise StepLedgerError(f'{num_sent} steps sent, {len(ended)} ended')
    num_results = sum(1 for how in ended.values() if how == 'result')
    return CheckedRun(
        num_robots=num_robots,
        num_steps_sent=num_sent,
        num_results=num_results,
        num_failures=num_sent - num_results,
        failure_reasons=reasons,
        num_integrity_checks=num_checks,
        action_shape=tuple(action_shape),
        seconds=time.monotonic() - started,
    )


# --- the paced run --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PacedPlan:
    """Robot counts and durations of a paced run; validated without I/O."""

    robot_counts: tuple[int, ...] = (1, 4, 8, 12, 16, 32)
    period_s: float = 0.1
    deadline_ms: float = 100.0
    warmup_s: float = 1.0
    duration_s: float = 4.0
    drain_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        if not self.robot_counts or min(self.robot_counts) < 1:
            raise ValueError(f'robot_counts must be >= 1, got {self.robot_counts}')
        for name in ('period_s', 'deadline_ms', 'duration_s', 'drain_timeout_s'):
            if not getattr(self, name) > 0:
                raise ValueError(f'{name} must be > 0, got {getattr(self, name)}')
        if self.warmup_s < 0:
            raise ValueError(f'warmup_s must be >= 0, got {self.warmup_s}')


@dataclass(frozen=True, slots=True)
class PacedPoint:
    """One robot count's judged window (milliseconds, counts, actions per second)."""

    num_robots: int
    window_s: float
    num_sent: int
    num_results: int
    num_failures: int
    num_on_time: int
    num_superseded_frames: int
    latency_ms_p50: float  # send to result
    latency_ms_p99: float
    age_ms_p99: float  # frame stamp to result
    deadline_met_share: float
    actions_per_s: float
    target_actions_per_s: float
    capacity: CapacityMeasure  # the window's measure for the capacity rule


def run_paced(core: ScheduledCore, plan: PacedPlan) -> list[PacedPoint]:
    """Each robot count of ``plan`` in turn on the same core (see the module docstring)."""
    return [_paced_point(core, plan, n) for n in plan.robot_counts]


def _paced_point(core: ScheduledCore, plan: PacedPlan, num_robots: int) -> PacedPoint:
    timing = FleetTiming(
        period_s=plan.period_s, budget_s=plan.deadline_ms / 1e3, warmup_s=plan.warmup_s,
        duration_s=plan.duration_s, phases='spread',
    )  # fmt: skip
    fleet = Fleet(num_robots, timing, start_ns=time.time_ns())
    sent: dict[int, tuple[int, int]] = {}  # robot: stamp, sent
    judged = fleet.window
    latencies, ages, horizons = [], [], set()
    counts = {'sent': 0, 'results': 0, 'failures': 0}

    def send(step) -> None:
        while step is not None:
            now = time.time_ns()
            request = camera_request(
                step.robot, step.seq, stamp_ns=step.stamp_ns, deadline_ns=step.deadline_ns,
                num_state=core.info.num_state, num_images=core.info.num_images,
            )  # fmt: skip
            sent[step.robot] = (step.stamp_ns, now)
            counts['sent'] += int(judged[0] <= step.stamp_ns < judged[1])
            step = None
            for failure in core.submit(request, now):
                step = ended(failure, time.time_ns())

    def ended(out: StepResult | StepFailure, now: int):
        robot = robot_index(out.robot_id)
        stamp, sent_ns = sent.pop(robot)
        delivered = isinstance(out, StepResult)
        if judged[0] <= stamp < judged[1]:
            counts['results' if delivered else 'failures'] += 1
            if delivered:
                horizons.add(out.actions.shape[0])
                latencies.append((now - sent_ns) / 1e6)
                ages.append((now - stamp) / 1e6)
        return fleet.ended(robot, now, delivered=delivered)

    drain_end = judged[1] + round(plan.drain_timeout_s * 1e9)
    while not fleet.done():
        now = time.time_ns()
        if now > drain_end:
            raise TimeoutError(f'{num_robots} robots: steps still open {plan.drain_timeout_s} s '
                               'after the window')  # fmt: skip
        for step in fleet.images_until(now):
            send(step)
        if core.has_work():
            for out in core.step(now):
                send(ended(out, time.time_ns()))
        else:
            due = fleet.next_image_ns()
            time.sleep(max(0, due - now) / 1e9 if due is not None else 0.0)
    for robot in range(num_robots):
        core.close_session(f'robot_{robot}')
    while core.has_work():
        core.step(time.time_ns())
    measure = fleet.measure()
    horizon = max(horizons, default=0)
    num_ended = counts['results'] + counts['failures']
    num_on_time = sum(e.on_time for e in fleet.ends if judged[0] <= e.stamp_ns < judged[1])
    return PacedPoint(
        num_robots=num_robots,
        window_s=plan.duration_s,
        num_sent=counts['sent'],
        num_results=counts['results'],
        num_failures=counts['failures'],
        num_on_time=num_on_time,
        num_superseded_frames=fleet.num_superseded,
        latency_ms_p50=percentile(latencies, 50),
        latency_ms_p99=percentile(latencies, 99),
        age_ms_p99=percentile(ages, 99),
        deadline_met_share=num_on_time / num_ended if num_ended else math.nan,
        actions_per_s=counts['results'] * horizon / plan.duration_s,
        target_actions_per_s=num_robots * horizon / plan.period_s,
        capacity=measure,
    )


def markdown_table(points: list[PacedPoint], *, criteria: CapacityCriteria | None = None) -> str:
    """A row per point; with ``criteria``, a last column with its verdict under them."""
    headers = ['robots', 'steps sent / results / failures', 'latency p50 ms', 'latency p99 ms']
    headers += ['frame age p99 ms', 'deadline met', 'actions/s', 'target', 'superseded frames']
    rows = [
        [
            p.num_robots,
            f'{p.num_sent} / {p.num_results} / {p.num_failures}',
            p.latency_ms_p50,
            p.latency_ms_p99,
            p.age_ms_p99,
            f'{100 * p.deadline_met_share:.0f}%',
            p.actions_per_s,
            f'{p.target_actions_per_s:.0f}',
            p.num_superseded_frames,
        ]
        for p in points
    ]
    if criteria is not None:
        headers.append('verdict')
        for row, p in zip(rows, points, strict=True):
            failures = criteria.failures(p.capacity)
            row.append('pass' if not failures else 'fail: ' + '; '.join(failures))
    return render_table(headers, rows, digits=1)


def search_paced_capacity(
    core: ScheduledCore,
    plan: PacedPlan,
    criteria: CapacityCriteria,
    *,
    max_robots: int,
    bisect: bool = False,
    first_probe: int | None = None,
    on_point: Callable[[PacedPoint], None] | None = None,
) -> tuple[CapacitySearch, list[PacedPoint]]:
    """The capacity of ``core``, a paced window per count: the ladder search up to
    ``max_robots`` (refined), or with ``bisect`` the bisection (``first_probe`` first after
    1 robot); the search and its points in the order measured."""
    points: list[PacedPoint] = []

    def measure(num_robots: int) -> CapacityMeasure:
        (point,) = run_paced(core, dataclasses.replace(plan, robot_counts=(num_robots,)))
        points.append(point)
        if on_point is not None:
            on_point(point)
        return point.capacity

    if bisect:
        search = bisect_capacity(
            'engine core', max_robots, measure, criteria, first_probe=first_probe
        )
    else:
        search = search_capacity(
            'engine core', robot_ladder(max_robots), measure, criteria, refine=True
        )
    return search, points


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault('HF_HUB_OFFLINE', '1')
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--robots', type=int, nargs='+', default=[1, 4, 8, 12, 16, 32])
    parser.add_argument('--period', type=float, default=0.1, help='camera period s')
    parser.add_argument('--deadline-ms', type=float, default=100.0, help='after the stamp')
    parser.add_argument('--warmup', type=float, default=1.0, help='seconds before each window')
    parser.add_argument('--duration', type=float, default=4.0, help='measured seconds per count')
    parser.add_argument('--capacity', action='store_true', help='search the capacity instead')
    parser.add_argument('--max-robots', type=int, default=32, help='capacity: ladder top')
    parser.add_argument(
        '--bisect', action='store_true', help='capacity: bisect instead of the ladder'
    )
    parser.add_argument(
        '--mixed-passes',
        choices=('engine', 'on', 'off'),
        default='engine',
        help="mixed passes on, off, or the engine's default for the device",
    )
    parser.add_argument('--model-path', default='', help='checkpoint (default: the tiny one)')
    parser.add_argument('--device', choices=('cpu', 'cuda'), default='cpu')
    parser.add_argument('--cuda-graphs', action='store_true', help='replay decode as graphs')
    parser.add_argument('--json', default='', help='write the points here')
    args = parser.parse_args(argv)
    try:
        plan = PacedPlan(
            tuple(args.robots), args.period, args.deadline_ms, warmup_s=args.warmup,
            duration_s=args.duration,
        )  # fmt: skip
        robot_ladder(args.max_robots)
    except ValueError as exc:
        parser.error(str(exc))
    mixed = {'engine': None, 'on': True, 'off': False}[args.mixed_passes]
    core = make_core(
        args.model_path, device=args.device, cuda_graphs=args.cuda_graphs, mixed_passes=mixed
    )
    if args.capacity:
        criteria = CapacityCriteria()
        search, points = search_paced_capacity(
            core, plan, criteria, max_robots=args.max_robots, bisect=args.bisect,
            on_point=lambda p: print(markdown_table([p]).splitlines()[-1], flush=True),
        )  # fmt: skip
        print(f'\n{headline_table([search])}\n\n{steps_table([search])}')
    else:
        points = run_paced(core, plan)
        print(markdown_table(points))
    if args.json:
        rows = [dataclasses.asdict(p) for p in points]
        Path(args.json).write_text(json.dumps({'points': rows}, indent=1) + '\n')
    return 0


if __name__ == '__main__':
    sys.exit(main())
