"""Engine soak: N robots step for a long time; memory must stay flat and no step may be lost.

The scheduled core is driven in this process (no ROS, no transport) the way the engine
process drives it: every robot keeps one step in flight and sends its next one, with a
fresh camera frame, the moment the previous one ends. Every step must end as exactly one
``StepResult`` or ``StepFailure`` (``num_lost`` counts those that ended zero or several
times), the scheduler's and the KV memory's invariants are checked every
``integrity_every`` steps (the engine's statistics are taken there too, as the engine
process does every ``stats_period_s``), and the process's resident memory (RSS) is read at
the start, after the warm-up and at the end. What the core keeps per robot (sessions, metrics, live
requests, the image feature cache, radix tree nodes) is reported at the end: it must be
bounded by the number of robots, not by the number of steps.

    python bench/soak.py --robots 8 --steps 40000 --json soak.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

os.environ.setdefault('HF_HUB_OFFLINE', '1')
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


from bench.engine_steps import step_request
from vla_sched.ipc.messages import StepFailure, StepResult
from vla_sched.serving.engine_config import EngineConfig
from vla_sched.serving.scheduled_core import ScheduledCore

PAGE_BYTES = os.sysconf('SC_PAGE_SIZE')


def rss_kb() -> float:
    """This process's resident set size in kB (Linux ``/proc/self/statm``)."""
    with open('/proc/self/statm') as f:
        return int(f.read().split()[1]) * PAGE_BYTES / 1024


@dataclass(frozen=True, slots=True)
class SoakConfig:
    """One soak: ``num_steps`` steps in all, shared by ``num_robots`` robots."""

    num_robots: int = 8
    num_steps: int = 40_000
    warmup_steps: int = 2_000
    integrity_every: int = 100
    image_size: int = 32
    kv_pool_tokens: int = 4096
    page_size: int = 16
    chunked_prefill_size: int = 256

    def __post_init__(self) -> None:
        for name in ('num_robots', 'num_steps', 'integrity_every', 'image_size'):
            if getattr(self, name) < 1:
                raise ValueError(f'{name} must be >= 1, got {getattr(self, name)}')
        if not 0 <= self.warmup_steps < self.num_steps:
            raise ValueError(
                f'warmup_steps ({self.warmup_steps}) must be in [0, num_steps={self.num_steps})'
            )


@dataclass(slots=True)
class SoakResult:
    """What a soak measured (RSS in kB; ``held``: what the core holds at the end)."""

    num_robots: int
    num_steps_sent: int = 0
    num_results: int = 0
    num_failures: int = 0
    num_lost: int = 0
    num_integrity_checks: int = 0
    failures_by_reason: dict[str, int] = field(default_factory=dict)
    rss_start_kb: float = 0.0
    rss_warm_kb: float = 0.0
    rss_end_kb: float = 0.0
    growth_per_step_after_warmup_kb: float = 0.0
    growth_per_step_last_half_kb: float = 0.0
    rss_samples_kb: list[tuple[int, float]] = field(default_factory=list)
    held: dict[str, int] = field(default_factory=dict)
    wall_s: float = 0.0


def held_sizes(core: ScheduledCore) -> dict[str, int]:
    """How many entries the core's per-robot and per-request structures hold now."""
    scheduler, memory = core.scheduler, core.memory
    sizes = {
        'sessions': len(memory.sessions),
        'metrics_robots': len(scheduler.metrics.robots),
        'live_requests': len(scheduler.live_reqs()),
        'in_flight_robots': len(scheduler.robots.in_flight_steps()),
        'request_kv': len(memory.admitted_reqs()),
        'radix_nodes': sum(1 for _ in memory.tree.iter_nodes()),
    }
    feature_cache = getattr(scheduler.runner, 'feature_cache', None)
    if feature_cache is not None:
        sizes['feature_cache_entries'] = len(feature_cache)
    return sizes


