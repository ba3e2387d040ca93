"""Multi-robot control loop through real ROS topics: the node's scheduled core against the
same node with one step at a time.

N simulated robots (``bench/lib/ros_fleet.py``) publish a camera image and a joint state
every ``--period`` seconds and ask for a control step per image (the node's ``on_image``
trigger: a step per new image, at most one in flight per robot, the newest image waiting
while one is; ``--trigger periodic --camera-rate R`` steps once per period instead). They
are served by the vla_sched node (``python -m vla_sched.ros.node``, engine in its own
process) with each engine core in turn (``--systems``): ``scheduled`` (the scheduler,
paged KV, batching) and ``sequential`` (one step at a time through transformers
``generate``: what single-robot VLA servers do), on the same checkpoint, with the same
parameters and deadline budget. Each server is started once for the largest N (robots
beyond the current N stay silent); for each N the robots run ``--warmup`` seconds, then
``--windows`` windows of ``--duration`` seconds are measured from the robots' side:

- actions/s delivered (chunks x horizon; the target is N x horizon / period),
- chunk latency p50/p99 (chunk arrival minus the image stamp, over every chunk),
- deadline-miss rate (late chunks and deadline refusals over the steps that ended),
- retracts (/diagnostics ``retracts total`` over the window).

The table reports, per N and system, the median window (and the min-max of actions/s), and
the ratios scheduled / sequential.

``--capacity`` finds each system's capacity instead (``bench/lib/capacity.py``): the largest
robot count served with >= 99% of the target action rate and >= 99% of steps within their
deadline. For each system it steps the count up the ladder 1, 2, 4, 6, 8, 10, ... (up to
``--max-robots``) until two counts in a row fail, then measures the counts it skipped
between the largest pass and the next failure; every count gets a server of its own,
configured for exactly that many robots, so each point is a deployment of N robots. One
12 s window after 3 s of warm-up per count (120 steps per robot at 10 Hz: one step cut by
the window's edges costs a robot less than 1%). It prints and writes (``--json``,
``--markdown``) each system's capacity, its 1-robot p50/p99 and every measured count, with
the load average of the machine.

``--oft`` writes a tiny OpenVLA folder and a tiny OpenVLA-OFT folder on the same base
weights (the LIBERO preset: two cameras and an 8-value state per step, chunks of 8 actions
from one pass) and measures the scheduled core on each, ``scheduled`` (plain OpenVLA: 7
decoded tokens, one action per step) beside ``scheduled_oft``; the robots of the OFT server
publish two camera topics and eight joint states.

``--pi0`` writes a tiny pi0 folder (LeRobot's format, two cameras and an 8-value state, 10
denoising passes for chunks of 10) and serves it with the scheduled core batching every
robot's prefixes and denoising passes (``scheduled_pi0``) and with the same core one step at
a time (``one_at_a_time_pi0``: ``scheduler.max_running_requests`` 1, how openpi's server
runs).

``--smolvla`` writes a tiny SmolVLA folder (LeRobot's format with its tiny SmolVLM2 config and
tokenizer folder, two cameras and a six-joint SO-100 state, 10 denoising passes for chunks of
10) and serves it the same two ways (``scheduled_smolvla`` and ``one_at_a_time_smolvla``,
how LeRobot's async server runs a policy).

    python -m bench.control_loop                          # N = 1 2 4 8 16, ~6 min on 2 cores
    python -m bench.control_loop --oft --robots 1 4 --windows 1
    python -m bench.control_loop --pi0 --capacity --json pi0.json --markdown pi0.md
    python -m bench.control_loop --smolvla --robots 1 4 8 --windows 1
    python -m bench.control_loop --robots 8 --duration 20 --json out.json
    python -m bench.control_loop --capacity --json capacity.json --markdown capacity.md
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from bench.control_loop_report import (
    OFT_SYSTEM,
    PI0_ONE_AT_A_TIME,
    PI0_SYSTEM,
    PI0_SYSTEMS,
    SMOLVLA_ONE_AT_A_TIME,
    SMOLVLA_SYSTEM,
    SMOLVLA_SYSTEMS,
    SYSTEMS,
    TRIGGERS,
    LoopPlan,
    LoopPoint,
    format_point,
    markdown_tables,
    summarize,
)
from bench.lib.capacity import (
    CapacityCriteria,
    CapacitySearch,
    CapacityStep,
    headline_table,
    robot_ladder,
    search_capacity,
    steps_table,
)
from bench.lib.ros_fleet import FleetConfig, RobotFleet
from vla_sched.engine.config import CORES, DEVICES

ROOT = Path(__file__).resolve().parents[1]
# The OpenVLA-OFT server's robots (the LIBERO preset): two cameras, eight state values.
OFT_PRESET = 'libero'
OFT_CAMERAS = ('camera/image_raw', 'wrist/image_raw')
OFT_JOINTS = ('eef_x', 'eef_y', 'eef_z', 'eef_ax', 'eef_ay', 'eef_az', 'finger_l', 'finger_r')
# The tiny pi0 server's chunks: 10 actions from 10 denoising passes (pi0's own count); its
# robots publish the OFT robots' two cameras and eight joint states.
PI0_CHUNK = 10
PI0_STEPS = 10
PI0_TOKENIZER_FOLDER = 'tokenizer'
# The tiny SmolVLA server's chunks: 10 actions from 10 denoising passes (SmolVLA's num_steps);
# its robots publish two cameras and an SO-100 arm's six joint states.
SMOLVLA_CHUNK = 10
SMOLVLA_STEPS = 10
SMOLVLA_VLM_FOLDER = 'vlm'  # the writer's VLM_SUBFOLDER
SMOLVLA_CAMERAS = ('front/image_raw', 'wrist/image_raw')
SMOLVLA_JOINTS = (
    'shoulder_pan', 'shoulder_lift', 'elbow_flex', 'wrist_flex', 'wrist_roll', 'gripper',
)  # fmt: skip


# --- the servers ----------------------------------------------------------------------------


class Server:
    """The vla_sched node with the ``system`` engine core, in a child process, its log in
    ``folder``."""

    def __init__(self, system: str, plan: LoopPlan, folder: Path, env: dict[str, str]) -> None:
        self.system = system
        self.log_path = folder / f'{system}.log'
        params = folder / f'{system}_params.yaml'
        params.write_text(yaml.safe_dump(node_params(plan, max(plan.robot_counts), system)))
        cmd = [sys.executable, '-m', 'vla_sched.ros.node', '--ros-args']
        cmd += ['--params-file', str(params)]
        with self.log_path.open('w') as log:
            self.proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=str(ROOT)
            )

    def log(self) -> str:
        return self.log_path.read_text(errors='replace')

    def cpu_seconds(self) -> dict[str, float]:
        """CPU time so far of the server process and of its children (the engine)."""
        import psutil

        try:
            main = psutil.Process(self.proc.pid)
            children = main.children(recursive=True)
            own = sum(main.cpu_times()[:2])
            kids = sum(sum(c.cpu_times()[:2]) for c in children)
        except psutil.Error:
            return {'node': math.nan, 'engine': math.nan}
        return {'node': own, 'engine': kids}

    def stop(self) -> None:
        from vla_sched.ros.demo import stop

        stop(self.proc)


def node_params(plan: LoopPlan, num_robots: int, system: str = 'scheduled') -> dict[str, Any]:
    """The node's parameter file for this plan, serving ``system`` (an engine core, or
    ``scheduled_oft``: the scheduled core on ``plan.oft_model_path``)."""
    oft = system == OFT_SYSTEM
    pi0 = system in PI0_SYSTEMS
    smolvla = system in SMOLVLA_SYSTEMS
    model_path = plan.oft_model_path if oft else plan.pi0_model_path if pi0 else plan.model_path
    if smolvla:
        model_path = plan.smolvla_model_path
    engine = {
        'mode': 'process',
        'model_path': model_path,
        'device': plan.device,
        'core': 'scheduled' if oft or pi0 or smolvla else system,
        'heartbeat_timeout_s': 5.0,
        'start_timeout_s': plan.start_timeout_s,
    }
    robot_defaults = {
        'period_s': plan.period_s,
        'trigger': plan.trigger,
        'instruction': 'pick up the red block',
    }
    if oft:
        engine['oft_preset'] = OFT_PRESET
    if pi0:
        engine['pi0_tokenizer_path'] = str(Path(plan.pi0_model_path) / PI0_TOKENIZER_FOLDER)
    if oft or pi0:
        robot_defaults['camera_topics'] = list(OFT_CAMERAS)
        robot_defaults['state_joint_names'] = list(OFT_JOINTS)
    if smolvla:
        engine['smolvla_vlm_path'] = str(Path(plan.smolvla_model_path) / SMOLVLA_VLM_FOLDER)
        robot_defaults['camera_topics'] = list(SMOLVLA_CAMERAS)
        robot_defaults['state_joint_names'] = list(SMOLVLA_JOINTS)
    values = {
        'robot_ids': [f'robot_{i}' for i in range(num_robots)],
        'robot_defaults': robot_defaults,
        'engine': engine,
        'deadlines': {'step_budget_s': plan.budget_s},
        'diagnostics': {'period_s': 1.0},
    }
    if system in (PI0_ONE_AT_A_TIME, SMOLVLA_ONE_AT_A_TIME):
        values['scheduler'] = {'max_running_requests': 1}
    for name, value in plan.node_params.items():
        *groups, key = name.split('.')
        target = values
        for group in groups:
            target = target.setdefault(group, {})
        target[key] = value
    return {'vla_sched': {'ros__parameters': values}}


class Watch:
    """The node's /diagnostics (``vla_sched.ros.demo.DiagnosticsWatch``); ``spin`` lasts the
    given time."""

    def __init__(self) -> None:
        from vla_sched.ros.demo import DiagnosticsWatch

        self.inner = DiagnosticsWatch()

    def spin(self, seconds: float) -> None:
        self.inner.spin(seconds)

    def retracts_total(self) -> int:
        status = self.inner.scheduler()
        if status is None:
            return 0
        return int(float(status[2].get('retracts total', 0) or 0))

    def close(self) -> None:
        self.inner.close()


def wait_ready(server: Server, watch: Watch, timeout_s: float) -> None:
    """Until the node's engine is ready; raises RuntimeError with its log tail otherwise."""
    from vla_sched.ros.demo import wait_until_ready

    if not wait_until_ready(watch.inner, server.proc, timeout_s):
        raise RuntimeError(f'{server.system} did not get ready:\n{server.log()[-3000:]}')


