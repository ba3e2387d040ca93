"""PROJECTED capacity of OpenVLA-7B on one H200: our scheduler against one-at-a-time serving.

A projection, not a measurement: no GPU served these robots. The real ``Scheduler`` (with
the settings the engine derives from its ``EngineConfig``) drives the simulated runner whose
passes take the durations of a ``HardwareCostModel`` built from openvla-7b's sizes and rates
measured on an NVIDIA H200 (``bench.lib.cost_model``); a one-request-at-a-time server
(the baseline's way) runs under the same cost model (``bench.lib.simulation``). Each step is
OpenVLA's prompt as the engine's step translator builds it (the tiny OpenVLA folder has the
7B's layout: BOS, 256 image tokens, the instruction, 7 action tokens). Robots at 10 Hz
behave as the node's robots do (``bench.lib.fleets``); the criteria and the stepping are the
control loop's (``bench.lib.capacity``), the counts between the last pass and the next
failure refined one by one. Latency is image stamp to the step's end on the engine's clock
(no ROS, no transport).

Per calibration (``hardware bound``, ``as measured``, ``as measured, prefill graphs``:
``bench.lib.cost_model``) it prints the cost model, each
server's capacity and 1-robot latency, the ratio to the one-at-a-time server, and the
capacity's share of the physical bounds: the pass bound (one prefill pass for all robots,
then shared decode passes, fill the period) and the FLOP ceiling (every step's FLOPs fill
the period). What bounds it: OpenVLA puts the image right after BOS, so each step prefills
its whole 280-token prompt (about 4.1 TFLOP with the vision towers), while decode reads the
weights once per pass whatever the batch: prefill FLOPs set the ceiling.

The scheduler runs once per chunk size: 8192 (SGLang's default on an H200-class GPU) and
256 (the node's default, set for the tiny model on a CPU), with separate prefill and decode
passes; and with 8192 once more with mixed passes (each prefill pass also decodes the
running steps: SGLang's mixed chunk, which the engine uses by default, on a GPU through the
captured prefill path).

    python -m bench.capacity_projection --json out.json --markdown out.md    # a few minutes
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bench.lib.capacity import (
    CapacityCriteria,
    CapacityMeasure,
    CapacitySearch,
    CapacityStep,
    robot_ladder,
    search_capacity,
    steps_table,
)
from bench.lib.checkpoints import write_openvla_folder
from bench.lib.cost_model import (
    CALIBRATIONS,
    Bounds,
    H200Measurements,
    ModelShape,
    calibrated_cost,
    one_at_a_time_step_ns,
    openvla_7b_shape,
    physical_bounds,
)
from bench.lib.fleets import FleetTiming
from bench.lib.simulation import OneAtATimeServer, SimServer, SimulatedEngine, serve_robots
from vla_sched.engine.assembly import scheduler_config_for
from vla_sched.engine.checkpoints import open_served
from vla_sched.engine.config import EngineConfig
from vla_sched.model.families.openvla.steps import StepTranslator
from vla_sched.testing.sim_runner import HardwareCostModel

ONE_AT_A_TIME = 'one-at-a-time'
PHASES_IN_WORDS = {'aligned': 'all at once', 'random': 'at random phases', 'spread': 'spread'}


@dataclass(frozen=True, slots=True)
class ProjectionPlan:
    """What the projection runs (times on the simulated clock)."""

    timing: FleetTiming = dataclasses.field(default_factory=FleetTiming)
    max_robots: int = 64
    max_failures_in_row: int = 2
    host_overhead_us: float = 1000.0  # the scheduler's host work per iteration
    kv_pool_tokens: int = 65536  # 34 GB of openvla-7b KV: the H200 holds it beside the weights
    chunk_sizes: tuple[int, ...] = (8192, 256)
    mixed_chunk_sizes: tuple[int, ...] = (8192,)  # also with mixed passes

    def __post_init__(self) -> None:
        if self.max_robots < 1 or self.max_failures_in_row < 1 or not self.chunk_sizes:
            raise ValueError('max_robots and max_failures_in_row must be >= 1, chunk_sizes set')
        if self.host_overhead_us < 0:
            raise ValueError(f'host_overhead_us must be >= 0, got {self.host_overhead_us}')


@dataclass(frozen=True, slots=True)
class Projection:
    """One calibration: its cost model, its bounds, each server's capacity search."""

    calibration: str
    measurements: H200Measurements
    cost: HardwareCostModel
    bounds: Bounds
    searches: tuple[CapacitySearch, ...]  # the scheduler per chunk size, mixed, one-at-a-time

    @property
    def one_at_a_time(self) -> CapacitySearch:
        return next(s for s in self.searches if s.system == ONE_AT_A_TIME)

    def row(self) -> dict[str, Any]:
        return {
            'calibration': self.calibration,
            'measurements': dataclasses.asdict(self.measurements),
            'cost_model': dataclasses.asdict(self.cost),
            'bounds': dataclasses.asdict(self.bounds),
            'searches': [s.row() for s in self.searches],
        }