def run_soak(config: SoakConfig, *, progress=None) -> SoakResult:
    """Run one soak of the scheduled core on the built-in tiny checkpoint.

    ``progress(done, rss_kb)`` is called after every ``integrity_every`` ended steps.
    """
    core = ScheduledCore.from_config(
        EngineConfig(
            kv_pool_tokens=config.kv_pool_tokens,
            page_size=config.page_size,
            chunked_prefill_size=config.chunked_prefill_size,
            device='cpu',
        )
    )
    result = SoakResult(num_robots=config.num_robots)
    open_steps: dict[tuple[str, int], None] = {}  # sent and not ended yet
    seqs = [0] * config.num_robots

    def send(robot: int) -> None:
        seqs[robot] += 1
        request = step_request(
            robot, seqs[robot], now_ns=time.time_ns(), image_size=config.image_size
        )
        open_steps[(request.robot_id, request.step_seq)] = None
        result.num_steps_sent += 1
        for out in core.submit(request, time.time_ns()):
            end(out)

    def end(out: StepResult | StepFailure) -> bool:
        if open_steps.pop((out.robot_id, out.step_seq), False) is not None:
            result.num_lost += 1  # ended twice, or a step never sent
            return False
        if isinstance(out, StepResult):
            result.num_results += 1
        else:
            result.num_failures += 1
            reason = out.reason.value
            result.failures_by_reason[reason] = result.failures_by_reason.get(reason, 0) + 1
        return True

    started = time.monotonic()
    result.rss_start_kb = rss_kb()
    for robot in range(config.num_robots):
        send(robot)
    num_ended = next_check = next_sample = 0
    sample_every = max(config.integrity_every, config.num_steps // 100)
    idle_iterations = 0
    while num_ended < config.num_steps:
        outs = core.step(time.time_ns())
        idle_iterations = 0 if outs else idle_iterations + 1
        if idle_iterations > 10_000:
            break  # the core holds steps it never ends: they count as lost below
        for out in outs:
            if not end(out):
                continue
            num_ended += 1
            if num_ended == config.warmup_steps:
                result.rss_warm_kb = rss_kb()
                result.rss_samples_kb.append((num_ended, result.rss_warm_kb))
            robot = int(out.robot_id.rsplit('_', 1)[1])
            if result.num_steps_sent < config.num_steps:
                send(robot)
        if num_ended >= next_check:
            core.check_integrity()
            core.stats(time.time_ns())
            result.num_integrity_checks += 1
            next_check = num_ended + config.integrity_every
            rss = rss_kb()
            if num_ended > config.warmup_steps and num_ended >= next_sample:
                result.rss_samples_kb.append((num_ended, rss))
                next_sample = num_ended + sample_every
            if progress is not None:
                progress(num_ended, rss)
    while core.has_work() and idle_iterations < 10_000:
        outs = core.step(time.time_ns())
        idle_iterations = 0 if outs else idle_iterations + 1
        for out in outs:
            end(out)
    core.check_integrity()
    result.num_integrity_checks += 1
    result.num_lost += len(open_steps)
    result.rss_end_kb = rss_kb()
    if not config.warmup_steps:
        result.rss_warm_kb = result.rss_start_kb
    measured = max(1, config.num_steps - config.warmup_steps)
    result.growth_per_step_after_warmup_kb = (result.rss_end_kb - result.rss_warm_kb) / measured
    result.rss_samples_kb.append((num_ended, result.rss_end_kb))
    result.growth_per_step_last_half_kb = _last_half_slope(result.rss_samples_kb)
    result.held = held_sizes(core)
    core.close()
    result.wall_s = time.monotonic() - started
    return result


def _last_half_slope(samples: list[tuple[int, float]]) -> float:
    """RSS growth per step over the second half of the samples (0 with fewer than 2)."""
    half = samples[len(samples) // 2 :]
    if len(half) < 2 or half[-1][0] == half[0][0]:
        return 0.0
    return (half[-1][1] - half[0][1]) / (half[-1][0] - half[0][0])


def report(result: SoakResult) -> str:
    lines = [
        f'robots {result.num_robots}, steps sent {result.num_steps_sent}, '
        f'results {result.num_results}, failures {result.num_failures} '
        f'{result.failures_by_reason or ""}, lost {result.num_lost}',
        f'integrity checks passed: {result.num_integrity_checks}',
        f'RSS start {result.rss_start_kb / 1024:.1f} MB, after warm-up '
        f'{result.rss_warm_kb / 1024:.1f} MB, end {result.rss_end_kb / 1024:.1f} MB',
        f'growth after warm-up: {result.growth_per_step_after_warmup_kb * 1024:.1f} bytes/step'
        f' (second half: {result.growth_per_step_last_half_kb * 1024:.1f} bytes/step)',
        f'held at the end: {result.held}',
        f'wall time {result.wall_s:.0f} s',
    ]
    return '\n'.join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--robots', type=int, default=8)
    parser.add_argument('--steps', type=int, default=40_000, help='steps in all')
    parser.add_argument('--warmup', type=int, default=2_000, help='steps before the RSS base')
    parser.add_argument('--integrity-every', type=int, default=100, help='steps between checks')
    parser.add_argument('--image-size', type=int, default=32, help='camera frame side (pixels)')
    parser.add_argument('--json', type=Path, help='write the result here')
    args = parser.parse_args(argv)
    try:
        config = SoakConfig(
            num_robots=args.robots,
            num_steps=args.steps,
            warmup_steps=args.warmup,
            integrity_every=args.integrity_every,
            image_size=args.image_size,
        )
    except ValueError as e:
        parser.error(str(e))
    every = max(1, args.steps // 20)
    last = [0]

    def progress(done: int, rss: float) -> None:
        if done - last[0] >= every:
            last[0] = done
            print(f'{done:>7} steps  RSS {rss / 1024:8.1f} MB', flush=True)

    result = run_soak(config, progress=progress)
    print(report(result))
    if args.json is not None:
        args.json.write_text(json.dumps(asdict(result), indent=1) + '\n')
    return 0 if result.num_lost == 0 else 1


if __name__ == '__main__':
    sys.exit(main())