def run_system(system: str, plan: LoopPlan, folder: Path, env: dict[str, str]) -> list[LoopPoint]:
    """Start one server, drive every robot count against it, stop it."""
    server = Server(system, plan, folder, env)
    watch = Watch()
    points = []
    try:
        wait_ready(server, watch, plan.start_timeout_s)
        for num_robots in plan.robot_counts:
            points.append(drive(system, num_robots, plan, watch, server))
            print(format_point(points[-1]), flush=True)
    finally:
        watch.close()
        server.stop()
    return points


def fleet_config(system: str, plan: LoopPlan) -> FleetConfig:
    """The simulated robots of ``system``: the cameras and joints its node expects."""
    camera_hz = plan.camera_rate_hz or 1.0 / plan.period_s
    if system == OFT_SYSTEM or system in PI0_SYSTEMS:
        return FleetConfig(
            camera_rate_hz=camera_hz, camera_topics=OFT_CAMERAS, joint_names=OFT_JOINTS
        )
    if system in SMOLVLA_SYSTEMS:
        return FleetConfig(
            camera_rate_hz=camera_hz, camera_topics=SMOLVLA_CAMERAS, joint_names=SMOLVLA_JOINTS
        )
    return FleetConfig(camera_rate_hz=camera_hz)


def drive(system: str, num_robots: int, plan: LoopPlan, watch: Watch, server: Server):
    fleet = RobotFleet(num_robots, fleet_config(system, plan))
    try:
        deadline = time.monotonic() + max(30.0, 10 * plan.period_s * num_robots)
        while not fleet.wait_for_chunks(0.0) and time.monotonic() < deadline:
            if server.proc.poll() is not None:
                raise RuntimeError(f'{system} exited:\n{server.log()[-3000:]}')
            watch.spin(0.2)
        watch.spin(plan.warmup_s)
        windows, retracts, cpu = [], [], []
        for _ in range(plan.num_windows):
            before = watch.retracts_total()
            cpu_before = {**server.cpu_seconds(), 'robots': time.process_time()}
            fleet.start_window()
            watch.spin(plan.duration_s)
            windows.append(fleet.end_window())
            cpu_after = {**server.cpu_seconds(), 'robots': time.process_time()}
            retracts.append(max(0, watch.retracts_total() - before))
            elapsed = windows[-1].duration_s
            cpu.append({k: 100 * (cpu_after[k] - v) / elapsed for k, v in cpu_before.items()})
    finally:
        fleet.close()
    return summarize(system, num_robots, plan, windows, retracts, cpu)


