"""Engine soak: N robots step for a long time; memory must stay flat and no step may be lost.

Every robot keeps one step in flight and sends its next one, with a fresh synthetic camera
frame, the moment the previous one ends. Two transports:

- ``zmq`` (the default): the engine in its own process, started as the node starts it
  (``EngineClient`` with its ZMQ link: ``python -m vla_sched.engine.main``, the
  message server, the codec, heartbeats both ways, statistics every second); this process is
  the frontend.
- ``inprocess``: the scheduled core driven in this process, no transport (its statistics
  are still taken every second, as the message server takes them).

Every step must end as exactly one ``StepResult`` or ``StepFailure`` (``num_lost`` counts
those that ended zero or several times, or were never sent); every result must carry finite
actions of the checkpoint's shape (``num_bad_results``). Inside the engine
(``bench/soak_probe.py``) the scheduler's and the KV memory's invariants are checked every
``integrity_every`` ended steps, and at the end it reports what the core holds per robot
(sessions, metrics, live requests, the image feature cache, radix tree nodes): bounded by
the number of robots, not by the number of steps. The engine's and this process's resident
memory (``VmRSS`` of ``/proc/<pid>/status``) are read at the start (engine ready, no step
sent), after the warm-up and at the end, and about every 1% of the steps in between; the
growth after the warm-up is given as a least-squares slope over those samples (kB/step).
``--trace-frames N`` also traces the engine's Python allocations (``tracemalloc``, N frames
deep) and reports the source lines whose held memory grew most after the warm-up.

    python -m bench.soak --robots 8 --steps 30000 --image-size 224 --json soak.json
    python -m bench.soak --transport inprocess --steps 30000 --image-size 224
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bench.lib.fleets import FrameSource, step_request
from bench.soak_probe import PROBE_ENV, ProbeConfig, ProbedCore, ProbeReport, probe_env
from vla_sched.engine.config import EngineConfig, EngineLinkConfig
from vla_sched.ipc.messages import EngineStats, StepFailure, StepResult

ROOT = Path(__file__).resolve().parents[1]
TRANSPORTS = ('zmq', 'inprocess')
PROBE_SITE_DIR = ROOT / 'bench' / 'soak_site'  # holds the sitecustomize that installs the probe
POLL_S = 0.05


def vmrss_kb(pid: int) -> float:
    """Resident set size of process ``pid`` in kB (``VmRSS`` in ``/proc/<pid>/status``)."""
    with open(f'/proc/{pid}/status') as f:
        for line in f:
            if line.startswith('VmRSS:'):
                return float(line.split()[1])
    raise RuntimeError(f'no VmRSS for process {pid}')


@dataclass(frozen=True, slots=True)
class SoakConfig:
    """One soak: ``num_steps`` steps in all, shared by ``num_robots`` robots.

    A step is due ``step_budget_ms`` after it is sent (the default is never missed; a short
    one makes the engine drop steps, so its failure paths are soaked too).
    ``trace_frames`` > 0 traces the engine's Python allocations that many frames deep (slow:
    for finding a growth, not for measuring RSS). A soak ends early when no step has ended
    for ``stall_timeout_s``.
    """

    num_robots: int = 8
    num_steps: int = 40_000
    warmup_steps: int = 2_000
    integrity_every: int = 100
    image_size: int = 32
    kv_pool_tokens: int = 4096
    page_size: int = 16
    chunked_prefill_size: int = 256
    step_budget_ms: float = 600_000.0
    transport: str = 'zmq'
    trace_frames: int = 0
    stall_timeout_s: float = 120.0

    def __post_init__(self) -> None:
        for name in ('num_robots', 'num_steps', 'integrity_every', 'image_size'):
            if getattr(self, name) < 1:
                raise ValueError(f'{name} must be >= 1, got {getattr(self, name)}')
        if not 0 <= self.warmup_steps < self.num_steps:
            raise ValueError(
                f'warmup_steps ({self.warmup_steps}) must be in [0, num_steps={self.num_steps})'
            )
        if self.transport not in TRANSPORTS:
            raise ValueError(f'transport must be one of {TRANSPORTS}, got {self.transport!r}')
        if self.step_budget_ms <= 0:
            raise ValueError(f'step_budget_ms must be > 0, got {self.step_budget_ms}')
        if self.trace_frames < 0:
            raise ValueError(f'trace_frames must be >= 0, got {self.trace_frames}')

    def engine_config(self) -> EngineConfig:
        return EngineConfig(
            kv_pool_tokens=self.kv_pool_tokens,
            page_size=self.page_size,
            chunked_prefill_size=self.chunked_prefill_size,
            device='cpu',
        )


@dataclass(slots=True)
class SoakResult:
    """What a soak measured. RSS in kB: ``rss_*`` of the engine's process, ``client_rss_*`` of
    the frontend's (the same process in-process); samples are ``(ended steps, kB)``.

    ``engine_memory``: the engine's traced Python memory and glibc heap counts after the
    warm-up and at the end, and the lines whose held memory grew most (``--trace-frames``).
    ``stopped_early``: why the soak ended before its last step ('' when it did not).
    """

    transport: str
    num_robots: int
    num_steps_sent: int = 0
    num_results: int = 0
    num_failures: int = 0
    num_lost: int = 0
    num_bad_results: int = 0
    num_integrity_checks: int = 0
    num_integrity_failures: int = 0
    integrity_failures: list[str] = field(default_factory=list)
    failures_by_reason: dict[str, int] = field(default_factory=dict)
    rss_start_kb: float = 0.0
    rss_warm_kb: float = 0.0
    rss_end_kb: float = 0.0
    growth_per_step_after_warmup_kb: float = 0.0
    growth_per_step_last_half_kb: float = 0.0
    rss_fit_kb_per_step: float = 0.0
    client_rss_start_kb: float = 0.0
    client_rss_warm_kb: float = 0.0
    client_rss_end_kb: float = 0.0
    client_rss_fit_kb_per_step: float = 0.0
    rss_samples_kb: list[tuple[int, float]] = field(default_factory=list)
    client_rss_samples_kb: list[tuple[int, float]] = field(default_factory=list)
    held: dict[str, int] = field(default_factory=dict)
    engine_memory: dict[str, Any] = field(default_factory=dict)
    num_engine_stats: int = 0
    num_bad_frames_from_engine: int = 0
    num_bad_frames_at_engine: int = 0
    engine_pid: int = 0
    stopped_early: str = ''
    wall_s: float = 0.0

    @property
    def passed(self) -> bool:
        """Every step ended once with a well-formed outcome, and every check held."""
        return not (
            self.num_lost or self.num_bad_results or self.num_integrity_failures
            or self.stopped_early or self.num_bad_frames_from_engine
            or self.num_bad_frames_at_engine
        )  # fmt: skip


# --- the two engines --------------------------------------------------------------------


class _InProcessEngine:
    """The scheduled core in this process, probed; statistics every ``stats_period_s``."""

    def __init__(self, config: SoakConfig, probe: ProbeConfig) -> None:
        from vla_sched.engine.scheduled_core import ScheduledCore

        engine_config = config.engine_config()
        self.core = ProbedCore(ScheduledCore.from_config(engine_config), probe)
        self.info = self.core.info
        self.pid = os.getpid()
        self._stats_period_s = engine_config.stats_period_s
        self._next_stats_s = time.monotonic()

    @property
    def failure(self) -> str:
        return '' if self.core.has_work() else 'the core has no work left'

    def send(self, request: Any) -> list[StepResult | StepFailure]:
        return self.core.submit(request, time.time_ns())

    def receive(self, timeout_s: float) -> list[StepResult | StepFailure]:
        now_s = time.monotonic()
        if now_s >= self._next_stats_s:
            self.core.stats(time.time_ns())
            self._next_stats_s = now_s + self._stats_period_s
        return self.core.step(time.time_ns()) if self.core.has_work() else []

    def finish(self, result: SoakResult) -> ProbeReport:
        self.core.close()
        return self.core.report


class _ZmqEngine:
    """An engine process started by ``EngineClient`` as the node starts it, probed through
    ``bench/soak_site``; the probe's report is read back when the process has stopped."""

    def __init__(self, config: SoakConfig, probe: ProbeConfig, *, start_timeout_s: float) -> None:
        from vla_sched.engine.client import EngineClient

        tracing = config.trace_frames > 0
        link = EngineLinkConfig(mode='process')
        if tracing:  # a tracemalloc snapshot holds the interpreter (and its beats) for seconds
            link = dataclasses.replace(link, heartbeat_timeout_s=30.0)
        self._stop_grace_s = 600.0 if tracing else 60.0
        self._probe_out = Path(probe.out)
        self.client = EngineClient(config.engine_config(), link)
        path = os.pathsep.join(
            p for p in (str(PROBE_SITE_DIR), str(ROOT), os.environ.get('PYTHONPATH')) if p
        )
        with _environment({PROBE_ENV: probe_env(probe), 'PYTHONPATH': path}):
            self.client.start()
        self.pid = self.client.pid
        try:
            self.info = self._wait_ready(start_timeout_s)
        except BaseException:
            self.client.close(grace_s=0.0)
            raise
        self.num_stats = 0
        self.num_bad_frames_at_engine = 0

    def _wait_ready(self, timeout_s: float) -> Any:
        deadline = time.monotonic() + timeout_s
        while self.client.info is None:
            if self.client.failure:
                raise RuntimeError(f'the engine did not start: {self.client.failure}')
            if time.monotonic() > deadline:
                raise RuntimeError(f'the engine was not ready within {timeout_s:.0f} s')
            self.client.poll(POLL_S)
        return self.client.info

    @property
    def failure(self) -> str:
        return self.client.failure

    def send(self, request: Any) -> list[StepResult | StepFailure]:
        self.client.send(request)
        return []

    def receive(self, timeout_s: float) -> list[StepResult | StepFailure]:
        out = []
        for msg in self.client.poll(timeout_s):
            if isinstance(msg, StepResult | StepFailure):
                out.append(msg)
            elif isinstance(msg, EngineStats):
                self.num_stats += 1
                self.num_bad_frames_at_engine = msg.num_bad_frames_received
        return out

    def finish(self, result: SoakResult) -> ProbeReport:
        """Stop the engine (SIGTERM: its core is closed, so the probe writes its report)."""
        result.num_engine_stats = self.num_stats
        result.num_bad_frames_at_engine = self.num_bad_frames_at_engine
        result.num_bad_frames_from_engine = self.client.num_bad_frames
        self.client.close(grace_s=self._stop_grace_s)
        if not self._probe_out.exists():
            return ProbeReport(
                num_integrity_failures=1,
                integrity_failures=['the engine process wrote no report (it did not stop '
                                    'cleanly)'],
            )  # fmt: skip
        return ProbeReport(**json.loads(self._probe_out.read_text()))


