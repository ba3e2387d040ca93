"""The seam between chunks under an inference delay, for each merge mode and for RTC.

The tiny random pi0 (``ScheduledCore`` in process, on the CPU) serves one robot on a simulated
clock: an image every ``--period-ms``; the step is computed at once, and its chunk is
published ``delay`` ms after the image stamp, when it reaches the robot's chunk executor
(``vla_sched/ros/chunk_executor.py``, the product's rules without ROS, ticking on arrival and
on its action boundaries as the node does). The inference delay is thus simulated by when a
chunk becomes available, so CPU speed changes nothing and a run repeats exactly. The robot's
state is the simulated arm's position at the image stamp (``bench/lib/seam_arm.py``: a
JointTrajectoryController's one-point interpolation followed through a first-order lag at
the control rate). Under ``rtc`` each step carries the previous chunk's remaining actions and
the inference delay exactly as the node computes them (``vla_sched/ros/previous_chunk.py``:
the stamps align them, the latency p95 rounded up to actions is the delay), so the engine
guides the new chunk; every mode sees the same noise (the engine seeds it by robot and step).

Modes: ``latest``, ``aligned``, ``blend`` (every joint), ``temporal_ensemble`` (executor
modes, no guidance); ``rtc`` (engine guidance on, executor mode ``rtc``); ``rtc_unguided``
(executor mode ``rtc`` without guidance: what the engine's guidance adds).

Measured per mode and delay, from ``--warmup-chunks`` on: at each chunk switch (the tick where
a new chunk first shapes the command) the step of the commanded position (``jump``), the new
chunk's own step (the median step between its consecutive actions) and the jump beyond it
(``excess``), and the ``departure``: how far the command at the switch is from what the
executor would have sent without the new chunk (the trajectory the arm was on; the hold
position when that had ended); the arm's executed velocity and jerk (norm over the joints,
p50/p99/max); the fraction of time the executor held (its own hold accounting).

    python -m bench.chunk_seams                       # 6 modes x 5 delays, 20 s each
    python -m bench.chunk_seams --delays-ms 100 --modes latest rtc --duration-s 2
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench.lib.seam_arm import MotionStats, SimulatedArm
from bench.lib.seam_report import commit, machine, seam_table, write_plot
from bench.lib.stats import percentile
from vla_sched.engine.config import EngineConfig
from vla_sched.engine.scheduled_core import ScheduledCore
from vla_sched.ipc.messages import StepRequest, StepResult
from vla_sched.ros.chunk_executor import Chunk, ChunkExecutor
from vla_sched.ros.previous_chunk import (
    DELAY_PERCENTILE,
    NO_ACTIONS,
    PublishedChunk,
    inference_delay,
)
from vla_sched.ros.windows import MsLatencyWindow
from vla_sched.testing.pi0_writer import TOKENIZER_SUBFOLDER, write_pi0_checkpoint

# mode -> (the executor's blending, whether the steps carry the previous chunk)
MODES = {
    'latest': ('latest', False),
    'aligned': ('aligned', False),
    'blend': ('blend', False),
    'temporal_ensemble': ('temporal_ensemble', False),
    'rtc_unguided': ('rtc', False),
    'rtc': ('rtc', True),
}
ACTION_SPACE = 'joint_position'
ROBOT_ID = 'arm0'
MS = 1_000_000
T0_NS = 1_000 * 10**9  # the simulated clock's start (any positive time)
DEFAULT_JSON = 'bench/results/chunk_seams_cpu.json'
DEFAULT_PLOT = 'docs/img/chunk_seams_cpu.png'


@dataclass(frozen=True, slots=True)
class SeamPlan:
    """What one benchmark run covers; ``execution_horizon`` 0: the period in actions."""

    delays_ms: tuple[int, ...] = (0, 50, 100, 200, 300)
    modes: tuple[str, ...] = tuple(MODES)
    dt_ms: int = 50
    chunk: int = 16
    dof: int = 7
    period_ms: int = 400
    duration_s: float = 20.0
    warmup_chunks: int = 2
    control_period_ms: float = 2.0
    arm_tau_ms: float = 20.0
    num_inference_steps: int = 5
    execution_horizon: int = 0
    max_guidance: float = 10.0
    mask_schedule: str = 'linear'
    ensemble_m: float = 0.01
    min_lead_ms: float = 15.0
    seed: int = 0

    def __post_init__(self) -> None:
        unknown = [m for m in self.modes if m not in MODES]
        if unknown or not self.modes:
            raise ValueError(f'modes {unknown or "none"}: choose from {list(MODES)}')
        if any(not 0 <= d < self.period_ms for d in self.delays_ms) or not self.delays_ms:
            raise ValueError(
                f'delays {self.delays_ms} ms: each in [0, period {self.period_ms} ms) (one step '
                'in flight, none waiting)'
            )
        if self.period_ms > self.chunk * self.dt_ms:
            raise ValueError(f"period {self.period_ms} ms exceeds the chunk's span")

    @property
    def rtc_execution_horizon(self) -> int:
        return self.execution_horizon or max(1, self.period_ms // self.dt_ms)


@dataclass(slots=True)
class Seam:
    """One chunk switch: the commanded step, the new chunk's own step, the departure."""

    at_ns: int
    jump: float
    own_step: float
    departure: float