def ros_env(folder: Path) -> dict[str, str]:
    """Keep DDS on this host, in a domain of this run's own; no Hugging Face hub calls."""
    os.environ.setdefault('HF_HUB_OFFLINE', '1')
    os.environ.setdefault('ROS_AUTOMATIC_DISCOVERY_RANGE', 'LOCALHOST')
    os.environ.setdefault('ROS_DOMAIN_ID', str(os.getpid() % 100 + 1))
    os.environ.setdefault('ROS_LOG_DIR', str(folder / 'ros_log'))
    return dict(os.environ)


def run(plan: LoopPlan, *, json_path: str = '') -> list[LoopPoint]:
    folder = Path(tempfile.mkdtemp(prefix='vla_control_loop_'))
    env = ros_env(folder)
    print(
        f'control loop: robots {list(plan.robot_counts)}, period {plan.period_s} s, '
        f'trigger {plan.trigger}, camera {plan.camera_rate_hz or 1 / plan.period_s:.1f} Hz, '
        f'budget {plan.budget_s} s, warm-up {plan.warmup_s} s, {plan.num_windows} x '
        f'{plan.duration_s} s windows, device {plan.device}, logs in {folder}',
        flush=True,
    )
    points: list[LoopPoint] = []
    for system in plan.systems:
        points += run_system(system, plan, folder, env)
    print()
    print(markdown_tables(points))
    if json_path:
        record = {'plan': dataclasses.asdict(plan), 'points': [p.row() for p in points]}
        Path(json_path).write_text(json.dumps(record, indent=1) + '\n')
    return points


