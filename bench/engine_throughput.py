"""Ceiling of each engine core without ROS: N robots always waiting, steps per second.

Both engine cores (``scheduled``: scheduler + paged KV + model runner; ``sequential``: one
step at a time through transformers ``generate``) are driven in this process, with no
frontend, no transport and no simulated robots: every robot sends its next step (a fresh
frame) the moment the previous one ends, so the core never waits. What a core delivers here
bounds what any node built on it can deliver on the same machine, and where the time goes
inside the scheduled core (model runner, the scheduler's own work, the core's glue around
it: prompts, sessions, action decoding) says what limits it.

    python bench/engine_throughput.py --robots 1 8 16 --duration 10
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault('HF_HUB_OFFLINE', '1')
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


from bench.engine_steps import step_request
from bench.scheduler_cost import StopWatch
from vla_sched.engine.config import CORES, EngineConfig
from vla_sched.engine.core_factory import build_core
from vla_sched.ipc.messages import StepResult


@dataclass(frozen=True, slots=True)
class Throughput:
    """One core at one robot count (times in ms per step delivered, except ``step_ms``)."""

    core: str
    num_robots: int
    steps_per_s: float
    step_ms_p50: float  # submit to result, per step
    model_ms: float
    scheduler_ms: float
    glue_ms: float


def measure(
    core_name: str,
    num_robots: int,
    *,
    duration_s: float,
    model_path: str,
    device: str,
    threads: int,
) -> Throughput:
    core = build_core(
        EngineConfig(core=core_name, model_path=model_path, device=device, cpu_threads=threads)
    )
    model, sched, frames = StopWatch(), StopWatch(), StopWatch()
    make_request = frames.wrap(
        lambda robot, seq, now: step_request(robot, seq, now_ns=now, budget_s=60.0)
    )
    if core_name == 'scheduled':
        runner = core.scheduler.runner
        runner.launch = model.wrap(runner.launch)
        core.scheduler.run_once = sched.wrap(core.scheduler.run_once)
    else:
        core._generate = model.wrap(core._generate)
    seqs = [1] * num_robots
    sent = {}
    for robot in range(num_robots):
        now = time.time_ns()
        core.submit(make_request(robot, 1, now), now)
        sent[robot] = now
    latencies, done = [], 0
    warmup_end = time.monotonic() + min(2.0, duration_s)
    start = None
    while True:
        if start is None and time.monotonic() >= warmup_end:
            start, done, latencies = time.monotonic(), 0, []
            model.ns = sched.ns = frames.ns = 0
            busy_start = time.process_time()
        if start is not None and time.monotonic() - start >= duration_s:
            break
        for out in core.step(time.time_ns()):
            robot = int(out.robot_id.split('_')[1])
            now = time.time_ns()
            if isinstance(out, StepResult):
                done += 1
                latencies.append((now - sent[robot]) / 1e6)
            seqs[robot] += 1
            core.submit(make_request(robot, seqs[robot], now), now)
            sent[robot] = now
    elapsed = time.monotonic() - start
    busy_ms = (time.process_time() - busy_start) * 1e3 - frames.ns / 1e6  # robots' side
    core.close()
    per = max(1, done)
    model_ms = model.ns / 1e6
    sched_ms = max(0.0, sched.ns / 1e6 - model_ms) if core_name == 'scheduled' else 0.0
    return Throughput(
        core=core_name,
        num_robots=num_robots,
        steps_per_s=done / elapsed,
        step_ms_p50=statistics.median(latencies) if latencies else float('nan'),
        model_ms=model_ms / per,
        scheduler_ms=sched_ms / per,
        glue_ms=max(0.0, busy_ms - model_ms - sched_ms) / per,
    )


def markdown_table(rows: list[Throughput]) -> str:
    lines = [
        '| robots | core | steps/s | submit to result p50 ms | per step: model ms | scheduler ms '
        '| glue ms | scheduled / sequential |',
        '|---|---|---|---|---|---|---|---|',
    ]
    rate = {(r.core, r.num_robots): r.steps_per_s for r in rows}
    for r in rows:
        seq = rate.get(('sequential', r.num_robots))
        ratio = f'{r.steps_per_s / seq:.2f}x' if r.core == 'scheduled' and seq else ''
        lines.append(
            f'| {r.num_robots} | {r.core} | {r.steps_per_s:.1f} | {r.step_ms_p50:.1f} '
            f'| {r.model_ms:.2f} | {r.scheduler_ms:.2f} | {r.glue_ms:.2f} | {ratio} |'
        )
    return '\n'.join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--robots', type=int, nargs='+', default=[1, 8, 16])
    parser.add_argument('--duration', type=float, default=10.0, help='measured seconds')
    parser.add_argument('--cores', nargs='+', choices=CORES, default=list(CORES))
    parser.add_argument('--model-path', default='', help='checkpoint (default: the tiny one)')
    parser.add_argument('--device', choices=('cpu', 'cuda'), default='cpu')
    parser.add_argument('--threads', type=int, default=1, help='torch threads on the CPU')
    args = parser.parse_args(argv)
    if min(args.robots) < 1 or args.duration <= 0 or args.threads < 1:
        parser.error('--robots and --threads must be >= 1, --duration > 0')
    rows = []
    for n in args.robots:
        for core in args.cores:
            rows.append(
                measure(
                    core,
                    n,
                    duration_s=args.duration,
                    model_path=args.model_path,
                    device=args.device,
                    threads=args.threads,
                )
            )
            r = rows[-1]
            print(f'{core:>10} N={n:<3} {r.steps_per_s:6.1f} steps/s', flush=True)
    print()
    print(markdown_table(rows))
    return 0


if __name__ == '__main__':
    sys.exit(main())