@dataclass(slots=True)
class RunRecord:
    """One mode at one delay: the seams, the within-chunk steps, the executor and the arm."""

    mode: str
    delay_ms: int
    inference_delays: list[int]
    seams: list[Seam]
    steps_within: list[float]
    num_steps: int
    chunks: list[np.ndarray]
    executor: ChunkExecutor
    motion: MotionStats
    held_fraction: float


def build_core(plan: SeamPlan, workdir: Path) -> ScheduledCore:
    """The tiny pi0 folder (float32, ``plan.chunk`` actions of ``plan.dof``) and its core."""
    folder = write_pi0_checkpoint(
        workdir / 'tiny-pi0',
        policy_type='pi0',
        seed=plan.seed,
        state_dim=plan.dof,
        action_dim=plan.dof,
        chunk_size=plan.chunk,
        n_action_steps=plan.chunk,
        num_inference_steps=plan.num_inference_steps,
        weights_dtype='float32',
        tokenizer=True,
    )
    return ScheduledCore.from_config(
        EngineConfig(
            model_path=str(folder),
            pi0_tokenizer_path=str(folder / TOKENIZER_SUBFOLDER),
            kv_pool_tokens=2048,
            page_size=16,
            seed=plan.seed,
            rtc_execution_horizon=plan.rtc_execution_horizon,
            rtc_max_guidance=plan.max_guidance,
            rtc_mask_schedule=plan.mask_schedule,
        )
    )


def serve(core: ScheduledCore, request: StepRequest) -> np.ndarray:
    """The chunk of one step. The core keeps deadlines on the wall clock, so the request it
    gets is stamped now (the simulated stamps time the executor; the noise depends on the
    robot and the step number only)."""
    now = time.time_ns()
    request = dataclasses.replace(
        request, stamp_ns=now, received_ns=now, deadline_ns=now + 3600 * 10**9
    )
    out = list(core.submit(request, now))
    while core.has_work():
        out += core.step(time.time_ns())
    (result,) = out
    if not isinstance(result, StepResult):
        raise RuntimeError(f'step {request.step_seq} failed: {result}')
    return result.actions


