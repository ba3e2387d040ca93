"""Part ``oft``: OpenVLA-OFT at openvla-7b's shapes with the LIBERO preset (two cameras,
chunks of 8 actions of 7 values, the state as a proprio token, center crop), bf16, as the
engine serves it on a GPU: its passes replayed from CUDA graphs (``engine.cuda_graphs``).

The OFT folder is made from the checkpoint part's openvla-7b folder without copying it
(``bench.lib.oft_checkpoints``: its files linked, a LIBERO-like ``dataset_statistics.json``,
the L1 head of about 151 M parameters and the proprio projector, random bf16) and served by
the engine core (``ScheduledCore`` with ``engine.oft_preset: libero`` and CUDA graphs). Two
runners share its model and KV caches (``bench.lib.oft_pass.runner_beside``), on a slot
table of 16 robots: one on the padded path at the engine's prepared sizes
(``OFTPassSizes()``: 1, 2, 4 and 8 robots' worth of a sequence), captured (its capture time
is reported), and one eager. Checked first: the captured runner's head output against the
eager runner's on the same batch of 1 and of 16 robots (within ``GRAPHS_TOLERANCE``, bf16
rounding of differently shaped passes). Measured:

- one robot's step: the runner's whole call (both cameras through the towers, the decoder
  and the head, the chunk on the host), the median of a few calls with fresh images
  (``bench.lib.oft_pass``), replayed from the graphs, against its floor
  (``bench.lib.oft_cost``: the step's FLOPs at the measured matmul rate or its weights over
  the copy bandwidth, whichever is longer); the same step eager beside it (information);
  then 16 robots in one call (two passes of 8) against theirs. Every timed call must run
  from the graphs (``padding_stats()['oft'].num_eager_runs == 0``); the padding's share of
  the passes (tokens) and of the vision encoder's (images) is reported;
- the host time of the center crop of one camera image (the engine crops every camera of
  every step on its thread before the pass);
- the capacity at 10 Hz of chunks (deadline 100 ms) by the one capacity rule and the
  bisection the serving part uses (``bench.engine_paced``: each robot two fresh camera
  frames and its state per step), in 2 s windows after 1 s of warm-up, up to the robots
  the matmul rate allows (at most 16), with what the core's paths ran meanwhile.

The dry run makes the OFT folder on the tiny OpenVLA folder (fp32 on the CPU, where nothing
is captured: the padded runner runs the same padded passes eagerly and the engine core its
plain pass), checks and times 1 and 2 robots and bisects up to 2 in 1 s windows at 4 Hz.
Each measure is saved as it ends (``PartContext.save_partial``).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from typing import Any

import numpy as np

from bench.gpu_check.oft_report import section as section
from bench.gpu_check.parts import PartContext
from bench.lib.capacity import CapacityCriteria

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
# The captured passes against the eager pass, max |a - b| / max |b| of the head's output: the
# same kernels at other shapes (padded, cut into passes), so only rounding differs; in bf16
# it adds up over 32 layers (the model part's logits against transformers': 1.7e-2 on the
# H200), in fp32 it stays near the dtype's precision.
GRAPHS_TOLERANCE = {'bfloat16': 5e-2, 'float32': 1e-4}


def run(ctx: PartContext) -> dict[str, Any]:
    from bench.lib.oft_checkpoints import oft_folder_once
    from bench.lib.oft_cost import oft_checkpoint_shape, robots_at_period
    from vla_sched.model.families.openvla_oft.checkpoint import oft_preset

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
    prompt = core.served.translator.prompts.build(INSTRUCTION)
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
        'core_cuda_graphs': _is_captured(runner),
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
    print(f'OFT core loaded (weights, KV pool, graphs if any) in {load_s:.1f} s; '
          f'{shape.seq_len} positions per step, head {shape.head_params / 1e6:.4g} M '
          f'parameters', flush=True)  # fmt: skip
    ctx.save_partial(data)
    measure_passes(ctx, runner, prompt, shape, rates, data)
    data['crop_ms_per_image'] = crop_ms()
    ctx.save_partial(data)
    data['capacity'] = measure_capacity(ctx, core, plan, data, rates)
    core.close()
    return data


def _is_captured(runner) -> bool:
    """Whether ``runner``'s OFT passes replay CUDA graphs."""
    return runner.oft_graphs is not None and runner.oft_graphs.is_captured


