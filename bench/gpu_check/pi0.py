"""Part ``pi0``: pi0.5 at real sizes (PaliGemma's Gemma 2B, the Gemma 300M action expert,
SigLIP So400m at 224 pixels) with random weights, two cameras, chunks of 50 actions from 10
denoising passes, served by the engine core with CUDA graphs (``engine.cuda_graphs``: the
prefix passes, the denoising passes and the tower replayed, ``model/families/pi0/graphs.py``).

The folder is written on the machine (``pi0_folder_once``: LeRobot's format, bf16 mixed
weights as LeRobot stores them, about 7.7 GB, kept in the work dir), with the tiny
PaliGemma-like tokenizer: its words are not Gemma's, but it spells digits as single pieces as
Gemma does, so pi0.5's prompt (the task and the 32 discretized state values) has about the
real prompt's length, which is what the step's cost depends on. Checked first: the chunks of
the graphs core against those of an eager core on the same weights (a second runner on the
first one's model, its own KV pool), the same steps (frames, states, noise), for 1 and 16
robots, within ``GRAPHS_TOLERANCE`` (bf16 rounding of passes of other shapes). Measured:

- one robot's step on the engine core, submit to result (the frames' preprocessing, the
  prompt, the prefix pass, 10 denoising passes, the chunk on the host), the median of a few
  steps with fresh frames, against its floor (``bench.lib.pi0_cost``: each pass the longer
  of its FLOPs at the matmul rate and its weights over the copy bandwidth) and against
  SGLang's 43 ms p50 for pi0.5 on an H200; the same step on the eager core beside it;
- 16 robots' steps submitted together, against their floor;
- the capacity at 10 Hz of chunks (deadline 100 ms) by the one capacity rule and the
  bisection (``bench.engine_paced``), in short windows, up to the FLOP ceiling (at most 16),
  with what the core's paths ran (padding and eager passes).

The dry run writes a tiny pi0.5 folder (the same step shape, fp32 on the CPU, nothing
captured: the graphs core runs the padded passes eagerly), checks and times 1 and 2 robots and
bisects up to 2 at 2 Hz. Each measure is saved as it ends (``PartContext.save_partial``).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.gpu_check.parts import PartContext
from bench.lib.capacity import CapacityCriteria
from bench.lib.tables import cell, markdown_table

SGLANG_PI05_H200_P50_MS = 43.0  # SGLang's pi0.5 on an H200, end to end, p50 (public)
POLICY_TYPE = 'pi05'
NUM_CAMERAS, STATE_DIM, ACTION_DIM = 2, 8, 7
CHUNK_SIZE, NUM_STEPS = 50, 10
ROBOT_COUNTS, DRY_RUN_ROBOT_COUNTS = (1, 16), (1, 2)
MAX_ROBOTS, DRY_RUN_MAX_ROBOTS = 16, 2
REPS, WARMUP = 5, 2
DRY_RUN_REPS, DRY_RUN_WARMUP = 2, 1
KV_POOL_TOKENS = 32768  # 16 robots' prefixes (about 670 tokens each) twice over
PERIOD_S, DEADLINE_MS, WARMUP_S, DURATION_S = 0.1, 100.0, 0.5, 1.5
DRY_RUN_PERIOD_S, DRY_RUN_DEADLINE_MS = 0.5, 2000.0
DRY_RUN_WARMUP_S, DRY_RUN_DURATION_S = 0.25, 1.0
# The graphs core's chunks against the eager core's, max |a - b| / max |b|: the same kernels
# at other shapes (padded), so only rounding differs; in bf16 it adds up over 18 layers and
# 10 passes, in fp32 it stays near the dtype's precision.
GRAPHS_TOLERANCE = {'bfloat16': 5e-2, 'float32': 1e-4}
COMPLETE_FILE = '.written'
INSTRUCTION = 'pick up the red block'  # the paced robots' (bench.lib.fleets), zero states


def pi0_folder_once(workdir: Path, *, dry_run: bool, device: str) -> tuple[Path, bool]:
    """The pi0.5 folder in ``workdir`` (real sizes, or tiny for the dry run) with its tiny
    tokenizer, written unless a complete one is there; ``(folder, reused)``."""
    from vla_sched.model.families.pi0.checkpoint import PI0_REAL_SIZES, TINY_PI0_SIZES
    from vla_sched.testing.pi0_writer import DEFAULT_CAMERA_KEYS, write_pi0_checkpoint

    folder = workdir / ('pi05-tiny' if dry_run else 'pi05-real')
    if (folder / COMPLETE_FILE).is_file():
        return folder, True
    write_pi0_checkpoint(
        folder, policy_type=POLICY_TYPE, seed=0, camera_keys=DEFAULT_CAMERA_KEYS[:NUM_CAMERAS],
        state_dim=STATE_DIM, action_dim=ACTION_DIM, chunk_size=CHUNK_SIZE,
        n_action_steps=CHUNK_SIZE, num_inference_steps=NUM_STEPS,
        sizes=TINY_PI0_SIZES if dry_run else PI0_REAL_SIZES, weights_dtype='mixed',
        tokenizer=True, device=device,
    )  # fmt: skip
    (folder / COMPLETE_FILE).write_text('')
    return folder, False


def make_pi0_parts(folder: Path, *, device: str, cuda_graphs: bool):
    """The engine core's parts on the folder (its tokenizer beside it), late steps
    delivered (marked late) as the serving part's cores."""
    from vla_sched.engine.assembly import assemble_core
    from vla_sched.engine.config import EngineConfig

    config = EngineConfig(
        model_path=str(folder), device=device, cuda_graphs=cuda_graphs,
        pi0_tokenizer_path=str(folder / 'tokenizer'), late_policy='deliver_late',
        kv_pool_tokens=KV_POOL_TOKENS,
    )  # fmt: skip
    return assemble_core(config)


