"""Part ``smolvla``: SmolVLA at real sizes (``lerobot/smolvla_base``: SmolVLM2-500M's tower and
its first 16 text layers, the action expert 0.75 of their width) with random weights, two
cameras, a six-joint state, chunks of 50 actions from 10 denoising passes, served by the
engine core with CUDA graphs (``engine.cuda_graphs``: the prefix and denoising passes and
the tower replayed, ``model/families/smolvla/graphs.py``).

The folder is written on the machine by ``bench.smolvla_step`` (random bfloat16 matrices, a
VLM folder of SmolVLM2-500M's sizes with the tiny byte-level tokenizer, so the prompt is a
few tokens, as a short task is; about 0.9 GB, kept in the work dir). Checked first: the
chunks of the graphs core against those of an eager core on the same weights (pi0's check,
``pi0.check_graphs``), for 1 and 16 robots. Measured, each saved as it ends:

- one robot's step on the engine core, submit to result, the median of a few steps with
  fresh frames, against its floor (``bench.lib.smolvla_cost``: pi0's floor with SmolVLA's
  parameters); the same step on the eager core beside it; 16 robots' steps submitted
  together against their floor;
- the capacity at 10 Hz of chunks (deadline 100 ms) by the one capacity rule and the
  bisection (``bench.engine_paced``) up to ``MAX_ROBOTS`` (or the FLOP ceiling), with what
  the core's paths ran.

The dry run writes the tiny SmolVLA folder (its own small step shape: chunks of 4 from 3
passes), fp32 on the CPU, nothing captured (the graphs core runs the padded passes eagerly),
checks and times 1 and 2 robots and bisects up to 2 at 2 Hz.
"""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.gpu_check import pi0
from bench.gpu_check.parts import PartContext
from bench.lib.capacity import CapacityCriteria
from bench.lib.tables import markdown_table

LEROBOT_ASYNC_LOCALHOST_MS = 104.0  # LeRobot's async server, one client on localhost (public)
ROBOT_COUNTS, DRY_RUN_ROBOT_COUNTS = (1, 16), (1, 2)
MAX_ROBOTS, DRY_RUN_MAX_ROBOTS = 32, 2
KV_POOL_TOKENS = 16384  # 32 robots' prefixes (about 140 tokens each) and markers, thrice over
COMPLETE_FILE = '.written'
STATE_DIM = 6  # bench.smolvla_step's folders


def smolvla_folder_once(workdir: Path, *, dry_run: bool) -> tuple[Path, bool]:
    """The SmolVLA folder in ``workdir`` (real sizes, or tiny for the dry run) with its VLM
    folder inside, written unless a complete one is there; ``(folder, reused)``."""
    from bench.smolvla_step import write_folder

    root = workdir / ('smolvla-tiny' if dry_run else 'smolvla-real')
    done = root / COMPLETE_FILE
    if done.is_file():
        return Path(done.read_text()), True
    folder = write_folder(root, tiny=dry_run)
    done.write_text(str(folder))
    return folder, False


def make_smolvla_parts(folder: Path, *, device: str, dtype: str, cuda_graphs: bool):
    """The engine core's parts on the folder (its VLM folder inside), late steps delivered
    (marked late) as the serving part's cores."""
    from vla_sched.engine.assembly import assemble_core
    from vla_sched.engine.config import EngineConfig
    from vla_sched.testing.smolvla_writer import VLM_SUBFOLDER

    config = EngineConfig(
        model_path=str(folder), device=device, dtype=dtype, cuda_graphs=cuda_graphs,
        smolvla_vlm_path=str(folder / VLM_SUBFOLDER), late_policy='deliver_late',
        kv_pool_tokens=KV_POOL_TOKENS,
    )  # fmt: skip
    return assemble_core(config)


def core_on(parts, *, new_memory: bool, pass_sizes=None):
    """An engine core on ``parts``' model with a runner of its own: the plain eager runner,
    or the padded passes run eagerly (``pass_sizes``), on ``parts``' KV memory or a new one
    (no second copy of the weights)."""
    from vla_sched.core.memory.kv_memory import KVMemory
    from vla_sched.engine.scheduled_core import ScheduledCore
    from vla_sched.model.families.smolvla.runner import SmolVLARunner

    memory = KVMemory(parts.memory.config) if new_memory else parts.memory
    spec = parts.served.spec
    runner = SmolVLARunner(
        parts.runner.model, req_to_token=memory.req_to_token_pool.req_to_token,
        num_kv_slots=(memory.allocator.num_pages + 1) * parts.config.page_size,
        num_steps=spec.num_inference_steps, chunk_size=spec.chunk_size,
        pixels_of=parts.served.processor.pixels, pass_sizes=pass_sizes,
    )  # fmt: skip
    return ScheduledCore(dataclasses.replace(parts, memory=memory, runner=runner))


