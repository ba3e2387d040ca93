"""Part ``oft``: OpenVLA-OFT at openvla-7b's shapes with the LIBERO preset (two cameras,
chunks of 8 actions of 7 values, the state as a proprio token, center crop), bf16, eager
(the OFT runner has no CUDA graphs yet).

The OFT folder is made from the checkpoint part's openvla-7b folder without copying it
(``bench.lib.oft_checkpoints``: its files linked, a LIBERO-like ``dataset_statistics.json``,
the L1 head of about 151 M parameters and the proprio projector, random bf16) and served by
the engine core (``ScheduledCore`` with ``engine.oft_preset: libero``). Measured:

- one robot's step: the runner's whole pass (both cameras through the towers, the one-pass
  decoder, the head, the chunk on the host), the median of a few passes with fresh images
  (``bench.lib.oft_pass``), against its floor (``bench.lib.oft_cost``: the pass's FLOPs at
  the measured matmul rate or its weights over the copy bandwidth, whichever is longer);
  then 16 robots in one pass against theirs;
- the host time of the center crop of one camera image (the engine crops every camera of
  every step on its thread before the pass);
- the capacity at 10 Hz of chunks (deadline 100 ms) by the one capacity rule and the
  bisection the serving part uses (``bench.engine_paced``: each robot two fresh camera
  frames and its state per step), in 2 s windows after 1 s of warm-up, up to the robots
  the matmul rate allows (at most 16).

The dry run makes the OFT folder on the tiny OpenVLA folder (fp32 on the CPU), times 1 and
2 robots and bisects up to 2 in 1 s windows at 4 Hz. Each measure is saved as it ends
(``PartContext.save_partial``).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from typing import Any

import numpy as np

from bench.gpu_check.parts import PartContext
from bench.lib.capacity import CapacityCriteria, CapacityMeasure
from bench.lib.tables import cell, markdown_table

PRESET = 'libero'
ROBOT_COUNTS = (1, 16)
DRY_RUN_ROBOT_COUNTS = (1, 2)
MAX_ROBOTS = 16
DRY_RUN_MAX_ROBOTS = 2
REPS, WARMUP = 5, 2
DRY_RUN_REPS, DRY_RUN_WARMUP = 2, 1
CROP_REPS = 10
# The paced windows: the serving part's period and deadline, shorter windows (the part has
# less time); the dry run's robots ask slower and wait longer, as the serving part's do.
PERIOD_S, DEADLINE_MS, WARMUP_S, DURATION_S = 0.1, 100.0, 1.0, 2.0
DRY_RUN_PERIOD_S, DRY_RUN_DEADLINE_MS = 0.25, 1000.0
DRY_RUN_WARMUP_S, DRY_RUN_DURATION_S = 0.25, 1.0
INSTRUCTION = 'pick up the red block'  # the paced robots' (bench.lib.fleets)


def run(ctx: PartContext) -> dict[str, Any]:
    from bench.lib.oft_checkpoints import oft_folder_once
    from bench.lib.oft_cost import oft_checkpoint_shape, robots_at_period
    from vla_sched.model.config.openvla_oft import oft_preset

    ctx.require_cuda()
    settings = oft_preset(PRESET)
    started = time.monotonic()
    folder, reused = oft_folder_once(
        ctx.workdir, ctx.folder(), settings=settings, device=ctx.device, dtype=ctx.dtype
    )
    made_s = time.monotonic() - started
    print(f'{folder}: {"reused" if reused else "made"} in {made_s:.1f} s', flush=True)
    started = time.monotonic()
    core = make_oft_core(str(folder), device=ctx.device)
    load_s = time.monotonic() - started
    runner = core.scheduler.runner
    prompt = core.translator.prompts.build(INSTRUCTION)
    plan = oft_paced_plan(ctx.dry_run)
    shape = oft_checkpoint_shape(
        folder, settings, seq_len=len(prompt.token_ids), bytes_per_param=ctx.dtype.itemsize
    )
    rates = ctx.rates()
    data: dict[str, Any] = {
        'preset': PRESET,
        'num_images': settings.num_images,
        'chunk_len': settings.chunk_len,
        'action_dim': settings.action_dim,
        'proprio_dim': settings.proprio_dim,
        'center_crop': settings.center_crop,
        'dtype': str(ctx.dtype).removeprefix('torch.'),
        'cuda_graphs': False,
        'folder_made_s': made_s,
        'load_s': load_s,
        'seq_len': shape.seq_len,
        'head_params_m': shape.head_params / 1e6,
        'pass_tflop_per_robot': shape.pass_flops / 1e12,
        'period_s': plan.period_s,
        'steps': [],
    }
    if rates is not None:
        data['robots_bound'] = robots_at_period(shape, rates, plan.period_s)
    print(f'OFT core loaded in {load_s:.1f} s; {shape.seq_len} positions per step, head '
          f'{shape.head_params / 1e6:.4g} M parameters', flush=True)  # fmt: skip
    ctx.save_partial(data)
    state = np.zeros(settings.proprio_dim, dtype=np.float32)
    for num_robots in DRY_RUN_ROBOT_COUNTS if ctx.dry_run else ROBOT_COUNTS:
        data['steps'].append(measure_step(ctx, runner, prompt, shape, rates, num_robots, state))
        ctx.save_partial(data)
    data['crop_ms_per_image'] = crop_ms()
    ctx.save_partial(data)
    data['capacity'] = measure_capacity(ctx, core, plan, data, rates)
    core.close()
    return data


def oft_paced_plan(dry_run: bool):
    from bench.engine_paced import PacedPlan

    if dry_run:
        return PacedPlan(
            (1,), DRY_RUN_PERIOD_S, DRY_RUN_DEADLINE_MS, warmup_s=DRY_RUN_WARMUP_S,
            duration_s=DRY_RUN_DURATION_S,
        )  # fmt: skip
    return PacedPlan(
        (1,), PERIOD_S, DEADLINE_MS, warmup_s=WARMUP_S, duration_s=DURATION_S,
        drain_timeout_s=10.0,
    )  # fmt: skip


def make_oft_core(model_path: str, *, device: str):
    """The engine core on the OFT folder with the preset, late steps delivered (marked late)
    as the serving part's cores, eager."""
    from vla_sched.engine.config import EngineConfig
    from vla_sched.engine.scheduled_core import ScheduledCore

    config = EngineConfig(
        model_path=model_path, device=device, cuda_graphs=False, late_policy='deliver_late',
        oft_preset=PRESET,
    )  # fmt: skip
    return ScheduledCore.from_config(config)