# --- capacity ------------------------------------------------------------------------------

CAPACITY_MAX_ROBOTS = 32
CAPACITY_WARMUP_S = 3.0
CAPACITY_DURATION_S = 12.0  # one window: 120 steps per robot at 10 Hz
CAPACITY_WINDOWS = 1


def measure_count(
    system: str, num_robots: int, plan: LoopPlan, folder: Path, env: dict[str, str]
) -> LoopPoint:
    """One system serving ``num_robots`` robots from a server configured for exactly them."""
    sub = folder / f'{system}_{num_robots}'
    sub.mkdir(exist_ok=True)
    (point,) = run_system(system, dataclasses.replace(plan, robot_counts=(num_robots,)), sub, env)
    return point


def machine_line() -> str:
    """The machine in words, e.g. ``2-core x86_64, Python 3.11``."""
    return f'{os.cpu_count()}-core {platform.machine()}, Python {platform.python_version()}'


def run_capacity(
    plan: LoopPlan,
    criteria: CapacityCriteria,
    *,
    max_failures_in_row: int = 2,
    refine: bool = True,
    json_path: str = '',
    markdown_path: str = '',
) -> list[CapacitySearch]:
    """Each system's capacity: ``plan.robot_counts`` stepped up until ``max_failures_in_row``
    counts in a row fail, then (``refine``) the skipped counts above the largest pass up to
    the first failure (``bench/lib/capacity.py``)."""
    folder = Path(tempfile.mkdtemp(prefix='vla_capacity_'))
    env = ros_env(folder)
    load_start = os.getloadavg()
    print(
        f'capacity: robots {list(plan.robot_counts)} at {1 / plan.period_s:.0f} Hz, '
        f'{criteria.describe()}; stop after {max_failures_in_row} failures in a row; '
        f'warm-up {plan.warmup_s} s, {plan.num_windows} x {plan.duration_s} s windows; '
        f'{machine_line()}, load average {_load(load_start)}; logs in {folder}',
        flush=True,
    )
    points: list[LoopPoint] = []
    loads: list[dict[str, Any]] = []
    searches = []
    for system in plan.systems:

        def measure(num_robots: int, system: str = system):
            points.append(measure_count(system, num_robots, plan, folder, env))
            loads.append(
                {'system': system, 'num_robots': num_robots, 'load_average': os.getloadavg()}
            )
            return points[-1].capacity_measure()

        searches.append(
            search_capacity(
                system,
                plan.robot_counts,
                measure,
                criteria,
                max_failures_in_row=max_failures_in_row,
                refine=refine,
                on_step=_print_step,
            )
        )
    load_end = os.getloadavg()
    report = capacity_markdown(plan, criteria, searches, load_start, load_end)
    print()
    print(report)
    if json_path:
        record = {
            'mode': 'capacity',
            'machine': machine_line(),
            'plan': dataclasses.asdict(plan),
            'criteria': dataclasses.asdict(criteria),
            'max_failures_in_row': max_failures_in_row,
            'refine': refine,
            'load_average_start': load_start,
            'load_average_end': load_end,
            'load_average_per_count': loads,
            'searches': [s.row() for s in searches],
            'points': [p.row() for p in points],
        }
        Path(json_path).write_text(json.dumps(record, indent=1) + '\n')
    if markdown_path:
        Path(markdown_path).write_text(report + '\n')
    return searches