def openvla_translator(workdir: Path) -> StepTranslator:
    """The engine's step translator for OpenVLA's prompts: of a tiny OpenVLA folder written
    into ``workdir`` (its prompt layout is the 7B's; the cost model has the 7B's sizes)."""
    folder = write_openvla_folder(workdir / 'openvla-tiny', tiny=True, num_shards=1)
    return open_served(folder, EngineConfig()).translator


def projection_servers(
    plan: ProjectionPlan, cost: HardwareCostModel, shape: ModelShape, translator: StepTranslator
) -> list[tuple[str, Callable[[], SimServer]]]:
    """Each server under test, labelled: the engine's scheduler with its GPU settings per
    chunk size, with separate prefill and decode passes (and again with mixed passes), then
    one step at a time."""

    def scheduled(chunk: int, *, mixed: bool) -> Callable[[], SimServer]:
        engine = EngineConfig(chunked_prefill_size=chunk, kv_pool_tokens=plan.kv_pool_tokens)
        config = dataclasses.replace(
            scheduler_config_for(engine, 'cuda'), enable_mixed_chunk=mixed
        )
        return lambda: SimulatedEngine.for_engine(
            engine, cost, translator, host_overhead_us=plan.host_overhead_us, config=config
        )

    servers = [(f'vla_sched, chunk {c}', scheduled(c, mixed=False)) for c in plan.chunk_sizes]
    servers += [
        (f'vla_sched, chunk {c}, mixed passes', scheduled(c, mixed=True))
        for c in plan.mixed_chunk_sizes
    ]
    step_ns = round(one_at_a_time_step_ns(cost, shape))
    servers.append((ONE_AT_A_TIME, lambda: OneAtATimeServer(step_ns)))
    return servers


def project(
    calibration: str,
    plan: ProjectionPlan,
    *,
    shape: ModelShape,
    criteria: CapacityCriteria,
    translator: StepTranslator,
    hw: H200Measurements | None = None,
    progress: Callable[[str], None] = print,
) -> Projection:
    """Both servers' capacity under one calibration (the scheduler once per chunk size), on
    the calibration's own measurements unless ``hw`` is given."""
    hw = hw or CALIBRATIONS[calibration][0]
    cost = calibrated_cost(calibration, shape, hw)
    servers = projection_servers(plan, cost, shape, translator)
    searches = []
    for label, make in servers:

        def measure(n: int, make: Callable[[], SimServer] = make) -> CapacityMeasure:
            return serve_robots(make(), n, plan.timing)

        searches.append(
            search_capacity(
                label,
                robot_ladder(plan.max_robots),
                measure,
                criteria,
                max_failures_in_row=plan.max_failures_in_row,
                refine=True,
                on_step=lambda step, label=label: progress(_step_line(label, step)),
            )
        )
    bounds = physical_bounds(cost, shape, plan.timing.period_s)
    return Projection(calibration, hw, cost, bounds, tuple(searches))


def _step_line(label: str, step: CapacityStep) -> str:
    m = step.measure
    verdict = 'pass' if step.passed else 'fail (' + '; '.join(step.failures) + ')'
    return (
        f'  {label}: {m.num_robots} robots: rate {100 * m.rate_share:.1f}%, on time '
        f'{100 * m.on_time_share:.1f}%, p50/p99 {m.latency_ms_p50:.0f}/{m.latency_ms_p99:.0f} '
        f'ms: {verdict}'
    )