def core_on(parts, *, new_memory: bool, pass_sizes=None):
    """An engine core on ``parts``' model with a runner of its own: the plain eager runner,
    or the padded passes run eagerly (``pass_sizes``), on ``parts``' KV memory or a new one
    (no second copy of the weights)."""
    from vla_sched.core.memory.kv_memory import KVMemory
    from vla_sched.engine.scheduled_core import ScheduledCore
    from vla_sched.model.families.pi0.runner import FlowMatchingRunner

    memory = KVMemory(parts.memory.config) if new_memory else parts.memory
    spec = parts.served.spec
    runner = FlowMatchingRunner(
        parts.runner.model, req_to_token=memory.req_to_token_pool.req_to_token,
        num_kv_slots=(memory.allocator.num_pages + 1) * parts.config.page_size,
        num_steps=spec.num_inference_steps, chunk_size=spec.chunk_size,
        pixels_of=parts.served.processor.pixels, pass_sizes=pass_sizes,
    )  # fmt: skip
    return ScheduledCore(dataclasses.replace(parts, memory=memory, runner=runner))


def run(ctx: PartContext) -> dict[str, Any]:
    from bench.lib.pi0_cost import pi0_shape, robots_at_period
    from vla_sched.engine.scheduled_core import ScheduledCore

    ctx.require_cuda()
    started = time.monotonic()
    folder, reused = pi0_folder_once(ctx.workdir, dry_run=ctx.dry_run, device=ctx.device)
    made_s = time.monotonic() - started
    print(f'{folder}: {"reused" if reused else "written"} in {made_s:.1f} s', flush=True)
    started = time.monotonic()
    parts = make_pi0_parts(folder, device=ctx.device, cuda_graphs=not ctx.dry_run)
    load_s = time.monotonic() - started
    if ctx.dry_run:  # nothing is captured on the CPU: the same padded passes, eager
        from vla_sched.model.families.pi0.passes import Pi0PassSizes

        sizes = Pi0PassSizes.for_spec(parts.served.spec)
        core = core_on(parts, new_memory=False, pass_sizes=sizes)
    else:
        core = ScheduledCore(parts)
    runner = core.scheduler.runner
    spec = parts.served.spec
    prompt_len = len(parts.served.processor.prompt_ids(INSTRUCTION, np.zeros(STATE_DIM)))
    shape = pi0_shape(
        runner.model, num_images=NUM_CAMERAS,
        prefix_len=NUM_CAMERAS * spec.num_image_tokens + prompt_len,
        chunk_size=spec.chunk_size, num_steps=spec.num_inference_steps,
    )  # fmt: skip
    rates = ctx.rates()
    plan = pi0_paced_plan(ctx.dry_run)
    data: dict[str, Any] = {
        'policy_type': POLICY_TYPE,
        'sizes': 'tiny (dry run)' if ctx.dry_run else 'real',
        'num_images': NUM_CAMERAS,
        'chunk_size': spec.chunk_size,
        'num_steps': spec.num_inference_steps,
        'dtype': str(runner.model.dtype).removeprefix('torch.'),
        'cuda_graphs': _is_captured(runner),
        'folder_made_s': made_s,
        'folder_reused': reused,
        'load_s': load_s,
        'prefix_len': shape.prefix_len,
        'prompt_len': prompt_len,
        'step_tflop_per_robot': shape.step_flops / 1e12,
        'period_s': plan.period_s,
        'sglang_p50_ms': SGLANG_PI05_H200_P50_MS,
        'steps': [],
    }
    if rates is not None:
        data['robots_bound'] = robots_at_period(shape, rates, plan.period_s)
    print(f'pi0.5 core loaded (weights, KV pool, graphs if any) in {load_s:.1f} s; prefix of '
          f'{shape.prefix_len} positions ({prompt_len} prompt tokens), '
          f'{shape.step_flops / 1e12:.3g} TFLOP a step', flush=True)  # fmt: skip
    ctx.save_partial(data)
    counts = DRY_RUN_ROBOT_COUNTS if ctx.dry_run else ROBOT_COUNTS
    eager = core_on(parts, new_memory=True)
    data['check'] = check_graphs(ctx, core, eager, counts)
    ctx.save_partial(data)
    for num_robots in counts:
        data['steps'].append(measure_steps(ctx, core, shape, rates, num_robots, graphs=True))
        ctx.save_partial(data)
        if num_robots == 1:
            data['eager_step'] = measure_steps(ctx, eager, shape, rates, 1, graphs=False)
            data['eager_step']['over_graphs'] = (
                data['eager_step']['step_ms'] / data['steps'][-1]['step_ms']
            )
            ctx.save_partial(data)
    eager.close()
    data['capacity'] = measure_capacity(ctx, core, plan, data)
    core.close()
    return data


