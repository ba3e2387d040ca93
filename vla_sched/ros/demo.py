"""Demo: the vla_sched node serving N simulated robots, with a live per-robot table.

    python -m vla_sched.ros.demo --robots 4 --duration 20

Starts the node (its engine in its own process by default) on the built-in tiny checkpoint
unless ``--model-path`` is given, waits until the engine is ready, then runs N simulated
robots as separate processes for ``--duration`` seconds. Every second it prints each robot's
action rate against its target, its chunk latency p50/p99 as the robot measured it, and its
deadline misses, plus the scheduler's line from /diagnostics; at the end, a summary. The
exit status is 1 if no action chunk arrived at any robot (2 if the engine never got ready).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import rclpy
import yaml
from diagnostic_msgs.msg import DiagnosticArray
from rclpy.executors import SingleThreadedExecutor

from vla_sched.engine.config import (
    CORES,
    DEVICES,
    ENGINE_MODES,
    EngineConfig,
    EngineLinkConfig,
)
from vla_sched.ros.diagnostic_keys import (
    CACHE_HIT_KEY,
    STEP_LATENCY_P50_KEY,
    STEP_LATENCY_P99_KEY,
    is_scheduler_status,
)


def params_file(args: argparse.Namespace, folder: Path) -> Path:
    """Write the node's parameters for this demo and return the file."""
    robot_ids = [f'robot_{i}' for i in range(args.robots)]
    values = {
        'robot_ids': robot_ids,
        'robot_defaults': {
            'period_s': args.period,
            'instruction': 'pick up the red block',
        },
        'engine': {
            'mode': args.engine_mode,
            'model_path': args.model_path,
            'unnorm_key': args.unnorm_key,
            'device': args.device,
            'core': args.core,
            'heartbeat_timeout_s': args.heartbeat_timeout,
        },
        'deadlines': {'step_budget_s': args.step_budget},
        'diagnostics': {'period_s': 1.0},
    }
    path = folder / 'demo_params.yaml'
    path.write_text(yaml.safe_dump({'vla_sched': {'ros__parameters': values}}))
    return path