# --- the report -----------------------------------------------------------------------------


def cost_line(p: Projection, shape: ModelShape) -> str:
    cost, hw = p.cost, p.measurements
    one_prefill = cost.prefill_ns(shape.prompt_len, 1) / 1e6
    one_decode = cost.decode_ns(1, shape.prompt_len + 1) / 1e6
    return (
        f'{hw.run}; copy {hw.copy_gb_per_s:.0f} GB/s, bf16 matmul {hw.matmul_tflops:.0f} '
        f'TFLOP/s; prefill FLOPs at {100 * cost.compute_utilization:.1f}% of the matmul rate, '
        f'weights at {100 * cost.weight_bandwidth_utilization:.0f}% and KV at '
        f'{100 * cost.kv_bandwidth_utilization:.1f}% of the copy rate, fixed cost per prefill '
        f'pass {cost.prefill_fixed_ns / 1e6:.2f} ms and per decode pass '
        f'{cost.decode_fixed_ns / 1e6:.2f} ms; one robot: prefill {one_prefill:.2f} ms, decode '
        f'step {one_decode:.2f} ms, step {one_at_a_time_step_ns(cost, shape) / 1e6:.2f} ms'
    )


def markdown(
    projections: list[Projection],
    plan: ProjectionPlan,
    shape: ModelShape,
    criteria: CapacityCriteria,
) -> str:
    hz = 1 / plan.timing.period_s
    lines = [
        f'**Projection** (no GPU served these robots): OpenVLA-7B on one H200, robots at '
        f'{hz:.0f} Hz served with {criteria.describe()}; the real scheduler over the simulated '
        'runner, and a one-request-at-a-time server, under the same cost model; '
        f'{plan.timing.duration_s:g} s of images judged after {plan.timing.warmup_s:g} s, '
        f'cameras {PHASES_IN_WORDS[plan.timing.phases]}, '
        f'{plan.host_overhead_us:g} us of host work per scheduler iteration.',
        '',
        f'openvla-7b: decoder {shape.decoder_params / 1e9:.2f} B parameters, vision towers and '
        f'projector {shape.vision_params / 1e9:.3f} B, a {shape.prompt_len}-token prompt '
        f'(BOS, {shape.num_image_tokens} image tokens, {shape.num_text_tokens} text tokens), '
        f'{shape.num_action_tokens} action tokens: {shape.step_flops / 1e12:.2f} TFLOP per '
        f'robot step. Copy rates are device-to-device (reads + writes).',
        '',
        *[f'- {p.calibration}: {cost_line(p, shape)}' for p in projections],
        '',
        '| calibration | server | capacity (robots) | 1 robot p50 / p99 ms | vs one-at-a-time '
        '| of the pass bound | of the FLOP ceiling |',
        '|---|---|---|---|---|---|---|',
    ]
    for p in projections:
        base = p.one_at_a_time.capacity
        for search in p.searches:
            one = search.one_robot
            lat = f'{one.latency_ms_p50:.0f} / {one.latency_ms_p99:.0f}' if one else 'n/a'
            if search.system == ONE_AT_A_TIME:
                ratio = '-'
            else:
                ratio = f'{search.capacity / base:.2f}x' if base else f'{search.capacity} vs 0'
            lines.append(
                f'| {p.calibration} | {search.system} | {search.capacity} | {lat} | {ratio} '
                f'| {_share(search.capacity, p.bounds.pass_bound)} '
                f'| {_share(search.capacity, p.bounds.flop_ceiling)} |'
            )
    lines += [
        '',
        '| calibration | FLOP ceiling | bandwidth ceiling | pass bound | one-at-a-time bound |',
        '|---|---|---|---|---|',
        *[
            f'| {p.calibration} | {p.bounds.flop_ceiling:.1f} | {p.bounds.bandwidth_ceiling:.0f} '
            f'| {p.bounds.pass_bound:.1f} | {p.bounds.one_at_a_time_bound:.2f} |'
            for p in projections
        ],
        '',
        *[
            f'transformers `generate` as measured in {run.run.split(" (")[0]} takes '
            f'{run.generate_step_ms:.0f} ms per step for one robot: it serves '
            f'{math.floor(plan.timing.period_s * 1e3 / run.generate_step_ms)} robots at '
            f'{hz:.0f} Hz.'
            for run in dict.fromkeys(p.measurements for p in projections)
        ],
    ]
    for p in projections:
        lines += ['', f'{p.calibration}, every count:', '', steps_table(list(p.searches))]
    return '\n'.join(lines)


