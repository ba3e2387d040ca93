"""The engine core driven the way a node drives it, without ROS: checked and paced runs.

``ScheduledCore`` (scheduler, paged KV, the checkpoint's model runner) is driven in this
process, one ``step`` per scheduler iteration, as the node's engine loop does; no rclpy, no
ZMQ, no cv_bridge is imported, so this runs on a bare GPU machine.

- ``run_checked``: a few robots, each sending its next step when the previous one ended;
  ``check_integrity()`` after every scheduler step, and every step must end as exactly one
  ``StepResult`` or ``StepFailure`` (none lost, none twice, none unknown), results with
  finite actions of the checkpoint's shape.
- ``run_paced``: N robots, each with a camera at ``period_s`` (phases spread over the
  period): a fresh frame is sent at once when its robot has no step in flight, else it waits
  and the newest waiting frame wins (the node's ``on_image`` trigger). Per robot count, after
  a warm-up, a window of ``duration_s`` is measured: step latency from send to result
  (p50/p99), the age of the frame at the result (stamp to result, p99), the share of ended
  steps that met their ``deadline_ms`` (a result no later than stamp + deadline), actions/s
  delivered against the target N x horizon / period, and frames superseded while waiting.
  The engine delivers late steps marked late (``late_policy='deliver_late'``), so the latencies
  are the real ones, not those of the steps that happened to fit.

    python bench/engine_paced.py --robots 1 4 --duration 3            # tiny checkpoint, CPU
    python bench/engine_paced.py --model-path DIR --device cuda --cuda-graphs --json out.json
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
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault('HF_HUB_OFFLINE', '1')
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from vla_sched.engine.config import EngineConfig
from vla_sched.engine.scheduled_core import ScheduledCore
from vla_sched.ipc.messages import StepFailure, StepRequest, StepResult

INSTRUCTION = 'pick up the red block'
FRAME_SIZE = 224


def make_core(
    model_path: str, *, device: str, cuda_graphs: bool, max_running_requests: int = 64
) -> ScheduledCore:
    """The engine core on ``model_path`` with late steps delivered (marked late)."""
    config = EngineConfig(
        model_path=model_path,
        device=device,
        cuda_graphs=cuda_graphs,
        late_policy='deliver_late',
        max_running_requests=max_running_requests,
    )
    return ScheduledCore.from_config(config)


def fresh_frame(seed: int, size: int = FRAME_SIZE) -> np.ndarray:
    """A random RGB frame: a new content hash every time, as a camera's would be."""
    return np.random.default_rng(seed).integers(0, 256, (size, size, 3), dtype=np.uint8)


def step_request(
    robot_id: str, seq: int, *, stamp_ns: int, deadline_ns: int, num_state: int
) -> StepRequest:
    return StepRequest(
        robot_id=robot_id,
        step_seq=seq,
        stamp_ns=stamp_ns,
        deadline_ns=deadline_ns,
        received_ns=time.time_ns(),
        image=fresh_frame(zlib.crc32(f'{robot_id}/{seq}'.encode())),
        state=np.zeros(num_state, np.float32),
        instruction=INSTRUCTION,
        instruction_version=1,
    )


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
    next_seq = dict.fromkeys((f'robot_{i}' for i in range(num_robots)), 1)
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

    def send(robot_id: str) -> None:
        seq = next_seq[robot_id]
        next_seq[robot_id] += 1
        now = time.time_ns()
        request = step_request(
            robot_id, seq, stamp_ns=now, deadline_ns=now + 60 * 10**9, num_state=num_state
        )
        open_steps.add((robot_id, seq))
        for failure in core.submit(request, now):
            end(failure)

    for robot_id in next_seq:
        send(robot_id)
    while open_steps or core.has_work():
        if time.monotonic() - started > timeout_s:
            raise StepLedgerError(f'steps never ended within {timeout_s} s: {sorted(open_steps)}')
        outs = core.step(time.time_ns())
        core.check_integrity()
        num_checks += 1
        for out in outs:
            end(out)
            if next_seq[out.robot_id] <= steps_per_robot:
                send(out.robot_id)
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
    """One robot count's measured window (milliseconds, counts, actions per second)."""

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


class _Robot:
    """A camera at a fixed period and at most one step in flight; the newest frame waits."""

    def __init__(self, robot_id: str, first_frame_ns: int) -> None:
        self.robot_id = robot_id
        self.next_frame_ns = first_frame_ns
        self.seq = 0
        self.in_flight: tuple[int, int, int] | None = None  # seq, stamp, sent
        self.waiting_stamp_ns: int | None = None


def run_paced(core: ScheduledCore, plan: PacedPlan) -> list[PacedPoint]:
    """Each robot count of ``plan`` in turn on the same core (see the module docstring)."""
    return [_paced_point(core, plan, n) for n in plan.robot_counts]