def capacity_markdown(
    plan: LoopPlan,
    criteria: CapacityCriteria,
    searches: list[CapacitySearch],
    load_start: tuple[float, float, float],
    load_end: tuple[float, float, float],
) -> str:
    """The headline (capacity and 1-robot latency per system), then every measured count."""
    return '\n'.join(
        [
            f'Capacity through ROS: robots at {1 / plan.period_s:.0f} Hz served with '
            f'{criteria.describe()} ({plan.num_windows} x {plan.duration_s:g} s window after '
            f'{plan.warmup_s:g} s of warm-up per count, a server per count); '
            f'{machine_line()}, load average (1, 5, 15 min) {_load(load_start)} at the start, '
            f'{_load(load_end)} at the end.',
            '',
            headline_table(searches),
            '',
            steps_table(searches),
        ]
    )


def _print_step(step: CapacityStep) -> None:
    verdict = 'pass' if step.passed else 'fail (' + '; '.join(step.failures) + ')'
    print(f'  -> {step.measure.num_robots} robots: {verdict}', flush=True)


def _load(load: tuple[float, float, float]) -> str:
    return ' / '.join(f'{x:.2f}' for x in load)


# --- command line ---------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    base = LoopPlan()
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument(
        '--robots',
        type=int,
        nargs='+',
        default=None,
        help=f'robot counts (default: {list(base.robot_counts)}; with --capacity the ladder '
        f'up to --max-robots)',
    )
    parser.add_argument('--period', type=float, default=base.period_s, help='control period s')
    parser.add_argument('--camera-rate', type=float, default=0.0, help='0: one per period')
    parser.add_argument('--trigger', choices=TRIGGERS, default=base.trigger)
    parser.add_argument('--budget', type=float, default=base.budget_s, help='deadline budget s')
    parser.add_argument(
        '--warmup',
        type=float,
        default=None,
        help=f'default {base.warmup_s} (capacity: {CAPACITY_WARMUP_S})',
    )
    parser.add_argument(
        '--duration',
        type=float,
        default=None,
        help=f'window s, default {base.duration_s} (capacity: {CAPACITY_DURATION_S})',
    )
    parser.add_argument(
        '--windows',
        type=int,
        default=None,
        help=f'default {base.num_windows} (capacity: {CAPACITY_WINDOWS})',
    )
    parser.add_argument('--capacity', action='store_true', help="find each system's capacity")
    parser.add_argument('--max-robots', type=int, default=CAPACITY_MAX_ROBOTS)
    parser.add_argument(
        '--max-failures-in-row', type=int, default=2, help='capacity: stop after this many'
    )
    parser.add_argument(
        '--no-refine',
        action='store_true',
        help='capacity: skip the counts between the largest pass and the next failure',
    )
    parser.add_argument('--markdown', default='', help='capacity: write the tables here')
    parser.add_argument('--model-path', default='', help='checkpoint (default: the tiny one)')
    parser.add_argument(
        '--unnorm-key', default='', help='dataset of the action statistics (both systems)'
    )
    parser.add_argument('--device', choices=DEVICES, default=base.device)
    parser.add_argument(
        '--systems',
        nargs='+',
        choices=SYSTEMS,
        default=None,
        help=f'default {list(CORES)} ({OFT_SYSTEM!r} needs --oft; with --oft: scheduled and '
        f'{OFT_SYSTEM})',
    )
    parser.add_argument(
        '--oft',
        action='store_true',
        help='write tiny OpenVLA and OpenVLA-OFT folders (same base weights; OFT: LIBERO '
        'preset, two cameras, state, chunks of 8) and serve each (--model-path is ignored)',
    )
    parser.add_argument(
        '--pi0',
        action='store_true',
        help=f'write a tiny pi0 folder (two cameras, state, chunks of {PI0_CHUNK}) and serve it '
        f'batched ({PI0_SYSTEM}) and one step at a time ({PI0_ONE_AT_A_TIME})',
    )
    parser.add_argument(
        '--smolvla',
        action='store_true',
        help=f'write a tiny SmolVLA folder (two cameras, six joints, chunks of {SMOLVLA_CHUNK}) '
        f'and serve it batched ({SMOLVLA_SYSTEM}) and one step at a time '
        f'({SMOLVLA_ONE_AT_A_TIME})',
    )
    parser.add_argument(
        '--node-param',
        nargs='*',
        default=[],
        metavar='NAME=VALUE',
        help='node parameters (both systems), e.g. scheduler.enable_overlap=false',
    )
    parser.add_argument('--json', default='', help='write the results here')
    return parser.parse_args(argv)


