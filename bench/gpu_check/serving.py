"""Part ``serving``: the engine core without ROS, paced at 10 Hz per robot
(``bench.engine_paced.run_paced``) for 1, 4, 8, 12, 16 and 32 robots, then 1, 4, 8 and 12
again with mixed passes on the same core; against the device.

Per robot count: step latency p50/p99, the share of steps within their 100 ms deadline,
actions/s against the target, and whether the count is served under the one capacity rule
(``bench.lib.capacity``). Against the device: the robot count the measured matmul rate
allows at 10 Hz (every robot step's FLOPs: ``bench.lib.cost_model``'s FLOP ceiling) and the
share of it served; one robot's step (p50) against the floor of one step.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from bench.gpu_check.parts import PartContext
from bench.lib.capacity import CapacityCriteria, CapacityMeasure
from bench.lib.tables import cell

PERIOD_S = 0.1
DEADLINE_MS = 100.0
NUM_MIXED_COUNTS = 4


def paced_plan(dry_run: bool):
    from bench.engine_paced import PacedPlan

    if dry_run:
        return PacedPlan((1, 2), PERIOD_S, DEADLINE_MS, warmup_s=0.3, duration_s=1.0)
    return PacedPlan(
        (1, 4, 8, 12, 16, 32),
        PERIOD_S,
        DEADLINE_MS,
        warmup_s=1.0,
        duration_s=3.0,
        drain_timeout_s=10.0,
    )


def run(ctx: PartContext) -> dict[str, Any]:
    from bench.engine_paced import make_core, run_checked, run_paced

    ctx.require_cuda()
    folder = ctx.folder()
    # Graphs only where the engine-core check passed with them: else the numbers are eager.
    graphs = not ctx.dry_run and bool(ctx.data('engine_core'))
    plan = paced_plan(ctx.dry_run)
    core = make_core(str(folder), device=ctx.device, cuda_graphs=graphs)
    warm = run_checked(core, num_robots=max(plan.robot_counts), steps_per_robot=1)
    print(f'warm-up: {warm.num_results} steps in {warm.seconds:.1f} s', flush=True)

    def measure(counts: tuple[int, ...], label: str) -> list[dict[str, Any]]:
        points = []
        for count in counts:
            (point,) = run_paced(core, dataclasses.replace(plan, robot_counts=(count,)))
            points.append(dataclasses.asdict(point))
            print(f'{label}{_point_line(points[-1])}', flush=True)
        return points

    points = measure(plan.robot_counts, '')
    # Mixed passes (each prefill pass also decodes the running steps) are on by default on
    # the CPU only; the same core, switched to them, measures what they do on this device.
    sched = core.scheduler
    sched.config = dataclasses.replace(sched.config, enable_mixed_chunk=True)
    mixed_points = measure(plan.robot_counts[:NUM_MIXED_COUNTS], 'mixed passes: ')
    served_counts = [p['num_robots'] for p in points if served(p)]
    out: dict[str, Any] = {
        'cuda_graphs': graphs,
        'period_s': plan.period_s,
        'deadline_ms': plan.deadline_ms,
        'warmup_s': plan.warmup_s,
        'duration_s': plan.duration_s,
        'points': points,
        'mixed_points': mixed_points,
        'max_robots_served': max(served_counts, default=0),
    }
    rates = ctx.rates()
    if rates is not None:
        out.update(against_device(ctx, rates, points, out['max_robots_served']))
    return out


def served(point: dict[str, Any]) -> bool:
    """Whether a paced point's robot count is served under the one capacity rule."""
    return not CapacityCriteria().failures(CapacityMeasure(**point['capacity']))


def against_device(ctx: PartContext, rates, points: list[dict], max_served: int) -> dict:
    """The robots the matmul rate allows, the share of them served, one robot's step
    against the floor."""
    from bench.lib.cost_model import (
        checkpoint_shape,
        hardware_bound_cost,
        physical_bounds,
        step_floor,
    )

    shape = checkpoint_shape(ctx.folder(), bytes_per_param=ctx.dtype.itemsize)
    floor = step_floor(shape, rates)
    bound = physical_bounds(hardware_bound_cost(shape, rates), shape, PERIOD_S).flop_ceiling
    out = {
        'floor': dataclasses.asdict(floor),
        'step_tflop': shape.step_flops / 1e12,
        'robots_bound': bound,
        'bound_share_served': max_served / bound,
    }
    one = [p for p in points if p['num_robots'] == 1]
    if one:
        out['one_robot_step_over_floor'] = one[0]['latency_ms_p50'] / floor.step_ms
    return out


def _point_line(p: dict[str, Any]) -> str:
    return (
        f'{p["num_robots"]} robots: {p["num_sent"]} sent, {p["num_results"]} results, '
        f'{p["num_failures"]} failures; latency p50 {p["latency_ms_p50"]:.1f} ms, p99 '
        f'{p["latency_ms_p99"]:.1f} ms; {p["actions_per_s"]:.1f} of '
        f'{p["target_actions_per_s"]:.0f} actions/s'
    )


def _table(points: list[dict[str, Any]]) -> str:
    from bench.engine_paced import PacedPoint, markdown_table

    return markdown_table(
        [PacedPoint(**{**p, 'capacity': CapacityMeasure(**p['capacity'])}) for p in points]
    )


def section(d: dict[str, Any]) -> list[str]:
    lines = [
        f'## Serving without ROS (10 Hz per robot, deadline {d["deadline_ms"]:.0f} ms, '
        f'{d["duration_s"]:.0f} s per count, CUDA graphs {"on" if d["cuda_graphs"] else "off"})',
        '',
        _table(d['points']),
        '',
        f'Most robots served ({CapacityCriteria().describe()}): {d["max_robots_served"]}.',
    ]
    if 'robots_bound' in d:
        f = d['floor']
        lines.append(
            f'One step is {d["step_tflop"]:.3g} TFLOP; the matmul rate allows '
            f'{d["robots_bound"]:.1f} robots at 10 Hz; served {100 * d["bound_share_served"]:.0f}%'
            f" of that. Floor of one step {f['step_ms']:.2f} ms; one robot's step (p50) / floor: "
            f'{cell(d.get("one_robot_step_over_floor", float("nan")))}x.'
        )
    if d['mixed_points']:
        lines += ['', 'With mixed passes:', '', _table(d['mixed_points'])]
    return lines