def _is_captured(runner) -> bool:
    graphs = getattr(runner, 'denoise_graphs', None)
    return graphs is not None and graphs.is_captured


def serve_together(core, num_robots: int, *, seq: int, stamp_ns: int):
    """Robots ``0 .. num_robots - 1`` submit their step ``seq`` (fresh frames of
    ``stamp_ns``, zero states) at once; the core runs until every one has its chunk.
    Returns the milliseconds from the first submit to the last chunk and the chunks in
    robot order."""
    from bench.engine_paced import camera_request
    from bench.lib.fleets import robot_index
    from vla_sched.ipc.messages import StepResult

    started = time.perf_counter()
    chunks: dict[int, np.ndarray] = {}
    for robot in range(num_robots):
        request = camera_request(
            robot, seq, stamp_ns=stamp_ns, deadline_ns=stamp_ns + 600 * 10**9,
            num_state=core.info.num_state, num_images=core.info.num_images,
        )  # fmt: skip
        for failure in core.submit(request, time.time_ns()):
            raise AssertionError(f'{failure.robot_id}: {failure.reason.name} {failure.detail}')
    while len(chunks) < num_robots:
        for out in core.step(time.time_ns()):
            if not isinstance(out, StepResult):
                raise AssertionError(f'{out.robot_id}: {out.reason.name} {out.detail}')
            chunks[robot_index(out.robot_id)] = out.actions
        if len(chunks) < num_robots and not core.has_work():
            raise AssertionError(f'the core is idle with {num_robots - len(chunks)} steps open')
    return (time.perf_counter() - started) * 1e3, [chunks[r] for r in range(num_robots)]


def check_graphs(ctx: PartContext, core, eager, counts) -> dict[str, Any]:
    """The graphs core's chunks against the eager core's for the same steps (frames, zero
    states and noise: the noise follows the robot and its step number), for each robot
    count: max |a - b| / max |b|."""
    tolerance = GRAPHS_TOLERANCE[str(ctx.dtype).removeprefix('torch.')]
    rows = []
    for n, num_robots in enumerate(counts):
        stamp = time.time_ns()
        _, got = serve_together(core, num_robots, seq=1_000_000 + n, stamp_ns=stamp)
        _, want = serve_together(eager, num_robots, seq=1_000_000 + n, stamp_ns=stamp)
        got_all, want_all = np.stack(got), np.stack(want)
        error = float(np.abs(got_all - want_all).max() / max(np.abs(want_all).max(), 1e-12))
        rows.append({'robots': num_robots, 'max_relative_error': error})
        print(f'{num_robots} robots: graphs core against the eager core, max relative error '
              f'{error:.2e} (tolerance {tolerance:.0e})', flush=True)  # fmt: skip
    worst = max(r['max_relative_error'] for r in rows)
    return {'tolerance': tolerance, 'rows': rows, 'passed': worst <= tolerance}


def _padding_data(padding) -> dict[str, Any]:
    return {
        path: {**dataclasses.asdict(stats), 'padding_share': stats.padding_share}
        for path, stats in padding.items()
    }