class SeamRun:
    """One robot, its executor and arm on the simulated clock, for one mode and delay."""

    def __init__(self, core: ScheduledCore, plan: SeamPlan, mode: str, delay_ms: int) -> None:
        blending, self.guided = MODES[mode]
        self.core, self.plan, self.mode, self.delay_ms = core, plan, mode, delay_ms
        self.joints = tuple(f'joint_{j}' for j in range(plan.dof))
        self.executor = ChunkExecutor(
            action_spaces=(ACTION_SPACE,),
            blending=blending,
            ensemble_m=plan.ensemble_m,
            lookahead=False,
            min_lead_ns=round(plan.min_lead_ms * MS),
            blend_joints=self.joints,
        )
        self.arm = SimulatedArm(
            np.zeros(plan.dof),
            start_ns=T0_NS,
            control_period_ns=round(plan.control_period_ms * MS),
            tau_ns=round(plan.arm_tau_ms * MS),
        )
        self.latency = MsLatencyWindow()
        self.previous: PublishedChunk | None = None
        self.arrivals: list[tuple[int, Chunk, int]] = []  # (arrival, chunk, published), by time
        self.due_ns: int | None = None
        self.shadow: ChunkExecutor | None = None  # the executor as it was without the new chunk
        self.last_row: np.ndarray | None = None
        self.newest_actions: np.ndarray | None = None
        self.record = RunRecord(mode, delay_ms, [], [], [], 0, [], self.executor, None, 0.0)  # type: ignore[arg-type]
        self.warm_ns = T0_NS + (plan.warmup_chunks * plan.period_ms + delay_ms) * MS
        self.first_action_ns: int | None = None

    def run(self) -> RunRecord:
        plan = self.plan
        num_images = int(plan.duration_s * 1000 // plan.period_ms)
        for index in range(num_images):
            stamp = T0_NS + index * plan.period_ms * MS
            self.advance(stamp - 1)  # a chunk arriving at ``stamp`` (delay 0) is taken first
            self.arm.advance(stamp)
            self.step(index, stamp)
        end_ns = T0_NS + num_images * plan.period_ms * MS
        self.advance(end_ns)
        ex = self.executor
        first = self.first_action_ns
        held = ex.counts.held_ns + ex.hold_ns(end_ns)
        self.record.held_fraction = held / (end_ns - first) if first is not None else 1.0
        self.record.motion = self.arm.motion(self.warm_ns)
        return self.record

    def step(self, index: int, stamp: int) -> None:
        """The node's step for the image at ``stamp``; its chunk arrives ``delay`` later."""
        plan, dt_s = self.plan, self.plan.dt_ms / 1000.0
        previous, delay = NO_ACTIONS, 0
        if self.guided and self.previous is not None:
            previous = self.previous.remaining_at(stamp, dt_s=dt_s)
            delay = inference_delay(
                self.latency.percentile(DELAY_PERCENTILE),
                dt_s=dt_s,
                horizon=self.previous.actions.shape[0],
            )
            self.record.inference_delays.append(delay)
        rng = np.random.default_rng([plan.seed, index])
        request = StepRequest(
            robot_id=ROBOT_ID,
            step_seq=index + 1,
            stamp_ns=stamp,
            deadline_ns=stamp + 3600 * 10**9,
            received_ns=stamp,
            images=tuple(rng.integers(0, 256, (48, 64, 3), np.uint8) for _ in range(2)),
            state=self.arm.position.astype(np.float32),
            instruction='pick up the red block',
            instruction_version=1,
            previous_actions=previous,
            inference_delay=delay,
        )
        actions = serve(self.core, request)
        self.record.num_steps += 1
        self.record.chunks.append(actions)
        published = stamp + self.delay_ms * MS
        self.latency.add(float(self.delay_ms))
        self.previous = PublishedChunk(stamp, actions)  # the node keeps what it published
        dt_ns = plan.dt_ms * MS
        chunk = Chunk(
            step_seq=index + 1,
            stamp_ns=stamp,
            dt_ns=dt_ns,
            deadline_ns=stamp + plan.chunk * dt_ns,
            actions=actions.astype(np.float64),
            joint_names=self.joints,
            action_space=ACTION_SPACE,
            frame_id='base',
        )
        self.arrivals.append((published, chunk, published))

    def advance(self, until_ns: int) -> None:
        """Play the arrivals and ticks due up to ``until_ns`` (an arrival before a tick)."""
        while True:
            pending = (self.due_ns, self.arrivals[0][0] if self.arrivals else None)
            times = [t for t in pending if t is not None and t <= until_ns]
            if not times:
                break
            now = min(times)
            self.arm.advance(now)
            if self.arrivals and self.arrivals[0][0] == now:
                _, chunk, published = self.arrivals.pop(0)
                shadow = copy.deepcopy(self.executor)
                if self.executor.receive(chunk, now, published_ns=published) is None:
                    self.shadow, self.newest_actions = shadow, chunk.actions
                self.play(now)
            elif now == self.due_ns:
                self.play(now)
        self.arm.advance(until_ns)

    def play(self, now: int) -> None:
        """One tick: send the command to the arm and record a seam or a step."""
        ex = self.executor
        played_before = ex.counts.chunks_executed
        command = ex.tick(now)
        self.due_ns = ex.next_tick_ns(now)
        if command is None:
            return
        row = command.rows[0]
        if self.first_action_ns is None:
            self.first_action_ns = now
        self.arm.command(row, sent_ns=now, reached_ns=command.reached_ns[0])
        if self.last_row is not None:
            step = float(np.linalg.norm(row - self.last_row))
            switched = ex.counts.chunks_executed > played_before and played_before > 0
            if switched and now >= self.warm_ns:
                self.record.seams.append(self.seam(now, row, step))
            elif not switched and now >= self.warm_ns:
                self.record.steps_within.append(step)
        self.last_row = row

    def seam(self, now: int, row: np.ndarray, jump: float) -> Seam:
        """The switch at ``now``: against the command the executor had without the chunk."""
        planned = self.shadow.tick(now) if self.shadow is not None else None
        before = planned.rows[0] if planned is not None else self.last_row
        own = np.linalg.norm(np.diff(self.newest_actions, axis=0), axis=1)
        return Seam(
            at_ns=now,
            jump=jump,
            own_step=float(np.median(own)),
            departure=float(np.linalg.norm(row - before)),
        )


def lag1_correlation(chunks: list[np.ndarray]) -> float:
    """How much a chunk's action predicts its next one: the correlation of consecutive
    actions, per joint over every chunk, averaged over the joints (1: a smooth trajectory,
    0: independent draws)."""
    if not chunks or chunks[0].shape[0] < 3:
        return float('nan')
    now = np.concatenate([c[:-1] for c in chunks]).astype(np.float64)
    after = np.concatenate([c[1:] for c in chunks]).astype(np.float64)
    joints = [np.corrcoef(now[:, j], after[:, j])[0, 1] for j in range(now.shape[1])]
    return float(np.mean(joints))


def _stats(values: list[float], name: str) -> dict[str, float]:
    return {
        f'{name}_p50': percentile(values, 50),
        f'{name}_p99': percentile(values, 99),
        f'{name}_max': max(values) if values else float('nan'),
    }


def summarize(record: RunRecord, plan: SeamPlan) -> dict[str, object]:
    """One row of the results: the seams, the motion and the executor's counts."""
    seams = record.seams
    counts = record.executor.counts
    blending, guided = MODES[record.mode]
    delays = sorted(set(record.inference_delays))
    return {
        'mode': record.mode,
        'blending': blending,
        'guided': guided,
        'delay_ms': record.delay_ms,
        'delay_actions': -(-record.delay_ms // plan.dt_ms),
        'inference_delays_sent': delays,
        'num_steps': record.num_steps,
        'chunks_executed': counts.chunks_executed,
        'skipped': {k: v for k, v in counts.skipped.items() if v},
        'num_seams': len(seams),
        **_stats([s.jump for s in seams], 'jump'),
        'own_step_p50': percentile([s.own_step for s in seams], 50),
        **_stats([s.jump - s.own_step for s in seams], 'excess'),
        **_stats([s.departure for s in seams], 'departure'),
        'step_within_p50': percentile(record.steps_within, 50),
        'chunk_lag1_correlation': lag1_correlation(record.chunks),
        'num_steps_within': len(record.steps_within),
        **dataclasses.asdict(record.motion),
        'holds': counts.holds,
        'held_fraction': record.held_fraction,
    }


def run_plan(plan: SeamPlan, workdir: Path, *, log=print) -> list[dict[str, object]]:
    """Every mode at every delay on one core; the rows in plan order (delay, then mode)."""
    core = build_core(plan, workdir)
    try:
        rows = []
        for delay_ms in plan.delays_ms:
            for mode in plan.modes:
                start = time.perf_counter()
                row = summarize(SeamRun(core, plan, mode, delay_ms).run(), plan)
                log(
                    f'{mode:>17} {delay_ms:3d} ms: {row["num_seams"]} seams, departure p50 '
                    f'{row["departure_p50"]:.3f}, excess p50 {row["excess_p50"]:.3f}, held '
                    f'{100 * row["held_fraction"]:.1f}% ({time.perf_counter() - start:.1f} s)'
                )
                rows.append(row)
        return rows
    finally:
        core.close()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    defaults = SeamPlan()
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--delays-ms', type=int, nargs='+', default=list(defaults.delays_ms))
    parser.add_argument('--modes', nargs='+', choices=list(MODES), default=list(defaults.modes))
    parser.add_argument('--duration-s', type=float, default=defaults.duration_s)
    parser.add_argument('--dt-ms', type=int, default=defaults.dt_ms)
    parser.add_argument('--chunk', type=int, default=defaults.chunk, help='actions per chunk')
    parser.add_argument('--period-ms', type=int, default=defaults.period_ms, help='image period')
    parser.add_argument('--warmup-chunks', type=int, default=defaults.warmup_chunks)
    parser.add_argument('--arm-tau-ms', type=float, default=defaults.arm_tau_ms)
    parser.add_argument(
        '--execution-horizon',
        type=int,
        default=defaults.execution_horizon,
        help='engine.rtc_execution_horizon (0: the period in actions)',
    )
    parser.add_argument('--max-guidance', type=float, default=defaults.max_guidance)
    parser.add_argument('--mask-schedule', default=defaults.mask_schedule)
    parser.add_argument('--num-inference-steps', type=int, default=defaults.num_inference_steps)
    parser.add_argument('--seed', type=int, default=defaults.seed)
    parser.add_argument('--json', default=DEFAULT_JSON, help='results JSON ("": none)')
    parser.add_argument('--plot', default=DEFAULT_PLOT, help='plot PNG ("": none)')
    parser.add_argument('--workdir', default='', help='where the tiny folder goes (temporary)')
    return parser.parse_args(argv)


def plan_from_args(args: argparse.Namespace) -> SeamPlan:
    return SeamPlan(
        delays_ms=tuple(args.delays_ms),
        modes=tuple(args.modes),
        dt_ms=args.dt_ms,
        chunk=args.chunk,
        period_ms=args.period_ms,
        duration_s=args.duration_s,
        warmup_chunks=args.warmup_chunks,
        arm_tau_ms=args.arm_tau_ms,
        num_inference_steps=args.num_inference_steps,
        execution_horizon=args.execution_horizon,
        max_guidance=args.max_guidance,
        mask_schedule=args.mask_schedule,
        seed=args.seed,
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    plan = plan_from_args(args)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=args.workdir or None) as workdir:
        rows = run_plan(plan, Path(workdir))
    result = {
        'benchmark': 'chunk_seams',
        'commit': commit(),
        'date': time.strftime('%Y-%m-%d'),
        'machine': machine(),
        'plan': {**dataclasses.asdict(plan), 'rtc_execution_horizon': plan.rtc_execution_horizon},
        'wall_s': round(time.perf_counter() - start, 1),
        'rows': rows,
    }
    print(seam_table(rows))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=1) + '\n')
    if args.plot and not write_plot(rows, Path(args.plot)):
        print('matplotlib is not installed: no plot', file=sys.stderr)
    return 0


if __name__ == '__main__':
    sys.exit(main())
