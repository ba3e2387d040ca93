"""Part ``serving``: how many robots the engine core serves at 10 Hz, with and without mixed
passes, by the one capacity rule; and one robot's step against its floor.

The engine core without ROS (``bench.engine_paced``: cameras at 10 Hz, a fresh frame per
image, at most one step in flight per robot, deadline 100 ms after the frame's stamp) is
judged per robot count by the rule the CPU control loop uses (``bench.lib.capacity``: at
least 99% of the target action rate, at least 99% of the steps that ended within their
deadline). The capacity is found by bisection (1 robot, then the target of 10, then halving
the span up to ``MAX_ROBOTS``: at most 6 paced windows), once on a core whose scheduler runs
prefill and decode as separate passes and once on a core with mixed passes (each prefill
pass also decodes the running steps), each selected explicitly in the scheduler settings
the core is built with. Against the device: the robots the measured matmul rate allows at
10 Hz (``bench.lib.cost_model``'s FLOP ceiling) and the share of them served; one robot's
step (p50) against the floor of one step. Each core's load, each window and each capacity
found are saved as they come (``PartContext.save_partial``): a capacity not yet found is
None there.
"""

from __future__ import annotations

import dataclasses
import gc
import time
from collections.abc import Callable
from typing import Any

from bench.gpu_check.parts import PartContext
from bench.lib.capacity import CapacityCriteria, CapacityMeasure
from bench.lib.tables import cell

PERIOD_S = 0.1
DEADLINE_MS = 100.0
# The dry run's robots ask slower and wait longer, so that on a busy CPU the tiny model
# still serves a robot and the bisection goes on past it (the dry run checks the script).
DRY_RUN_PERIOD_S = 0.25
DRY_RUN_DEADLINE_MS = 1000.0
TARGET_ROBOTS = 10  # issue 22: at least 10 robots at 10 Hz on one H200
MAX_ROBOTS = 16  # the top of the bisection on a GPU
DRY_RUN_MAX_ROBOTS = 2
MODES = (('separate', False), ('mixed', True))  # name, mixed passes


def paced_plan(dry_run: bool):
    from bench.engine_paced import PacedPlan

    if dry_run:
        return PacedPlan((1,), DRY_RUN_PERIOD_S, DRY_RUN_DEADLINE_MS, warmup_s=0.5, duration_s=2.0)
    return PacedPlan(
        (1,), PERIOD_S, DEADLINE_MS, warmup_s=1.0, duration_s=3.0, drain_timeout_s=10.0
    )


@dataclasses.dataclass(slots=True)
class ModeRecord:
    """What one core (mixed passes on or off) has given so far: its load time, its paced
    windows in the order measured, its capacity once the bisection ended (else None)."""

    load_s: float | None = None
    points: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    capacity: int | None = None


def run(ctx: PartContext) -> dict[str, Any]:
    ctx.require_cuda()
    # Graphs only where the engine-core check passed with them: else the numbers are eager.
    graphs = not ctx.dry_run and bool(ctx.data('engine_core'))
    plan = paced_plan(ctx.dry_run)
    max_robots = DRY_RUN_MAX_ROBOTS if ctx.dry_run else MAX_ROBOTS
    first_probe = None if ctx.dry_run else TARGET_ROBOTS
    settings = {
        'cuda_graphs': graphs,
        'period_s': plan.period_s,
        'deadline_ms': plan.deadline_ms,
        'warmup_s': plan.warmup_s,
        'duration_s': plan.duration_s,
        'criteria': CapacityCriteria().describe(),
        'max_robots': max_robots,
        'first_probe': first_probe,
    }
    rates = ctx.rates()
    bounds = device_bounds(ctx, rates, plan) if rates is not None else None
    modes = {name: ModeRecord() for name, _ in MODES}

    def save() -> None:
        ctx.save_partial(summary(settings, modes, bounds))

    for name, mixed in MODES:
        measure_mode(ctx, plan, mixed, modes[name], save, graphs=graphs, max_robots=max_robots,
                     first_probe=first_probe)  # fmt: skip
    return summary(settings, modes, bounds)


def summary(
    settings: dict[str, Any], modes: dict[str, ModeRecord], bounds: dict[str, Any] | None
) -> dict[str, Any]:
    """The part's data from what the cores gave so far: whole once both searches ended,
    else partial (a capacity not yet found is None)."""
    separate, mixed = modes['separate'], modes['mixed']
    out: dict[str, Any] = {
        **settings,
        'load_s': {name: m.load_s for name, m in modes.items() if m.load_s is not None},
        'points': separate.points,
        'mixed_points': mixed.points,
        'capacity_separate': separate.capacity,
        'capacity_mixed': mixed.capacity,
    }
    found = [m.capacity for m in modes.values() if m.capacity is not None]
    out['max_robots_served'] = max(found, default=None)
    if bounds is not None:
        out.update(bounds)
        out.update(served_against(bounds, separate.points, out['max_robots_served']))
    return out