def _share(capacity: int, bound: float) -> str:
    return f'{100 * capacity / bound:.0f}%' if bound > 0 else 'n/a'


def run(
    plan: ProjectionPlan,
    calibrations: tuple[str, ...] = tuple(CALIBRATIONS),
    *,
    hw: H200Measurements | None = None,
    criteria: CapacityCriteria | None = None,
    json_path: str = '',
    markdown_path: str = '',
) -> list[Projection]:
    torch.set_num_threads(1)  # tiny index tensors: a thread pool only adds overhead
    criteria = criteria or CapacityCriteria()
    shape = openvla_7b_shape()
    projections = []
    with tempfile.TemporaryDirectory(prefix='vla_projection_') as tmp:
        translator = openvla_translator(Path(tmp))
        for name in calibrations:
            print(f'{name}:', flush=True)
            projections.append(
                project(
                    name, plan, shape=shape, criteria=criteria, translator=translator, hw=hw,
                    progress=_say,
                )
            )  # fmt: skip
    report = markdown(projections, plan, shape, criteria)
    print()
    print(report)
    if json_path:
        record = {
            'projection': 'no GPU served these robots',
            'plan': dataclasses.asdict(plan),
            'criteria': dataclasses.asdict(criteria),
            'shape': dataclasses.asdict(shape),
            'projections': [p.row() for p in projections],
        }
        Path(json_path).write_text(json.dumps(record, indent=1) + '\n')
    if markdown_path:
        Path(markdown_path).write_text(report + '\n')
    return projections


def _say(text: str) -> None:
    print(text, flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    base = ProjectionPlan()
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument(
        '--calibrations', nargs='+', choices=list(CALIBRATIONS), default=list(CALIBRATIONS)
    )
    parser.add_argument('--max-robots', type=int, default=base.max_robots)
    parser.add_argument('--warmup', type=float, default=base.timing.warmup_s, help='sim s')
    parser.add_argument('--duration', type=float, default=base.timing.duration_s, help='sim s')
    parser.add_argument('--chunks', type=int, nargs='+', default=list(base.chunk_sizes))
    parser.add_argument(
        '--mixed-chunks',
        type=int,
        nargs='*',
        default=list(base.mixed_chunk_sizes),
        help='chunk sizes also run with mixed passes (SGLang mixed chunk; none: omit)',
    )
    parser.add_argument('--host-overhead-us', type=float, default=base.host_overhead_us)
    parser.add_argument('--seed', type=int, default=base.timing.seed, help='robot phases')
    parser.add_argument(
        '--aligned', action='store_true', help='every camera fires at once (default: random)'
    )
    parser.add_argument('--json', default='', help='write the results here')
    parser.add_argument('--markdown', default='', help='write the tables here')
    return parser.parse_args(argv)


def plan_from_args(args: argparse.Namespace) -> ProjectionPlan:
    base = ProjectionPlan()
    timing = dataclasses.replace(
        base.timing,
        warmup_s=args.warmup,
        duration_s=args.duration,
        seed=args.seed,
        phases='aligned' if args.aligned else 'random',
    )
    return dataclasses.replace(
        base,
        timing=timing,
        max_robots=args.max_robots,
        chunk_sizes=tuple(args.chunks),
        mixed_chunk_sizes=tuple(args.mixed_chunks),
        host_overhead_us=args.host_overhead_us,
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    projections = run(
        plan_from_args(args),
        tuple(args.calibrations),
        json_path=args.json,
        markdown_path=args.markdown,
    )
    return 0 if all(s.steps for p in projections for s in p.searches) else 1


if __name__ == '__main__':
    sys.exit(main())