def measure_step(
    ctx: PartContext, runner, prompt, shape, rates, num_robots: int, state: np.ndarray
) -> dict[str, Any]:
    """``num_robots`` robots' steps in one pass: the median of a few, against its floor."""
    from bench.lib.oft_cost import oft_pass_floor
    from bench.lib.oft_pass import time_oft_pass

    times = time_oft_pass(
        runner, prompt, num_robots=num_robots, state=state,
        warmup=DRY_RUN_WARMUP if ctx.dry_run else WARMUP,
        reps=DRY_RUN_REPS if ctx.dry_run else REPS,
    )  # fmt: skip
    row: dict[str, Any] = {
        'robots': num_robots,
        'pass_ms': times.median_ms,
        'times_ms': list(times.times_ms),
        'chunk_shape': list(times.chunk_shape),
    }
    if rates is not None:
        floor = oft_pass_floor(shape, rates, num_robots)
        row['floor'] = dataclasses.asdict(floor)
        row['over_floor'] = times.median_ms / floor.pass_ms
    print(f'{num_robots} robots in one pass: {times.median_ms:.2f} ms (median of '
          f'{len(times.times_ms)})', flush=True)  # fmt: skip
    return row


def crop_ms() -> float:
    """Host ms of the center crop of one 224 x 224 camera image, median of ``CROP_REPS``."""
    from vla_sched.model.layers.image_crop import center_crop_image

    frame = np.random.default_rng(0).integers(0, 256, (224, 224, 3), dtype=np.uint8)
    times = []
    for _ in range(CROP_REPS + 1):
        started = time.perf_counter()
        center_crop_image(frame)
        times.append((time.perf_counter() - started) * 1e3)
    return statistics.median(times[1:])