def run(ctx: PartContext) -> dict[str, Any]:
    from bench.lib.pi0_cost import robots_at_period
    from bench.lib.smolvla_cost import smolvla_shape
    from vla_sched.engine.scheduled_core import ScheduledCore

    ctx.require_cuda()
    started = time.monotonic()
    folder, reused = smolvla_folder_once(ctx.workdir, dry_run=ctx.dry_run)
    made_s = time.monotonic() - started
    print(f'{folder}: {"reused" if reused else "written"} in {made_s:.1f} s', flush=True)
    started = time.monotonic()
    dtype = str(ctx.dtype).removeprefix('torch.')
    parts = make_smolvla_parts(folder, device=ctx.device, dtype=dtype, cuda_graphs=not ctx.dry_run)
    load_s = time.monotonic() - started
    spec = parts.served.spec
    if ctx.dry_run:  # nothing is captured on the CPU: the same padded passes, eager
        from vla_sched.model.families.smolvla.passes import smolvla_pass_sizes

        core = core_on(parts, new_memory=False, pass_sizes=smolvla_pass_sizes(spec))
    else:
        core = ScheduledCore(parts)
    runner = core.scheduler.runner
    num_images = len(spec.camera_keys)
    prompt_len = len(parts.served.processor.prompt_ids(pi0.INSTRUCTION, np.zeros(STATE_DIM)))
    shape = smolvla_shape(
        runner.model, num_images=num_images,
        prefix_len=num_images * spec.num_image_tokens + prompt_len + 1,
        chunk_size=spec.chunk_size, num_steps=spec.num_inference_steps,
    )  # fmt: skip
    rates = ctx.rates()
    plan = pi0.pi0_paced_plan(ctx.dry_run)
    data: dict[str, Any] = {
        'sizes': 'tiny (dry run)' if ctx.dry_run else 'real',
        'num_images': num_images,
        'chunk_size': spec.chunk_size,
        'num_steps': spec.num_inference_steps,
        'dtype': str(runner.model.dtype).removeprefix('torch.'),
        'cuda_graphs': pi0._is_captured(runner),
        'folder_made_s': made_s,
        'folder_reused': reused,
        'load_s': load_s,
        'prefix_len': shape.prefix_len,
        'prompt_len': prompt_len,
        'step_tflop_per_robot': shape.step_flops / 1e12,
        'period_s': plan.period_s,
        'lerobot_async_ms': LEROBOT_ASYNC_LOCALHOST_MS,
        'steps': [],
    }
    if rates is not None:
        data['robots_bound'] = robots_at_period(shape, rates, plan.period_s)
    print(f'SmolVLA core loaded (weights, KV pool, graphs if any) in {load_s:.1f} s; prefix '
          f'of {shape.prefix_len} positions ({prompt_len} prompt tokens), '
          f'{shape.step_flops / 1e12:.3g} TFLOP a step', flush=True)  # fmt: skip
    ctx.save_partial(data)
    counts = DRY_RUN_ROBOT_COUNTS if ctx.dry_run else ROBOT_COUNTS
    eager = core_on(parts, new_memory=True)
    data['check'] = pi0.check_graphs(ctx, core, eager, counts)
    ctx.save_partial(data)
    for num_robots in counts:
        data['steps'].append(_measure(ctx, core, shape, rates, num_robots, graphs=True))
        ctx.save_partial(data)
        if num_robots == 1:
            data['eager_step'] = _measure(ctx, eager, shape, rates, 1, graphs=False)
            data['eager_step']['over_graphs'] = (
                data['eager_step']['step_ms'] / data['steps'][-1]['step_ms']
            )
            ctx.save_partial(data)
    eager.close()
    data['capacity'] = measure_capacity(ctx, core, plan, data)
    core.close()
    return data


def _measure(ctx, core, shape, rates, num_robots: int, *, graphs: bool) -> dict[str, Any]:
    """pi0's ``measure_steps`` (median of a few steps, the floor, the paths' padding) without
    its comparison with SGLang's pi0.5."""
    row = pi0.measure_steps(ctx, core, shape, rates, num_robots, graphs=graphs)
    row.pop('over_sglang', None)
    return row


def _padding_data(padding) -> dict[str, Any]:
    return {
        path: {**dataclasses.asdict(stats), 'padding_share': stats.padding_share}
        for path, stats in padding.items()
    }