def measure_steps(
    ctx: PartContext, core, shape, rates, num_robots: int, *, graphs: bool
) -> dict[str, Any]:
    """``num_robots`` robots' steps submitted together: the median of a few (fresh frames
    each), against the floor and SGLang's p50, with what the runner's paths ran."""
    from bench.lib.pi0_cost import pi0_step_floor

    runner = core.scheduler.runner
    reps = DRY_RUN_REPS if ctx.dry_run else REPS
    warmup = DRY_RUN_WARMUP if ctx.dry_run else WARMUP
    times = []
    before = None
    for rep in range(warmup + reps):
        if rep == warmup:
            before = runner.padding_stats()
        ms, _ = serve_together(core, num_robots, seq=rep + 1, stamp_ns=time.time_ns())
        times.append(ms)
    now = runner.padding_stats()
    padding = {path: now[path].since(before[path]) for path in now}
    timed = times[warmup:]
    row: dict[str, Any] = {
        'robots': num_robots,
        'path': 'graphs' if graphs else 'eager',
        'step_ms': statistics.median(timed),
        'times_ms': timed,
        'padding': _padding_data(padding),
    }
    if graphs and padding['denoise'].num_eager_runs:
        raise AssertionError(f'{num_robots} robots: denoising passes ran eagerly')
    if rates is not None:
        floor = pi0_step_floor(shape, rates, num_robots)
        row['floor'] = dataclasses.asdict(floor)
        row['over_floor'] = row['step_ms'] / floor.step_ms
    if num_robots == 1:
        row['over_sglang'] = row['step_ms'] / SGLANG_PI05_H200_P50_MS
    print(f'{num_robots} robots submitted together, {row["path"]}: {row["step_ms"]:.2f} ms '
          f'(median of {len(timed)}); denoising padding '
          f'{100 * padding["denoise"].padding_share:.1f}% of the rows', flush=True)  # fmt: skip
    return row


def pi0_paced_plan(dry_run: bool):
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


def measure_capacity(ctx: PartContext, core, plan, data: dict) -> dict[str, Any]:
    """The capacity at the plan's period by bisection up to the FLOP ceiling (at most
    ``MAX_ROBOTS``), with what the core's paths ran over its windows; saved after every
    window."""
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

    search, _ = search_paced_capacity(
        core, plan, CapacityCriteria(), max_robots=top, bisect=True, on_point=on_point
    )
    capacity['capacity'] = search.capacity
    ctx.save_partial(data)
    print(f'capacity: {search.capacity} robots', flush=True)
    return capacity


# ---- the report section ---------------------------------------------------------------------


def _path(d: dict[str, Any], step: dict[str, Any]) -> str:
    if step['path'] == 'eager':
        return 'eager'
    return 'CUDA graphs' if d.get('cuda_graphs') else 'padded, no graphs'


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
        rows.append([
            s['robots'], _path(d, s), s['step_ms'], floor['step_ms'] if floor else '-',
            floor['prefix_ms'] if floor else '-', floor['denoise_ms'] if floor else '-',
            f'{s["over_floor"]:.2f}x' if 'over_floor' in s else '-',
            f'{s["over_sglang"]:.2f}x' if 'over_sglang' in s else '-', share,
        ])  # fmt: skip
    return rows


def section(d: dict[str, Any]) -> list[str]:
    lines = [
        f'## pi0.5 ({d["sizes"]} sizes, random weights; {d["num_images"]} cameras, chunks of '
        f'{d["chunk_size"]} from {d["num_steps"]} denoising passes; {d["dtype"]}, CUDA graphs '
        f'{"on" if d["cuda_graphs"] else "off"})',
        '',
        f'Prefix of {d["prefix_len"]} positions ({d["prompt_len"]} prompt tokens), '
        f'{d["step_tflop_per_robot"]:.3g} TFLOP a step; folder '
        f'{"reused" if d["folder_reused"] else "written"} in {d["folder_made_s"]:.1f} s, core '
        f'loaded (weights, KV pool, graphs) in {d["load_s"]:.1f} s.'
        + (
            f' The matmul rate allows {d["robots_bound"]:.1f} robots at {1 / d["period_s"]:g} Hz.'
            if 'robots_bound' in d
            else ''
        ),
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
        sglang = f'ms / SGLang {cell(d["sglang_p50_ms"])} ms'
        headers = ['robots submitted together', 'path', 'ms (median)', 'floor ms',
                   'prefix floor ms', 'denoising pass floor ms', 'ms / floor', sglang,
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