@contextlib.contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    """``values`` in this process's environment (so in the processes it starts) meanwhile."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


# --- the soak ---------------------------------------------------------------------------


def run_soak(
    config: SoakConfig,
    *,
    progress: Callable[[int, float, float], None] | None = None,
    start_timeout_s: float = 300.0,
) -> SoakResult:
    """Run one soak on the built-in tiny checkpoint (see the module docstring).

    ``progress(ended, engine_rss_kb, client_rss_kb)`` is called at every RSS sample.
    """
    started = time.monotonic()
    result = SoakResult(transport=config.transport, num_robots=config.num_robots)
    with tempfile.TemporaryDirectory(prefix='vla_sched-soak-') as folder:
        probe = ProbeConfig(
            out=str(Path(folder) / 'probe.json'),
            warmup_steps=config.warmup_steps,
            integrity_every=config.integrity_every,
            trace_frames=config.trace_frames,
        )
        if config.transport == 'zmq':
            engine: Any = _ZmqEngine(config, probe, start_timeout_s=start_timeout_s)
        else:
            engine = _InProcessEngine(config, probe)
        try:
            _drive(engine, config, result, progress)
        finally:
            report = engine.finish(result)
    result.num_integrity_checks = report.num_integrity_checks
    result.num_integrity_failures = report.num_integrity_failures
    result.integrity_failures = report.integrity_failures
    result.held = report.held
    result.engine_memory = {
        'traced_kb_warm': report.traced_kb_warm,
        'traced_kb_end': report.traced_kb_end,
        'malloc_kb_warm': report.malloc_kb_warm,
        'malloc_kb_end': report.malloc_kb_end,
        'top_growth': report.top_growth,
    }
    result.wall_s = time.monotonic() - started
    return result


def _drive(
    engine: Any,
    config: SoakConfig,
    result: SoakResult,
    progress: Callable[[int, float, float], None] | None,
) -> None:
    """Send and end ``config.num_steps`` steps through ``engine``; fill in ``result``."""
    result.engine_pid = engine.pid
    own_pid = os.getpid()
    action_shape = (engine.info.action_horizon, engine.info.action_dim)
    num_state = engine.info.num_state
    frames = FrameSource(width=config.image_size, height=config.image_size)
    open_steps: set[tuple[str, int]] = set()  # sent and not ended yet
    seqs = [0] * config.num_robots
    num_ended = 0
    sample_every = max(config.integrity_every, config.num_steps // 100)
    next_sample = sample_every

    def sample() -> tuple[float, float]:
        rss, client_rss = vmrss_kb(engine.pid), vmrss_kb(own_pid)
        result.rss_samples_kb.append((num_ended, rss))
        result.client_rss_samples_kb.append((num_ended, client_rss))
        if progress is not None:
            progress(num_ended, rss, client_rss)
        return rss, client_rss

    def send(robot: int) -> list[StepResult | StepFailure]:
        seqs[robot] += 1
        now = time.time_ns()
        request = step_request(
            robot, seqs[robot], stamp_ns=now, received_ns=now,
            deadline_ns=now + round(config.step_budget_ms * 1e6),
            frame=frames.frame(seqs[robot] * 31 + robot), num_state=num_state,
        )  # fmt: skip
        open_steps.add((request.robot_id, request.step_seq))
        result.num_steps_sent += 1
        try:
            return engine.send(request)
        except Exception as exc:  # counted as lost: it never ends
            result.stopped_early = f'a step could not be sent: {type(exc).__name__}: {exc}'
            return []

    def end(out: StepResult | StepFailure) -> bool:
        key = (out.robot_id, out.step_seq)
        if key not in open_steps:
            result.num_lost += 1  # ended twice, or a step never sent
            return False
        open_steps.remove(key)
        if isinstance(out, StepResult):
            result.num_results += 1
            actions = out.actions
            if actions.shape != action_shape or not np.isfinite(actions).all():
                result.num_bad_results += 1
        else:
            result.num_failures += 1
            reason = out.reason.value
            result.failures_by_reason[reason] = result.failures_by_reason.get(reason, 0) + 1
        return True

    result.rss_start_kb, result.client_rss_start_kb = sample()
    if not config.warmup_steps:
        result.rss_warm_kb, result.client_rss_warm_kb = (
            result.rss_start_kb,
            result.client_rss_start_kb,
        )
    pending: list[StepResult | StepFailure] = []
    for robot in range(config.num_robots):
        pending += send(robot)
    last_end_s = time.monotonic()
    while num_ended < config.num_steps and not result.stopped_early:
        pending += engine.receive(POLL_S)
        if not pending:
            if engine.failure:
                result.stopped_early = engine.failure
            elif time.monotonic() - last_end_s > config.stall_timeout_s:
                result.stopped_early = f'no step ended for {config.stall_timeout_s:.0f} s'
            continue
        last_end_s = time.monotonic()
        while pending:
            out = pending.pop(0)
            if not end(out):
                continue
            num_ended += 1
            if num_ended == config.warmup_steps:
                result.rss_warm_kb, result.client_rss_warm_kb = sample()
            elif num_ended >= next_sample:
                sample()
            if num_ended >= next_sample:
                next_sample = num_ended + sample_every
            if result.num_steps_sent < config.num_steps and not result.stopped_early:
                pending += send(int(out.robot_id.rsplit('_', 1)[1]))
    if result.rss_samples_kb[-1][0] != num_ended:
        sample()
    result.rss_end_kb = result.rss_samples_kb[-1][1]
    result.client_rss_end_kb = result.client_rss_samples_kb[-1][1]
    result.num_lost += len(open_steps)
    measured = max(1, num_ended - config.warmup_steps)
    result.growth_per_step_after_warmup_kb = (result.rss_end_kb - result.rss_warm_kb) / measured
    after_warmup = [s for s in result.rss_samples_kb if s[0] >= config.warmup_steps]
    result.growth_per_step_last_half_kb = _slope(after_warmup[len(after_warmup) // 2 :])
    result.rss_fit_kb_per_step = _slope(after_warmup)
    result.client_rss_fit_kb_per_step = _slope(
        [s for s in result.client_rss_samples_kb if s[0] >= config.warmup_steps]
    )


def _slope(samples: list[tuple[int, float]]) -> float:
    """Least-squares slope of kB over steps (0 with fewer than 2 distinct step counts)."""
    if len({x for x, _ in samples}) < 2:
        return 0.0
    xs = np.array([x for x, _ in samples], dtype=np.float64)
    ys = np.array([y for _, y in samples], dtype=np.float64)
    xs -= xs.mean()
    return float((xs * (ys - ys.mean())).sum() / (xs * xs).sum())


def report(result: SoakResult) -> str:
    lines = [
        f'transport {result.transport}, robots {result.num_robots}, steps sent '
        f'{result.num_steps_sent}, results {result.num_results}, failures '
        f'{result.num_failures} {result.failures_by_reason or ""}, lost {result.num_lost}, '
        f'bad results {result.num_bad_results}',
        f'integrity checks: {result.num_integrity_checks}, failed '
        f'{result.num_integrity_failures} {result.integrity_failures or ""}',
        f'engine RSS start {result.rss_start_kb / 1024:.1f} MB, after warm-up '
        f'{result.rss_warm_kb / 1024:.1f} MB, end {result.rss_end_kb / 1024:.1f} MB; '
        f'after warm-up: fit {result.rss_fit_kb_per_step * 1024:.1f} bytes/step, end minus '
        f'warm-up {result.growth_per_step_after_warmup_kb * 1024:.1f} bytes/step, '
        f'second half {result.growth_per_step_last_half_kb * 1024:.1f} bytes/step',
        f'client RSS start {result.client_rss_start_kb / 1024:.1f} MB, after warm-up '
        f'{result.client_rss_warm_kb / 1024:.1f} MB, end {result.client_rss_end_kb / 1024:.1f}'
        f' MB; fit after warm-up {result.client_rss_fit_kb_per_step * 1024:.1f} bytes/step',
        f'held at the end: {result.held}',
    ]
    memory = result.engine_memory
    if memory.get('malloc_kb_warm') and memory.get('malloc_kb_end'):
        warm, end = memory['malloc_kb_warm'], memory['malloc_kb_end']
        lines.append(
            f'engine heap (glibc) in use {warm["in_use"] / 1024:.1f} -> '
            f'{end["in_use"] / 1024:.1f} MB, free in heap {warm["free"] / 1024:.1f} -> '
            f'{end["free"] / 1024:.1f} MB'
        )
    if memory.get('traced_kb_warm') is not None and memory.get('traced_kb_end') is not None:
        lines.append(
            f'engine Python memory (traced) {memory["traced_kb_warm"] / 1024:.2f} -> '
            f'{memory["traced_kb_end"] / 1024:.2f} MB; grew most after the warm-up:'
        )
        lines += [
            f'  {site["size_diff_kb"]:+9.1f} kB {site["count_diff"]:+7d} blocks  {site["site"]}'
            for site in memory.get('top_growth', [])[:10]
        ]
    if result.transport == 'zmq':
        lines.append(
            f'engine stats received {result.num_engine_stats}; bad frames: from the engine '
            f'{result.num_bad_frames_from_engine}, at the engine {result.num_bad_frames_at_engine}'
        )
    if result.stopped_early:
        lines.append(f'STOPPED EARLY: {result.stopped_early}')
    lines.append(f'wall time {result.wall_s:.0f} s')
    return '\n'.join(lines)


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault('HF_HUB_OFFLINE', '1')
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument(
        '--transport',
        choices=TRANSPORTS,
        default='zmq',
        help='zmq: the engine in its own process; inprocess: the core in this one',
    )
    parser.add_argument('--robots', type=int, default=8)
    parser.add_argument('--steps', type=int, default=40_000, help='steps in all')
    parser.add_argument('--warmup', type=int, default=2_000, help='steps before the RSS base')
    parser.add_argument('--integrity-every', type=int, default=100, help='steps between checks')
    parser.add_argument('--image-size', type=int, default=32, help='camera frame side (pixels)')
    parser.add_argument(
        '--budget-ms',
        type=float,
        default=600_000.0,
        help='time from sending a step to its deadline (short: steps are dropped)',
    )
    parser.add_argument(
        '--trace-frames',
        type=int,
        default=0,
        help="trace the engine's Python allocations this many frames deep (0: off)",
    )
    parser.add_argument('--json', type=Path, help='write the result here')
    args = parser.parse_args(argv)
    try:
        config = SoakConfig(
            num_robots=args.robots,
            num_steps=args.steps,
            warmup_steps=args.warmup,
            integrity_every=args.integrity_every,
            image_size=args.image_size,
            step_budget_ms=args.budget_ms,
            transport=args.transport,
            trace_frames=args.trace_frames,
        )
    except ValueError as e:
        parser.error(str(e))
    every = max(1, args.steps // 20)
    last = [-every]

    def progress(done: int, rss: float, client_rss: float) -> None:
        if done - last[0] >= every:
            last[0] = done
            print(f'{done:>7} steps  engine RSS {rss / 1024:8.1f} MB  client RSS '
                  f'{client_rss / 1024:7.1f} MB', flush=True)  # fmt: skip

    result = run_soak(config, progress=progress)
    print(report(result))
    if args.json is not None:
        args.json.write_text(json.dumps(asdict(result), indent=1) + '\n')
    return 0 if result.passed else 1


if __name__ == '__main__':
    sys.exit(main())