def measure_capacity(ctx: PartContext, core, plan, data: dict) -> dict[str, Any]:
    """The capacity at the plan's period by bisection up to the FLOP ceiling (at most
    ``MAX_ROBOTS``; 1 robot, then the top, then the midpoints), with what the core's paths
    ran over its windows; saved after every window."""
    from bench.engine_paced import search_paced_capacity

    top = DRY_RUN_MAX_ROBOTS if ctx.dry_run else MAX_ROBOTS
    if 'robots_bound' in data:
        top = max(1, min(top, math.ceil(data['robots_bound'])))
    capacity: dict[str, Any] = {
        'period_s': plan.period_s, 'deadline_ms': plan.deadline_ms, 'warmup_s': plan.warmup_s,
        'duration_s': plan.duration_s, 'criteria': CapacityCriteria().describe(),
        'max_robots': top, 'points': [], 'capacity': None,
    }  # fmt: skip
    data['capacity'] = capacity
    runner = core.scheduler.runner
    before = runner.padding_stats()

    def on_point(point) -> None:
        capacity['points'].append(dataclasses.asdict(point))
        now = runner.padding_stats()
        capacity['padding'] = _padding_data({p: now[p].since(before[p]) for p in now})
        print(f'capacity: {point.num_robots} robots, {point.num_results} results, p50 '
              f'{point.latency_ms_p50:.1f} ms', flush=True)  # fmt: skip
        ctx.save_partial(data)

    # The top first: a model this small is expected to pass it, which ends the search.
    search, _ = search_paced_capacity(
        core, plan, CapacityCriteria(), max_robots=top, bisect=True, first_probe=top,
        on_point=on_point,
    )  # fmt: skip
    capacity['capacity'] = search.capacity
    ctx.save_partial(data)
    print(f'capacity: {search.capacity} robots', flush=True)
    return capacity


# ---- the report section ---------------------------------------------------------------------


def _step_rows(d: dict[str, Any]) -> list[list[Any]]:
    steps = list(d['steps'])
    if 'eager_step' in d:
        at = next((i + 1 for i, s in enumerate(steps) if s['robots'] == 1), len(steps))
        steps.insert(at, d['eager_step'])
    rows = []
    for s in steps:
        floor = s.get('floor')
        denoise = s['padding'].get('denoise', {})
        share = f'{100 * denoise["padding_share"]:.1f}%' if denoise.get('num_padded_runs') else '-'
        path = 'eager' if s['path'] == 'eager' else (
            'CUDA graphs' if d.get('cuda_graphs') else 'padded, no graphs'
        )  # fmt: skip
        rows.append([
            s['robots'], path, s['step_ms'], floor['step_ms'] if floor else '-',
            floor['prefix_ms'] if floor else '-', floor['denoise_ms'] if floor else '-',
            f'{s["over_floor"]:.2f}x' if 'over_floor' in s else '-', share,
        ])  # fmt: skip
    return rows


def section(d: dict[str, Any]) -> list[str]:
    lines = [
        f'## SmolVLA ({d["sizes"]} sizes, random weights; {d["num_images"]} cameras, chunks '
        f'of {d["chunk_size"]} from {d["num_steps"]} denoising passes; {d["dtype"]}, CUDA '
        f'graphs {"on" if d["cuda_graphs"] else "off"})',
        '',
        f'Prefix of {d["prefix_len"]} positions ({d["prompt_len"]} prompt tokens), '
        f'{d["step_tflop_per_robot"]:.3g} TFLOP a step; folder '
        f'{"reused" if d["folder_reused"] else "written"} in {d["folder_made_s"]:.1f} s, core '
        f'loaded (weights, KV pool, graphs) in {d["load_s"]:.1f} s.'
        + (
            f' The matmul rate allows {d["robots_bound"]:.0f} robots at {1 / d["period_s"]:g} Hz.'
            if 'robots_bound' in d
            else ''
        )
        + f" LeRobot's async server: {d['lerobot_async_ms']:g} ms a step for one client on "
        'localhost (its own GPU, for reference).',
    ]
    if 'check' in d:
        check = d['check']
        errors = ', '.join(
            f'{r["max_relative_error"]:.2e} ({r["robots"]} robots)' for r in check['rows']
        )
        lines += ['', f'Chunks of the graphs core against the eager core on the same steps: '
                  f'max relative error {errors}; tolerance {check["tolerance"]:.0e}: '
                  f'{"passed" if check["passed"] else "FAILED"}.']  # fmt: skip
    if d['steps']:
        headers = ['robots submitted together', 'path', 'ms (median)', 'floor ms',
                   'prefix floor ms', 'denoising pass floor ms', 'ms / floor',
                   'denoising padding (rows)']  # fmt: skip
        lines += ['', markdown_table(headers, _step_rows(d))]
    if 'capacity' in d:
        c = d['capacity']
        found = c['capacity']
        result = f'**{found}** robots' if found is not None else 'none found yet'
        lines += ['', f'Capacity at {1 / c["period_s"]:g} Hz of chunks (deadline '
                  f'{c["deadline_ms"]:.0f} ms; {c["criteria"]}; bisection up to '
                  f'{c["max_robots"]}; {c["warmup_s"]:g} s warm-up and {c["duration_s"]:g} s '
                  f'window per count): {result}.']  # fmt: skip
        if 'padding' in c:
            denoise, prefix = c['padding']['denoise'], c['padding']['prefix']
            lines[-1] += (
                f' Over the search the core ran {denoise["num_padded_runs"]} padded denoising '
                f'passes (padding {100 * denoise["padding_share"]:.1f}% of their rows), '
                f'{denoise["num_eager_runs"]} eager ones, and {prefix["num_padded_runs"]} '
                f'padded prefix passes (padding {100 * prefix["padding_share"]:.1f}% of their '
                'tokens).'
            )
    return lines