def plan_from_args(args: argparse.Namespace) -> LoopPlan:
    """The plan of these arguments; unset counts, warm-up and windows take the mode's
    defaults (the sweep's, or the capacity search's); ``--oft`` writes its two tiny folders
    (``write_oft_pair``) and serves them."""
    base = LoopPlan()
    node_params = dict(parse_node_param(s) for s in args.node_param)
    if args.unnorm_key:
        node_params.setdefault('engine.unnorm_key', args.unnorm_key)
    if args.capacity:
        counts = args.robots or robot_ladder(args.max_robots)
        defaults = (CAPACITY_WARMUP_S, CAPACITY_DURATION_S, CAPACITY_WINDOWS)
    else:
        counts = args.robots or base.robot_counts
        defaults = (base.warmup_s, base.duration_s, base.num_windows)
    warmup, duration, windows = (
        default if value is None else value
        for value, default in zip(
            (args.warmup, args.duration, args.windows), defaults, strict=True
        )
    )
    systems = args.systems or (['scheduled', OFT_SYSTEM] if args.oft else list(CORES))
    if args.pi0 and not args.systems:
        systems = list(PI0_SYSTEMS)
    if args.smolvla and not args.systems:
        systems = [*(PI0_SYSTEMS if args.pi0 else ()), *SMOLVLA_SYSTEMS]
    model_path, oft_model_path, pi0_model_path = args.model_path, '', ''
    smolvla_model_path = ''
    if args.oft:  # the two tiny folders, written now
        model_path, oft_model_path = write_oft_pair(Path(tempfile.mkdtemp(prefix='vla_oft_')))
    if args.pi0:
        pi0_model_path = write_tiny_pi0(Path(tempfile.mkdtemp(prefix='vla_pi0_')))
    if args.smolvla:
        smolvla_model_path = write_tiny_smolvla(Path(tempfile.mkdtemp(prefix='vla_smolvla_')))
    return LoopPlan(
        robot_counts=tuple(counts),
        period_s=args.period,
        camera_rate_hz=args.camera_rate,
        trigger=args.trigger,
        budget_s=args.budget,
        warmup_s=warmup,
        duration_s=duration,
        num_windows=windows,
        model_path=model_path,
        device=args.device,
        node_params=node_params,
        systems=tuple(systems),
        oft_model_path=oft_model_path,
        pi0_model_path=pi0_model_path,
        smolvla_model_path=smolvla_model_path,
    )