def measure_mode(
    ctx: PartContext, plan, mixed: bool, record: ModeRecord, save: Callable[[], None], *,
    graphs: bool, max_robots: int, first_probe: int | None,
) -> None:  # fmt: skip
    """One core with mixed passes on or off: its capacity by bisection and every window,
    into ``record``; ``save`` after the load and after each window."""
    from bench.engine_paced import make_core, run_checked, search_paced_capacity

    label = 'mixed passes' if mixed else 'separate passes'
    started = time.monotonic()
    core = make_core(str(ctx.folder()), device=ctx.device, cuda_graphs=graphs, mixed_passes=mixed)
    record.load_s = time.monotonic() - started
    warm = run_checked(core, num_robots=max_robots, steps_per_robot=1)
    print(f'{label}: core loaded in {record.load_s:.1f} s; warm-up: {warm.num_results} steps '
          f'in {warm.seconds:.1f} s', flush=True)  # fmt: skip
    save()

    def on_point(point) -> None:
        record.points.append(dataclasses.asdict(point))
        print(f'{label}: {_point_line(record.points[-1])}', flush=True)
        save()

    search, _ = search_paced_capacity(
        core, plan, CapacityCriteria(), max_robots=max_robots, bisect=True,
        first_probe=first_probe, on_point=on_point,
    )  # fmt: skip
    record.capacity = search.capacity
    print(f'{label}: capacity {search.capacity} robots', flush=True)
    save()
    core.close()
    del core
    _free_device_memory(ctx)


def _free_device_memory(ctx: PartContext) -> None:
    """Let the next core have the memory of the one just dropped (weights, KV, graphs)."""
    gc.collect()
    if not ctx.dry_run:
        import torch

        torch.cuda.empty_cache()


def served(point: dict[str, Any]) -> bool:
    """Whether a paced point's robot count is served under the one capacity rule."""
    return not CapacityCriteria().failures(CapacityMeasure(**point['capacity']))


def device_bounds(ctx: PartContext, rates, plan) -> dict[str, Any]:
    """The robots the device allows at the plan's period (every step's FLOPs at the matmul
    rate; and with prefill and decode in separate passes, ``physical_bounds``' pass bound)
    and the floor of one step."""
    from bench.lib.cost_model import (
        checkpoint_shape,
        hardware_bound_cost,
        physical_bounds,
        step_floor,
    )

    shape = checkpoint_shape(ctx.folder(), bytes_per_param=ctx.dtype.itemsize)
    floor = step_floor(shape, rates)
    bounds = physical_bounds(hardware_bound_cost(shape, rates), shape, plan.period_s)
    return {
        'floor': dataclasses.asdict(floor),
        'step_tflop': shape.step_flops / 1e12,
        'robots_bound': bounds.flop_ceiling,
        'robots_pass_bound': bounds.pass_bound,
    }


def served_against(bounds: dict[str, Any], points: list[dict], max_served: int | None) -> dict:
    """The share of the FLOP ceiling served (once a capacity is known) and one robot's step
    (p50, from ``points``, separate passes) against the floor (once it was measured)."""
    out = {}
    if max_served is not None:
        out['bound_share_served'] = max_served / bounds['robots_bound']
    one = [p for p in points if p['num_robots'] == 1]
    if one:
        out['one_robot_step_over_floor'] = one[0]['latency_ms_p50'] / bounds['floor']['step_ms']
    return out


def _point_line(p: dict[str, Any]) -> str:
    verdict = 'pass' if served(p) else 'fail'
    return (
        f'{p["num_robots"]} robots: {p["num_sent"]} sent, {p["num_results"]} results, '
        f'{p["num_failures"]} failures; latency p50 {p["latency_ms_p50"]:.1f} ms, p99 '
        f'{p["latency_ms_p99"]:.1f} ms; {p["actions_per_s"]:.1f} of '
        f'{p["target_actions_per_s"]:.0f} actions/s; {verdict}'
    )


def _table(points: list[dict[str, Any]]) -> str:
    from bench.engine_paced import PacedPoint, markdown_table

    ordered = sorted(points, key=lambda p: p['num_robots'])
    return markdown_table(
        [PacedPoint(**{**p, 'capacity': CapacityMeasure(**p['capacity'])}) for p in ordered],
        criteria=CapacityCriteria(),
    )


def _capacity(value: int | None, unit: str, passes: str) -> str:
    """A capacity in the section's sentence; one not found yet (partial data) says so."""
    if value is None:
        return f'none found yet with {passes} (its search did not end)'
    return f'**{value}**{unit} with {passes}'


def section(d: dict[str, Any]) -> list[str]:
    probe = f', the target {d["first_probe"]} first' if d['first_probe'] else ''
    lines = [
        f'## Serving without ROS ({1 / d["period_s"]:g} Hz per robot, deadline '
        f'{d["deadline_ms"]:.0f} ms, '
        f'{d["warmup_s"]:g} s warm-up and {d["duration_s"]:g} s window per count, CUDA graphs '
        f'{"on" if d["cuda_graphs"] else "off"})',
        '',
        f'Capacity ({d["criteria"]}; bisection from 1 robot up to {d["max_robots"]}{probe}): '
        f'{_capacity(d["capacity_separate"], " robots", "separate prefill and decode passes")}, '
        f'{_capacity(d["capacity_mixed"], "", "mixed passes")}.',
    ]
    if 'robots_bound' in d:
        f = d['floor']
        share = d.get('bound_share_served')
        served_share = f'; served {100 * share:.0f}% of that' if share is not None else ''
        lines.append(
            f'One step is {d["step_tflop"]:.3g} TFLOP; the matmul rate allows '
            f'{d["robots_bound"]:.1f} robots at {1 / d["period_s"]:g} Hz '
            f'({d["robots_pass_bound"]:.1f} with prefill and decode in separate '
            f'passes){served_share}. Floor of one step '
            f"{f['step_ms']:.2f} ms; one robot's step (p50) / floor: "
            f'{cell(d.get("one_robot_step_over_floor", float("nan")))}x.'
        )
    for title, key in (('Separate passes', 'points'), ('Mixed passes', 'mixed_points')):
        table = _table(d[key]) if d[key] else 'No window measured.'
        lines += ['', f'{title}:', '', table]
    return lines