def measure_passes(ctx: PartContext, runner, prompt, shape, rates, data: dict) -> None:
    """The padded runner (captured on a GPU) and the eager one beside the engine core's
    runner, for the largest robot count: the check, then each count's calls from the padded
    runner and one robot's eager. Both runners are dropped on return (and their graphs'
    pool with them)."""
    from bench.lib.oft_pass import runner_beside
    from vla_sched.model.families.openvla_oft.passes import OFTPassSizes

    counts = DRY_RUN_ROBOT_COUNTS if ctx.dry_run else ROBOT_COUNTS
    seq_len = len(prompt.token_ids)
    state = np.zeros(runner.model.spec.settings.proprio_dim, dtype=np.float32)
    started = time.monotonic()
    graphs = runner_beside(
        runner, num_robots=max(counts), seq_len=seq_len, cuda_graphs=not ctx.dry_run,
        pass_sizes=OFTPassSizes(),
    )  # fmt: skip
    data['capture_s'] = time.monotonic() - started
    if graphs.oft_graphs is None:
        raise RuntimeError('the OFT pass could not be captured (see the warning above)')
    data['cuda_graphs'] = _is_captured(graphs)
    data['pass_sizes'] = [[s.num_requests, s.num_tokens] for s in graphs.oft_graphs.pass_sizes]
    print(f'padded OFT passes {"captured" if data["cuda_graphs"] else "prepared"} at '
          f'{data["pass_sizes"]} (robots, tokens) in {data["capture_s"]:.1f} s',
          flush=True)  # fmt: skip
    eager = runner_beside(runner, num_robots=max(counts), seq_len=seq_len)
    data['check'] = check_graphs(ctx, graphs, eager, prompt, counts, state)
    ctx.save_partial(data)
    if not data['check']['passed']:
        raise AssertionError(f'the padded OFT pass differs from the eager one: {data["check"]}')
    for num_robots in counts:
        data['steps'].append(
            measure_step(ctx, graphs, prompt, shape, rates, num_robots, state, padded=True)
        )
        ctx.save_partial(data)
        if num_robots == 1:
            eager_step = measure_step(ctx, eager, prompt, shape, rates, 1, state, padded=False)
            eager_step['over_graphs'] = eager_step['pass_ms'] / data['steps'][-1]['pass_ms']
            data['eager_step'] = eager_step
            ctx.save_partial(data)


def check_graphs(ctx: PartContext, graphs, eager, prompt, counts, state) -> dict[str, Any]:
    """The padded runner's head output against the eager runner's on the same batch of
    each robot count (``bench.lib.oft_pass.oft_relative_error``)."""
    from bench.lib.oft_pass import oft_relative_error

    tolerance = GRAPHS_TOLERANCE[str(ctx.dtype).removeprefix('torch.')]
    rows = []
    for num_robots in counts:
        error = oft_relative_error(
            graphs, eager, prompt, num_robots=num_robots, state=state, seed=num_robots
        )
        rows.append({'robots': num_robots, 'max_relative_error': error})
        print(f'{num_robots} robots: padded against eager, max relative error {error:.2e} '
              f'(tolerance {tolerance:.0e})', flush=True)  # fmt: skip
    worst = max(r['max_relative_error'] for r in rows)
    return {'tolerance': tolerance, 'rows': rows, 'passed': worst <= tolerance}


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
    """The engine core on the OFT folder with the preset and CUDA graphs (the default; on a
    GPU only), late steps delivered (marked late) as the serving part's cores."""
    from vla_sched.engine.config import EngineConfig
    from vla_sched.engine.scheduled_core import ScheduledCore

    config = EngineConfig(
        model_path=model_path, device=device, late_policy='deliver_late', oft_preset=PRESET
    )
    return ScheduledCore.from_config(config)


def _padding_data(padding) -> dict[str, Any]:
    """Each path's ``PaddingStats`` as JSON, with its padding share."""
    return {
        path: {**dataclasses.asdict(stats), 'padding_share': stats.padding_share}
        for path, stats in padding.items()
    }


def measure_step(
    ctx: PartContext, runner, prompt, shape, rates, num_robots: int, state: np.ndarray, *,
    padded: bool,
) -> dict[str, Any]:  # fmt: skip
    """``num_robots`` robots' steps in one call: the median of a few, against its floor,
    with what the runner's paths ran; on the ``padded`` runner every timed call must run
    its passes from the padded path (the graphs on a GPU)."""
    from bench.lib.oft_cost import oft_pass_floor
    from bench.lib.oft_pass import time_oft_pass

    times = time_oft_pass(
        runner, prompt, num_robots=num_robots, state=state,
        warmup=DRY_RUN_WARMUP if ctx.dry_run else WARMUP,
        reps=DRY_RUN_REPS if ctx.dry_run else REPS,
    )  # fmt: skip
    oft_stats = times.padding['oft']
    if padded and oft_stats.num_eager_runs:
        raise AssertionError(
            f'{num_robots} robots: {oft_stats.num_eager_runs} passes of the timed calls ran '
            'eagerly, not on the padded path'
        )
    row: dict[str, Any] = {
        'robots': num_robots,
        'path': 'padded' if padded else 'eager',
        'pass_ms': times.median_ms,
        'times_ms': list(times.times_ms),
        'chunk_shape': list(times.chunk_shape),
        'padding': _padding_data(times.padding),
    }
    if padded:
        plan = runner.oft_graphs.plan([times.seq_len] * num_robots)
        row['pass_robots'] = [p.num_requests for p in plan]
    if rates is not None:
        floor = oft_pass_floor(shape, rates, num_robots)
        row['floor'] = dataclasses.asdict(floor)
        row['over_floor'] = times.median_ms / floor.pass_ms
    print(f'{num_robots} robots in one call, {row["path"]}: {times.median_ms:.2f} ms (median '
          f'of {len(times.times_ms)}); padding {100 * oft_stats.padding_share:.1f}% of the '
          f'passes\' tokens', flush=True)  # fmt: skip
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
    """The capacity at the plan's period by bisection, with what the core's paths ran over
    its windows (warm-ups included); saved after every window."""
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
    runner = core.scheduler.runner
    before = runner.padding_stats()

    def on_point(point) -> None:
        capacity['points'].append(dataclasses.asdict(point))
        now = runner.padding_stats()
        capacity['padding'] = _padding_data({p: now[p].since(before[p]) for p in now})
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
