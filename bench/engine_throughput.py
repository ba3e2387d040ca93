"""Ceiling of each engine core without ROS: N robots always waiting, steps per second.

Both engine cores (``scheduled``: scheduler + paged KV + model runner; ``sequential``: one
step at a time through transformers ``generate``) are driven in this process, with no
frontend, no transport and no simulated robots: every robot sends its next step (a fresh
frame) the moment the previous one ends, so the core never waits. What a core delivers here
bounds what any node built on it can deliver on the same machine, and where the time goes
inside the scheduled core (the model runner, timed by a runner wrapper given to the core;
the rest of each ``step``: the scheduler and action decoding; the core's ``submit`` and the
robots' side: prompts, sessions, frames) says what limits it. For the sequential core the
model's time is its whole ``step`` (one ``generate`` call).

    python -m bench.engine_throughput --robots 1 8 16 --duration 10
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from dataclasses import dataclass

from bench.lib.fleets import FrameSource, robot_index, step_request
from bench.lib.stats import percentile
from bench.lib.tables import markdown_table
from bench.scheduler_cost import StopWatch, TimedRunner
from vla_sched.engine.assembly import assemble_core
from vla_sched.engine.config import CORES, EngineConfig
from vla_sched.engine.scheduled_core import ScheduledCore
from vla_sched.engine.sequential_core import SequentialCore
from vla_sched.ipc.messages import StepResult


@dataclass(frozen=True, slots=True)
class Throughput:
    """One core at one robot count (times in ms per step delivered, except ``step_ms``)."""

    core: str
    num_robots: int
    steps_per_s: float
    step_ms_p50: float  # submit to result, per step
    model_ms: float
    scheduler_ms: float  # the rest of the core's step: scheduler, action decoding
    glue_ms: float  # submit and the robots' side


def measure(
    core_name: str,
    num_robots: int,
    *,
    duration_s: float,
    model_path: str,
    device: str,
    threads: int,
) -> Throughput:
    config = EngineConfig(
        core=core_name, model_path=model_path, device=device, cpu_threads=threads
    )
    model, stepping, frames = StopWatch(), StopWatch(), StopWatch()
    if core_name == 'scheduled':
        parts = assemble_core(config)
        core = ScheduledCore(dataclasses.replace(parts, runner=TimedRunner(parts.runner, model)))
        step = stepping.wrap(core.step)
    else:
        core = SequentialCore.from_config(config)
        step = model.wrap(core.step)
    source = FrameSource(width=64, height=64)
    far = 60 * 10**9

    def make_request(robot: int, seq: int, now: int):
        frame = source.frame(seq * 31 + robot)
        return step_request(
            robot, seq, stamp_ns=now, deadline_ns=now + far, received_ns=now, frame=frame,
            num_state=core.info.num_state,
        )  # fmt: skip

    make_request = frames.wrap(make_request)
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
            model.ns = stepping.ns = frames.ns = 0
            busy_start = time.process_time()
        if start is not None and time.monotonic() - start >= duration_s:
            break
        for out in step(time.time_ns()):
            robot = robot_index(out.robot_id)
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
    sched_ms = max(0.0, stepping.ns / 1e6 - model_ms) if core_name == 'scheduled' else 0.0
    return Throughput(
        core=core_name,
        num_robots=num_robots,
        steps_per_s=done / elapsed,
        step_ms_p50=percentile(latencies, 50),
        model_ms=model_ms / per,
        scheduler_ms=sched_ms / per,
        glue_ms=max(0.0, busy_ms - model_ms - sched_ms) / per,
    )


def throughput_table(rows: list[Throughput]) -> str:
    rate = {(r.core, r.num_robots): r.steps_per_s for r in rows}
    cells = []
    for r in rows:
        seq = rate.get(('sequential', r.num_robots))
        ratio = f'{r.steps_per_s / seq:.2f}x' if r.core == 'scheduled' and seq else ''
        cells.append(
            [
                r.num_robots,
                r.core,
                f'{r.steps_per_s:.1f}',
                f'{r.step_ms_p50:.1f}',
                r.model_ms,
                r.scheduler_ms,
                r.glue_ms,
                ratio,
            ]
        )
    headers = ['robots', 'core', 'steps/s', 'submit to result p50 ms', 'per step: model ms']
    headers += ['scheduler ms', 'glue ms', 'scheduled / sequential']
    return markdown_table(headers, cells)


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault('HF_HUB_OFFLINE', '1')
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
    print(throughput_table(rows))
    return 0


if __name__ == '__main__':
    sys.exit(main())
