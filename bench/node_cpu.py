"""The vla_sched node's own CPU: at idle, with one robot, with sixteen.

Starts the node (``python -m vla_sched.ros.node``, engine in its own process, the tiny
checkpoint on the CPU unless ``--model-path`` is given) configured for ``--configured``
robots, as ``bench/control_loop.py`` does, and waits until its engine is ready. Then, for
each count in ``--active`` (0: engine up, no robot publishing), it runs that many simulated
robots (``bench/lib/ros_fleet.py``: a camera image and a joint state at ``--camera-rate``, a
step per image) and measures ``--windows`` windows of ``--duration`` seconds:

- node CPU: user + system time of the node process (``/proc/<pid>/stat``, through psutil)
  over the window, in percent of one core; the same for the engine process;
- chunks/s the robots received, so a quiet node is not mistaken for an efficient one;
- the 1-minute load average at the end of the window: the machine is shared, and a busy
  machine shows in the node's wake-up latency rather than in its CPU time.

Each line gives the median window and the min-max.

    python -m bench.node_cpu                                # idle, 1 and 16 robots, ~2 min
    python -m bench.node_cpu --active 0 1 --duration 5 --windows 1
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.control_loop import Server, Watch, parse_node_param, ros_env, wait_ready
from bench.control_loop_report import TRIGGERS, LoopPlan
from bench.lib.ros_fleet import FleetConfig, RobotFleet
from vla_sched.engine.config import DEVICES


@dataclasses.dataclass(frozen=True, slots=True)
class CpuWindow:
    """One measurement window."""

    duration_s: float
    node_cpu_pct: float  # of one core
    engine_cpu_pct: float
    chunks_per_s: float
    load_avg_1m: float


@dataclasses.dataclass(frozen=True, slots=True)
class CpuPoint:
    """One active-robot count: its windows."""

    num_active: int
    windows: list[CpuWindow]

    def median(self, name: str) -> float:
        return statistics.median(getattr(w, name) for w in self.windows)

    def spread(self, name: str) -> tuple[float, float]:
        values = [getattr(w, name) for w in self.windows]
        return min(values), max(values)


def measure(server: Server, watch: Watch, fleet: RobotFleet | None, duration_s: float):
    """CPU of the node and its engine over ``duration_s`` of spinning the watch."""
    before = server.cpu_seconds()
    started = time.monotonic()
    if fleet is not None:
        fleet.start_window()
    watch.spin(duration_s)
    chunks = fleet.end_window().num_chunks if fleet is not None else 0
    elapsed = time.monotonic() - started
    after = server.cpu_seconds()
    return CpuWindow(
        duration_s=elapsed,
        node_cpu_pct=100 * (after['node'] - before['node']) / elapsed,
        engine_cpu_pct=100 * (after['engine'] - before['engine']) / elapsed,
        chunks_per_s=chunks / elapsed,
        load_avg_1m=os.getloadavg()[0],
    )


def run_point(server: Server, watch: Watch, num_active: int, args) -> CpuPoint:
    fleet = None
    if num_active:
        fleet = RobotFleet(num_active, FleetConfig(camera_rate_hz=args.camera_rate))
    try:
        if fleet is not None:
            end = time.monotonic() + max(30.0, 2.0 * num_active)
            while not fleet.wait_for_chunks(0.0) and time.monotonic() < end:
                if server.proc.poll() is not None:
                    raise RuntimeError(f'the node exited:\n{server.log()[-3000:]}')
                watch.spin(0.2)
        watch.spin(args.warmup)
        windows = [measure(server, watch, fleet, args.duration) for _ in range(args.windows)]
    finally:
        if fleet is not None:
            fleet.close()
    return CpuPoint(num_active, windows)


def format_point(point: CpuPoint) -> str:
    lo, hi = point.spread('node_cpu_pct')
    return (
        f'{point.num_active:>6} active | node {point.median("node_cpu_pct"):5.1f}% of a core '
        f'({lo:.1f}-{hi:.1f}) | engine {point.median("engine_cpu_pct"):5.1f}% | '
        f'{point.median("chunks_per_s"):6.1f} chunks/s | load avg '
        f'{point.median("load_avg_1m"):.2f}'
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--configured', type=int, default=16, help='robots the node serves')
    parser.add_argument('--active', type=int, nargs='+', default=[0, 1, 16])
    parser.add_argument('--camera-rate', type=float, default=10.0, help='images per second')
    parser.add_argument('--trigger', choices=TRIGGERS, default='on_image')
    parser.add_argument('--budget', type=float, default=0.5, help='deadline budget s')
    parser.add_argument('--warmup', type=float, default=3.0)
    parser.add_argument('--duration', type=float, default=10.0, help='window s')
    parser.add_argument('--windows', type=int, default=2)
    parser.add_argument('--model-path', default='', help='checkpoint (default: the tiny one)')
    parser.add_argument('--device', choices=DEVICES, default='cpu')
    parser.add_argument(
        '--node-param', nargs='*', default=[], metavar='NAME=VALUE', help='node parameters'
    )
    parser.add_argument('--json', default='', help='write the results here')
    args = parser.parse_args(argv)
    if max(args.active) > args.configured or min(args.active) < 0:
        parser.error('--active counts must be between 0 and --configured')
    if args.windows < 1 or args.duration <= 0:
        parser.error('--windows and --duration must be positive')
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    plan = LoopPlan(
        robot_counts=(args.configured,),
        period_s=1.0 / args.camera_rate,
        trigger=args.trigger,
        budget_s=args.budget,
        model_path=args.model_path,
        device=args.device,
        node_params=dict(parse_node_param(s) for s in args.node_param),
        systems=('scheduled',),
    )
    folder = Path(tempfile.mkdtemp(prefix='vla_node_cpu_'))
    env = ros_env(folder)
    print(
        f'node cpu: {args.configured} robots configured, active {args.active}, camera '
        f'{args.camera_rate:g} Hz, trigger {args.trigger}, {args.windows} x {args.duration:g} s '
        f'windows, {os.cpu_count()} cores, load avg {os.getloadavg()[0]:.2f}, logs in {folder}',
        flush=True,
    )
    server = Server('scheduled', plan, folder, env)
    watch = Watch()
    points = []
    try:
        wait_ready(server, watch, plan.start_timeout_s)
        for num_active in args.active:
            points.append(run_point(server, watch, num_active, args))
            print(format_point(points[-1]), flush=True)
    finally:
        watch.close()
        server.stop()
    if args.json:
        record = {'args': vars(args), 'points': [dataclasses.asdict(p) for p in points]}
        Path(args.json).write_text(json.dumps(record, indent=1) + '\n')
    return 0 if all(p.num_active == 0 or p.median('chunks_per_s') > 0 for p in points) else 1


if __name__ == '__main__':
    sys.exit(main())