def measure_capacity(ctx: PartContext, core, plan, data: dict, rates) -> dict[str, Any]:
    """The capacity at the plan's period by bisection; saved after every window."""
    from bench.engine_paced import search_paced_capacity

    top = DRY_RUN_MAX_ROBOTS if ctx.dry_run else MAX_ROBOTS
    if 'robots_bound' in data:  # no count above the FLOP ceiling can pass
        top = max(1, min(top, math.ceil(data['robots_bound'])))
    capacity: dict[str, Any] = {
        'period_s': plan.period_s,
        'deadline_ms': plan.deadline_ms,
        'warmup_s': plan.warmup_s,
        'duration_s': plan.duration_s,
        'criteria': CapacityCriteria().describe(),
        'max_robots': top,
        'points': [],
        'capacity': None,
    }
    data['capacity'] = capacity

    def on_point(point) -> None:
        capacity['points'].append(dataclasses.asdict(point))
        print(f'capacity: {point.num_robots} robots, {point.num_results} results, p50 '
              f'{point.latency_ms_p50:.1f} ms, {point.actions_per_s:.0f} of '
              f'{point.target_actions_per_s:.0f} actions/s', flush=True)  # fmt: skip
        ctx.save_partial(data)

    search, _ = search_paced_capacity(
        core, plan, CapacityCriteria(), max_robots=top, bisect=True, on_point=on_point
    )
    capacity['capacity'] = search.capacity
    if data.get('robots_bound'):
        capacity['bound_share_served'] = search.capacity / data['robots_bound']
    ctx.save_partial(data)
    print(f'capacity: {search.capacity} robots', flush=True)
    return capacity


# --- the report -----------------------------------------------------------------------------


def _step_rows(steps: list[dict[str, Any]]) -> list[list[Any]]:
    rows = []
    for s in steps:
        floor = s.get('floor')
        rows.append([
            s['robots'], s['pass_ms'], floor['pass_ms'] if floor else '-',
            floor['compute_ms'] if floor else '-', floor['weights_ms'] if floor else '-',
            f'{s["over_floor"]:.2f}x' if 'over_floor' in s else '-',
        ])  # fmt: skip
    return rows


def _capacity_lines(c: dict[str, Any]) -> list[str]:
    from bench.engine_paced import PacedPoint
    from bench.engine_paced import markdown_table as paced_table

    found = c['capacity']
    result = (
        f'**{found}** robots' if found is not None else 'none found yet (its search did not end)'
    )
    share = c.get('bound_share_served')
    lines = [
        f'Capacity at {1 / c["period_s"]:g} Hz of chunks (deadline {c["deadline_ms"]:.0f} ms; '
        f'{c["criteria"]}; bisection from 1 robot up to {c["max_robots"]}; '
        f'{c["warmup_s"]:g} s warm-up and {c["duration_s"]:g} s window per count): {result}'
        + (f', {100 * share:.0f}% of the FLOP ceiling.' if share is not None else '.'),
    ]
    points = sorted(c['points'], key=lambda p: p['num_robots'])
    if points:
        paced = [PacedPoint(**{**p, 'capacity': CapacityMeasure(**p['capacity'])}) for p in points]
        lines += ['', paced_table(paced, criteria=CapacityCriteria())]
    return lines


def section(d: dict[str, Any]) -> list[str]:
    lines = [
        f'## OpenVLA-OFT ({d["preset"]} preset: {d["num_images"]} cameras, chunks of '
        f'{d["chunk_len"]} x {d["action_dim"]}, proprio {d["proprio_dim"]}, center crop '
        f'{"on" if d["center_crop"] else "off"}; {d["dtype"]}, CUDA graphs '
        f'{"on" if d["cuda_graphs"] else "off"})',
        '',
        f'{d["seq_len"]} positions per step, head {d["head_params_m"]:.4g} M parameters, '
        f'{d["pass_tflop_per_robot"]:.3g} TFLOP per robot; core loaded in {d["load_s"]:.1f} s.'
        + (
            f' The matmul rate allows {d["robots_bound"]:.1f} robots at {1 / d["period_s"]:g} Hz.'
            if 'robots_bound' in d
            else ''
        ),
    ]
    if 'crop_ms_per_image' in d:
        lines[-1] += (
            f' Center crop of one camera image on the host: {cell(d["crop_ms_per_image"])} ms.'
        )
    if d['steps']:
        headers = ['robots in one pass', 'pass ms (median)', 'floor ms', 'FLOPs ms',
                   'weights ms', 'pass / floor']  # fmt: skip
        lines += ['', markdown_table(headers, _step_rows(d['steps']))]
    if 'capacity' in d:
        lines += ['', *_capacity_lines(d['capacity'])]
    return lines