def write_oft_pair(folder: Path) -> tuple[str, str]:
    """A tiny OpenVLA folder and a tiny OpenVLA-OFT folder on the same base weights (the
    OFT one with the LIBERO preset's shapes) in ``folder``: their paths."""
    from vla_sched.model.families.openvla_oft.checkpoint import oft_preset
    from vla_sched.testing.openvla_oft_writer import OFT_DATASET, write_openvla_oft_checkpoint
    from vla_sched.testing.openvla_writer import write_openvla_checkpoint

    plain = write_openvla_checkpoint(folder / 'tiny-openvla', seed=0, datasets=(OFT_DATASET,))
    oft = write_openvla_oft_checkpoint(
        folder / 'tiny-openvla-oft', settings=oft_preset(OFT_PRESET), seed=0
    )
    return str(plain), str(oft)


def write_tiny_pi0(folder: Path) -> str:
    """A tiny pi0 folder with its tokenizer (two cameras, eight state values, chunks of
    ``PI0_CHUNK`` actions from ``PI0_STEPS`` denoising passes) in ``folder``: its path."""
    from vla_sched.testing.pi0_writer import write_pi0_checkpoint

    written = write_pi0_checkpoint(
        folder / 'tiny-pi0',
        tokenizer=True,
        seed=0,
        chunk_size=PI0_CHUNK,
        n_action_steps=PI0_CHUNK,
        num_inference_steps=PI0_STEPS,
    )
    return str(written)


def write_tiny_smolvla(folder: Path) -> str:
    """A tiny SmolVLA folder with its tiny VLM folder (two cameras, six state values, chunks
    of ``SMOLVLA_CHUNK`` actions from ``SMOLVLA_STEPS`` denoising passes) in ``folder``: its
    path."""
    from vla_sched.testing.smolvla_writer import write_smolvla_checkpoint

    written = write_smolvla_checkpoint(
        folder / 'tiny-smolvla',
        seed=0,
        state_dim=len(SMOLVLA_JOINTS),
        action_dim=len(SMOLVLA_JOINTS),
        chunk_size=SMOLVLA_CHUNK,
        n_action_steps=SMOLVLA_CHUNK,
        num_steps=SMOLVLA_STEPS,
    )
    return str(written)


def parse_node_param(text: str) -> tuple[str, Any]:
    """``NAME=VALUE`` of ``--node-param`` as ``(name, value)``, the value read as YAML."""
    key, sep, value = text.partition('=')
    if not sep or not key:
        raise SystemExit(f'--node-param expects NAME=VALUE, got {text!r}')
    return key, yaml.safe_load(value)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    plan = plan_from_args(args)
    if args.capacity:
        searches = run_capacity(
            plan,
            CapacityCriteria(),
            max_failures_in_row=args.max_failures_in_row,
            refine=not args.no_refine,
            json_path=args.json,
            markdown_path=args.markdown,
        )
        return 0 if all(s.steps for s in searches) else 1
    points = run(plan, json_path=args.json)
    return 0 if all(p.num_chunks > 0 for p in points) else 1


if __name__ == '__main__':
    sys.exit(main())