class DiagnosticsWatch:
    """Keeps the latest /diagnostics statuses by name (in this process, over DDS).

    It has an rclpy context of its own, initialized here and shut down by ``close`` (or at
    the end of a ``with`` block), after its executor and node.
    """

    def __init__(self) -> None:
        self.statuses: dict[str, tuple[int, str, dict[str, str]]] = {}
        self.scheduler_history: list[tuple[float, int, dict[str, str]]] = []  # (monotonic, ...)
        self.scheduler_name = ''  # the node's scheduler status, once seen
        self.context = rclpy.Context()
        with contextlib.ExitStack() as stack:
            stack.enter_context(rclpy.init(args=[], context=self.context))
            self.node = stack.enter_context(
                rclpy.create_node('vla_sched_demo', context=self.context)
            )
            self.node.create_subscription(DiagnosticArray, '/diagnostics', self._on_array, 10)
            self.executor = stack.enter_context(SingleThreadedExecutor(context=self.context))
            self.executor.add_node(self.node)
            self._ros = stack.pop_all()

    def __enter__(self) -> DiagnosticsWatch:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _on_array(self, msg) -> None:
        for status in msg.status:
            values = {kv.key: kv.value for kv in status.values}
            self.statuses[status.name] = (status.level[0], status.message, values)
            if is_scheduler_status(status.name):
                self.scheduler_name = status.name
                self.scheduler_history.append((time.monotonic(), status.level[0], values))

    def spin(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.executor.spin_once(timeout_sec=max(0.0, min(0.1, end - time.monotonic())))

    def scheduler(self) -> tuple[int, str, dict[str, str]] | None:
        return self.statuses.get(self.scheduler_name)

    def close(self) -> None:
        """Shut down the executor, destroy the node, shut down the context."""
        self._ros.close()


class SimFleet:
    """The simulated robot processes and the latest JSON line each one printed."""

    def __init__(self, args: argparse.Namespace, env: dict[str, str]) -> None:
        self.latest: dict[str, dict[str, Any]] = {}
        self.procs: list[subprocess.Popen] = []
        self._threads = []
        for i in range(args.robots):
            cmd = [
                sys.executable, '-m', 'vla_sched.ros.sim_robot',
                '--robot-id', f'robot_{i}',
                '--rate', str(args.camera_rate),
                '--duration', str(args.duration),
                '--report-period', '1.0',
            ]  # fmt: skip
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
            self.procs.append(proc)
            thread = threading.Thread(target=self._read, args=(proc,), daemon=True)
            thread.start()
            self._threads.append(thread)

    def _read(self, proc: subprocess.Popen) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            try:
                item = json.loads(line)
            except json.JSONDecodeError:
                continue
            self.latest[item['robot_id']] = item

    def running(self) -> bool:
        return any(p.poll() is None for p in self.procs)

    def wait(self, timeout_s: float) -> None:
        end = time.monotonic() + timeout_s
        for proc in self.procs:
            try:
                proc.wait(timeout=max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGINT)
                proc.wait(timeout=5)
        for thread in self._threads:
            thread.join(timeout=5)


def _fmt(value: Any, width: int, digits: int = 1) -> str:
    if value is None:
        return 'n/a'.rjust(width)
    if isinstance(value, float):
        return f'{value:{width}.{digits}f}'
    return str(value).rjust(width)


def robot_table(
    latest: dict[str, dict[str, Any]],
    robot_ids: list[str],
    target_hz: float,
    *,
    rate_key: str = 'rate_hz',
) -> str:
    """One row per robot; ``rate_key`` picks the recent rate or the mean over the run."""
    header = (
        f'{"robot":<10}{"rate Hz":>9}{"target":>8}{"p50 ms":>9}{"p99 ms":>9}'
        f'{"misses":>8}{"chunks":>8}{"rejected":>10}'
    )
    rows = [header]
    for robot_id in robot_ids:
        item = latest.get(robot_id, {})
        rejected = sum(item.get('rejected', {}).values()) if item else None
        rows.append(
            f'{robot_id:<10}{_fmt(item.get(rate_key), 9, 2)}{_fmt(target_hz, 8, 2)}'
            f'{_fmt(item.get("latency_ms_p50"), 9)}{_fmt(item.get("latency_ms_p99"), 9)}'
            f'{_fmt(item.get("misses"), 8)}{_fmt(item.get("num_chunks"), 8)}'
            f'{_fmt(rejected, 10)}'
        )
    return '\n'.join(rows)


def scheduler_line(watch: DiagnosticsWatch) -> str:
    status = watch.scheduler()
    if status is None:
        return 'scheduler: no /diagnostics yet'
    level, message, v = status
    name = ('OK', 'WARN', 'ERROR', 'STALE')[min(level, 3)]
    return (
        f'scheduler {name}: {message} | queue {v.get("waiting queue depth")}, running '
        f'{v.get("running batch size")}, KV {v.get("KV pool use (%)")}%, retracts '
        f'{v.get("retracts total")}, cache hit {v.get(CACHE_HIT_KEY)}%, '
        'engine step (arrival to finish) p50/p99 '
        f'{v.get(STEP_LATENCY_P50_KEY)}/{v.get(STEP_LATENCY_P99_KEY)} ms'
    )


def wait_until_ready(watch: DiagnosticsWatch, node: subprocess.Popen, timeout_s: float) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end and node.poll() is None:
        watch.spin(0.5)
        status = watch.scheduler()
        if status is not None and status[2].get('engine state') == 'ready':
            return True
    return False


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def run(args: argparse.Namespace) -> int:
    folder = Path(tempfile.mkdtemp(prefix='vla_sched_demo_'))
    env = dict(os.environ)
    env.setdefault('ROS_AUTOMATIC_DISCOVERY_RANGE', 'LOCALHOST')
    env.setdefault('ROS_LOG_DIR', str(folder / 'ros_log'))
    os.environ.update({k: env[k] for k in ('ROS_AUTOMATIC_DISCOVERY_RANGE', 'ROS_LOG_DIR')})
    params = params_file(args, folder)
    log_path = folder / 'node.log'
    print(f'demo: node log in {log_path}', flush=True)
    with log_path.open('w') as log:
        node = subprocess.Popen(
            [
                sys.executable,
                '-m',
                'vla_sched.ros.node',
                '--ros-args',
                '--params-file',
                str(params),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
    try:
        with DiagnosticsWatch() as watch:
            print(
                f'demo: starting the engine ({args.engine_mode} mode, {args.core} core)',
                flush=True,
            )
            started = time.monotonic()
            if not wait_until_ready(watch, node, args.start_timeout):
                print(f'demo: the engine did not get ready; see {log_path}', file=sys.stderr)
                return 2
            model = (watch.scheduler() or (0, '', {}))[2].get('model', '')
            print(f'demo: engine ready after {time.monotonic() - started:.1f} s: {model}')
            if 'random weights' in model:
                print('demo: the tiny checkpoint has random weights: its actions are meaningless')
            return drive(args, watch, env)
    finally:
        stop(node)


def kill_engine(watch: DiagnosticsWatch) -> float | None:
    """SIGKILL the engine process named on /diagnostics; returns when (monotonic), or None."""
    status = watch.scheduler()
    pid = status[2].get('engine pid', '') if status else ''
    if not pid.isdigit():
        print('demo: no engine process to kill (in-process engine?)', file=sys.stderr)
        return None
    os.kill(int(pid), signal.SIGKILL)
    print(f'demo: killed the engine process {pid}', flush=True)
    return time.monotonic()


def recovery_report(watch: DiagnosticsWatch, killed_at: float) -> str:
    """How long /diagnostics took to show the dead engine as ERROR, and to show it ready."""
    after = [(t, level, v) for t, level, v in watch.scheduler_history if t >= killed_at]
    error = next((t for t, level, _ in after if level == 2), None)
    if error is None:
        return 'engine kill: no ERROR status seen'
    ready = next((t for t, _, v in after if t > error and v.get('engine state') == 'ready'), None)
    text = f'engine kill: scheduler ERROR on /diagnostics after {error - killed_at:.2f} s'
    if ready is None:
        return text + '; not ready again before the end'
    return text + f'; ready again after {ready - killed_at:.2f} s'


def drive(args: argparse.Namespace, watch: DiagnosticsWatch, env: dict[str, str]) -> int:
    robot_ids = [f'robot_{i}' for i in range(args.robots)]
    fleet = SimFleet(args, env)
    start = time.monotonic()
    killed_at = None
    while fleet.running():
        watch.spin(1.0)
        due = args.kill_engine_at is not None and time.monotonic() - start >= args.kill_engine_at
        if due and killed_at is None:
            killed_at = kill_engine(watch) or float('nan')
        print(f'\n--- t = {time.monotonic() - start:5.1f} s', flush=True)
        print(robot_table(fleet.latest, robot_ids, 1.0 / args.period))
        print(scheduler_line(watch), flush=True)
    fleet.wait(10.0)
    total = sum(item.get('num_chunks', 0) for item in fleet.latest.values())
    print(f'\n=== summary: {args.robots} robots, {args.duration:.0f} s (rate: mean over the run)')
    print(robot_table(fleet.latest, robot_ids, 1.0 / args.period, rate_key='mean_rate_hz'))
    print(scheduler_line(watch))
    if killed_at is not None and killed_at == killed_at:  # not NaN
        print(recovery_report(watch, killed_at))
    if total == 0:
        print('demo: FAILED: no action chunk arrived at any robot', file=sys.stderr)
        return 1
    print(f'demo: {total} action chunks arrived at {args.robots} robots')
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--robots', type=int, default=4)
    parser.add_argument('--duration', type=float, default=20.0, help='seconds of driving')
    parser.add_argument('--period', type=float, default=0.5, help='control period (s)')
    parser.add_argument('--camera-rate', type=float, default=10.0, help='images per second')
    parser.add_argument('--step-budget', type=float, default=1.0, help='deadline budget (s)')
    engine, link = EngineConfig(), EngineLinkConfig()
    parser.add_argument('--engine-mode', choices=ENGINE_MODES, default=link.mode)
    parser.add_argument('--core', choices=CORES, default=engine.core)
    parser.add_argument('--model-path', default='', help='checkpoint (default: tiny)')
    parser.add_argument(
        '--unnorm-key',
        default=engine.unnorm_key,
        help='dataset whose action statistics to use (needed when the checkpoint has several)',
    )
    parser.add_argument('--device', choices=DEVICES, default=engine.device)
    parser.add_argument('--heartbeat-timeout', type=float, default=3.0)
    parser.add_argument('--start-timeout', type=float, default=300.0)
    parser.add_argument(
        '--kill-engine-at',
        type=float,
        default=None,
        help='SIGKILL the engine process this many seconds into the run (process mode)',
    )
    args = parser.parse_args(argv)
    if args.robots < 1 or args.duration <= 0 or args.period <= 0:
        parser.error('--robots, --duration and --period must be positive')
    return run(args)


if __name__ == '__main__':
    sys.exit(main())