def _paced_point(core: ScheduledCore, plan: PacedPlan, num_robots: int) -> PacedPoint:
    period_ns = round(plan.period_s * 1e9)
    deadline_ns = round(plan.deadline_ms * 1e6)
    num_state = core.info.num_state
    start = time.time_ns()
    robots = {
        f'n{num_robots}_robot_{i}': _Robot(
            f'n{num_robots}_robot_{i}', start + i * period_ns // num_robots
        )
        for i in range(num_robots)
    }
    window_start = start + round(plan.warmup_s * 1e9)
    window_end = window_start + round(plan.duration_s * 1e9)
    latencies, ages = [], []
    num_sent = num_results = num_failures = num_on_time = num_superseded = horizon = 0

    def send(robot: _Robot, stamp_ns: int) -> None:
        nonlocal num_sent
        robot.seq += 1
        now = time.time_ns()
        request = step_request(
            robot.robot_id,
            robot.seq,
            stamp_ns=stamp_ns,
            deadline_ns=stamp_ns + deadline_ns,
            num_state=num_state,
        )
        robot.in_flight = (robot.seq, stamp_ns, now)
        if window_start <= now < window_end:
            num_sent += 1
        for failure in core.submit(request, now):
            ended(failure, now)

    def ended(out: StepResult | StepFailure, now: int) -> None:
        nonlocal num_results, num_failures, num_on_time, horizon
        robot = robots[out.robot_id]
        _, stamp_ns, sent_ns = robot.in_flight
        robot.in_flight = None
        if window_start <= now < window_end:
            if isinstance(out, StepResult):
                num_results += 1
                horizon = out.actions.shape[0]
                latencies.append((now - sent_ns) / 1e6)
                ages.append((now - stamp_ns) / 1e6)
                num_on_time += int(now - stamp_ns <= deadline_ns)
            else:
                num_failures += 1
        if robot.waiting_stamp_ns is not None:
            stamp, robot.waiting_stamp_ns = robot.waiting_stamp_ns, None
            send(robot, stamp)

    drain_end = window_end + round(plan.drain_timeout_s * 1e9)
    while True:
        now = time.time_ns()
        for robot in robots.values():
            while now < window_end and robot.next_frame_ns <= now:
                stamp = robot.next_frame_ns
                robot.next_frame_ns += period_ns
                if robot.in_flight is None:
                    send(robot, stamp)
                else:
                    num_superseded += int(robot.waiting_stamp_ns is not None)
                    robot.waiting_stamp_ns = stamp
        if core.has_work():
            for out in core.step(now):
                ended(out, time.time_ns())
        elif now >= window_end:
            break
        else:
            due = min(r.next_frame_ns for r in robots.values())
            time.sleep(max(0.0, min(due, window_end) - now) / 1e9)
        if now > drain_end:
            raise TimeoutError(f'{num_robots} robots: steps still open {plan.drain_timeout_s} s '
                               'after the window')  # fmt: skip
    for robot_id in robots:
        core.close_session(robot_id)
    while core.has_work():
        core.step(time.time_ns())
    num_ended = num_results + num_failures
    return PacedPoint(
        num_robots=num_robots,
        window_s=plan.duration_s,
        num_sent=num_sent,
        num_results=num_results,
        num_failures=num_failures,
        num_on_time=num_on_time,
        num_superseded_frames=num_superseded,
        latency_ms_p50=_pct(latencies, 50),
        latency_ms_p99=_pct(latencies, 99),
        age_ms_p99=_pct(ages, 99),
        deadline_met_share=num_on_time / num_ended if num_ended else float('nan'),
        actions_per_s=num_results * horizon / plan.duration_s,
        target_actions_per_s=num_robots * horizon / plan.period_s,
    )


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else math.nan


def markdown_table(points: list[PacedPoint]) -> str:
    lines = [
        '| robots | steps sent / results / failures | latency p50 ms | latency p99 ms '
        '| frame age p99 ms | deadline met | actions/s | target | superseded frames |',
        '|---|---|---|---|---|---|---|---|---|',
    ]
    for p in points:
        lines.append(
            f'| {p.num_robots} | {p.num_sent} / {p.num_results} / {p.num_failures} '
            f'| {p.latency_ms_p50:.1f} | {p.latency_ms_p99:.1f} | {p.age_ms_p99:.1f} '
            f'| {100 * p.deadline_met_share:.0f}% | {p.actions_per_s:.1f} '
            f'| {p.target_actions_per_s:.0f} | {p.num_superseded_frames} |'
        )
    return '\n'.join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--robots', type=int, nargs='+', default=[1, 4, 8, 12, 16, 32])
    parser.add_argument('--warmup', type=float, default=1.0, help='seconds before each window')
    parser.add_argument('--duration', type=float, default=4.0, help='measured seconds per count')
    parser.add_argument('--model-path', default='', help='checkpoint (default: the tiny one)')
    parser.add_argument('--device', choices=('cpu', 'cuda'), default='cpu')
    parser.add_argument('--cuda-graphs', action='store_true', help='replay decode as graphs')
    parser.add_argument('--json', default='', help='write the points here')
    args = parser.parse_args(argv)
    try:
        plan = PacedPlan(tuple(args.robots), warmup_s=args.warmup, duration_s=args.duration)
    except ValueError as exc:
        parser.error(str(exc))
    core = make_core(args.model_path, device=args.device, cuda_graphs=args.cuda_graphs)
    points = run_paced(core, plan)
    print(markdown_table(points))
    if args.json:
        rows = [dataclasses.asdict(p) for p in points]
        Path(args.json).write_text(json.dumps({'points': rows}, indent=1) + '\n')
    return 0


if __name__ == '__main__':
    sys.exit(main())
