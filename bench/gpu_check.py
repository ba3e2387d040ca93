"""The prepared GPU run: correctness first, then measurements, in one bounded command.

    bash bench/gpu_check.sh OUT                       # on the GPU machine, under 8 minutes
    python bench/gpu_check.py --out OUT [--budget-s 450] [--workdir DIR] [--parts NAME ...]
    python bench/gpu_check.py --out OUT --dry-run     # the same parts, tiny, on the CPU

Each part runs in its own subprocess under its own time limit, so a hang or a CUDA error in
one cannot take the others down; the run goes on with the next part whatever happened, and
records each part as ``ok``, ``failed`` (with the tail of its output), ``timed out`` or
``skipped`` (with why). ``OUT/report.md`` and ``OUT/results.json`` (every number) are
rewritten after every part, so a run killed midway still leaves what finished;
``OUT/gpu_check.log`` holds every part's own output. The parts import no rclpy, ZMQ,
cv_bridge, cv2 or PIL: they run with those hidden, as on a bare machine with only Python,
torch, triton, transformers and numpy.

Parts, in order (limits at ``--budget-s 450``, scaled with it; the H200 estimates are guesses
from the CPU dry run and the sizes involved, to be corrected by the first GPU run):

============ ======= ============ ============================================================
part         limit s H200 est. s  what
============ ======= ============ ============================================================
environment  25      15           versions, GPU, copy bandwidth and bf16 matmul rate
                                  (``bench/gpu_serving.py``'s floor code)
kernels      75      50           every kernel against its float32 reference: ragged bf16,
                                  fp16, fp32, a CUDA-graph replay of decode, every benchmark
                                  shape in bf16 and again in fp16; decode / extend / store
                                  times and GB/s against the copy bandwidth
                                  (``bench/gpu_kernels.py``, 9 decode shapes, 15 launches)
checkpoint   55      35           the openvla-7b folder with random bf16 weights (15 GB) in
                                  the work dir, written once, read by the later parts
model        100     65           openvla-7b (``bench/gpu_model.py``'s models): our runner
                                  eager and with CUDA-graph decode against transformers
                                  (greedy agreement, last-token logits), graphs against
                                  eager, one robot's runner step against the floor
engine_core  45      25           ``ScheduledCore`` on the folder, 4 robots x 3 steps:
                                  ``check_integrity()`` after every scheduler step, every
                                  step ends as exactly one result or failure
serving      95      50           the engine core paced at 10 Hz per robot for 1, 4, 8, 12, 16
                                  and 32 robots (``bench/engine_paced.py``): latency p50/p99,
                                  deadline hits, actions/s, the robot count the matmul rate
                                  allows and the share of it served; one robot's step
                                  against the floor; then 1, 4, 8 and 12 robots again with
                                  mixed passes (off on a GPU by default)
scheduler    55      35           scheduler host time per decode step, null and 7B runner,
                                  overlap on and off (``bench/scheduler_cost.py``)
============ ======= ============ ============================================================

The dry run uses a tiny OpenVLA-format folder, the Triton interpreter and short windows;
it checks the script, not speed (about a minute on two CPU cores).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import datetime
import importlib.metadata
import importlib.util
import json
import math
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_BUDGET_S = 450.0
HIDDEN_MODULES = ('rclpy', 'zmq', 'cv_bridge', 'cv2', 'PIL')
TAIL_LINES = 30
PERIOD_S = 0.1
DEADLINE_MS = 100.0


@dataclass(frozen=True, slots=True)
class Part:
    """One part: its limit at the default budget and whether it reads the checkpoint."""

    name: str
    limit_s: float
    needs_checkpoint: bool = False


PARTS = (
    Part('environment', 25),
    Part('kernels', 75),
    Part('checkpoint', 55),
    Part('model', 100),
    Part('engine_core', 45, needs_checkpoint=True),
    Part('serving', 95, needs_checkpoint=True),
    Part('scheduler', 55, needs_checkpoint=True),
)
PART_NAMES = tuple(p.name for p in PARTS)


# --- the parts (each runs in its own subprocess) --------------------------------------------


@dataclass(frozen=True, slots=True)
class PartContext:
    """What a part knows: the mode, the work dir and the results of the parts before it."""

    dry_run: bool
    workdir: Path
    prior: dict[str, Any]

    @property
    def device(self) -> str:
        return 'cpu' if self.dry_run else 'cuda'

    def data(self, part: str) -> dict[str, Any]:
        entry = self.prior.get(part, {})
        return entry.get('data', {}) if entry.get('status') == 'ok' else {}

    def folder(self) -> Path:
        folder = self.data('checkpoint').get('folder')
        if not folder:
            raise RuntimeError('no checkpoint folder: the checkpoint part did not end ok')
        return Path(folder)


def _dtype(ctx: PartContext):
    import torch

    return torch.float32 if ctx.dry_run else torch.bfloat16


def _require_cuda(ctx: PartContext) -> None:
    import torch

    if not ctx.dry_run and not torch.cuda.is_available():
        raise RuntimeError('no CUDA device (use --dry-run on a CPU)')


def part_environment(ctx: PartContext) -> dict[str, Any]:
    import numpy
    import torch

    from bench.gpu_serving import measure_rates

    versions = {'python': platform.python_version(), 'torch': torch.__version__}
    versions['cuda'] = torch.version.cuda or ''
    versions['numpy'] = numpy.__version__
    for name in ('triton', 'transformers', 'msgpack', 'timm', 'safetensors', 'tokenizers'):
        versions[name] = _dist_version(name)
    _require_cuda(ctx)
    gpu: dict[str, Any] = {'name': 'CPU (dry run)'}
    if not ctx.dry_run:
        props = torch.cuda.get_device_properties(0)
        gpu = {
            'name': props.name,
            'memory_gib': props.total_memory / 2**30,
            'num_sms': props.multi_processor_count,
            'capability': f'{props.major}.{props.minor}',
            'driver_visible_devices': torch.cuda.device_count(),
        }
    dtype = _dtype(ctx)
    copy_bps, flops_per_s = measure_rates(torch.device(ctx.device), dtype)
    print(f'copy {copy_bps / 1e9:.0f} GB/s, {dtype} matmul {flops_per_s / 1e12:.1f} TFLOP/s')
    return {
        'versions': versions,
        'gpu': gpu,
        'copy_gb_per_s': copy_bps / 1e9,
        'matmul_tflops': flops_per_s / 1e12,
        'matmul_dtype': str(dtype).removeprefix('torch.'),
    }


def _dist_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return 'absent'


def part_kernels(ctx: PartContext) -> dict[str, Any]:
    import itertools

    import torch

    from bench import gpu_kernels as gk

    _require_cuda(ctx)
    torch.backends.cuda.matmul.allow_tf32 = False  # the fp32 references must be exact fp32
    if ctx.dry_run:
        plan = gk.BenchPlan(
            torch.device('cpu'), torch.float32, 4, 2, 64, 4, (1,), (9,), 6, (2,), (5,), 1, 1
        )
        extra_dtype = torch.float32  # the interpreter runs fp32 only
    else:
        plan = gk.BenchPlan(
            torch.device('cuda'),
            torch.bfloat16,
            32,
            8,
            128,
            16,
            batch_sizes=(1, 32, 128),
            context_lens=(256, 2048, 8192),
            extend_batch_sizes=(1, 8),
            store_token_counts=(1, 128, 8192),
            num_input_sets=2,
            num_reps=15,
        )
        extra_dtype = torch.float16
    on_gpu = plan.device.type == 'cuda'
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count if on_gpu else 1
    timer = gk.Timer(plan.device, plan.num_reps)
    copy_gbs = gk.copy_bandwidth_gbs(timer, 1 << 30 if on_gpu else 1 << 20)
    checks = gk.correctness_checks(plan, num_sms)
    print('checked:', '; '.join(checks), flush=True)
    other = dataclasses.replace(plan, dtype=extra_dtype)
    for batch_size, context_len in itertools.product(plan.batch_sizes, plan.context_lens):
        inputs = gk.decode_set(other, [context_len] * batch_size, 11, num_sms)
        gk._run_decode(inputs)
        gk.check_close(
            f'decode b={batch_size} ctx={context_len} {extra_dtype}',
            inputs['out'],
            gk._decode_ref(inputs),
        )
    for batch_size, prefix_len in itertools.product(plan.extend_batch_sizes, plan.context_lens):
        ext = plan.extend_len
        inputs = gk.extend_set(other, [prefix_len] * batch_size, [ext] * batch_size, 12)
        gk.check_close(
            f'extend b={batch_size} prefix={prefix_len} {extra_dtype}',
            gk._run_extend(inputs, ext),
            gk._extend_ref(inputs),
        )
    checks.append(f'every benchmark shape in {plan.dtype} (timed) and {extra_dtype}')
    print('checked every benchmark shape in', extra_dtype, flush=True)
    rows = gk.bench_decode(plan, timer, num_sms)
    print(f'decode timed ({len(rows)} shapes)', flush=True)
    rows += gk.bench_extend(plan, timer) + gk.bench_store(plan, timer)
    for row in rows:
        row['copy_share'] = row['gbs'] / copy_gbs
        row['context'] = str(row['context'])
    target = [
        r['copy_share']
        for r in rows
        if r['kernel'] == 'decode' and r['batch'] >= 32 and int(r['context']) >= 2048
    ]
    return {
        'shape': {
            'num_q_heads': plan.num_q_heads,
            'num_kv_heads': plan.num_kv_heads,
            'head_dim': plan.head_dim,
            'page_size': plan.page_size,
            'dtype': str(plan.dtype).removeprefix('torch.'),
            'num_reps': plan.num_reps,
        },
        'checks': checks,
        'copy_gb_per_s': copy_gbs,
        'rows': rows,
        'decode_worst_copy_share': min(target) if target else None,
    }


def part_checkpoint(ctx: PartContext) -> dict[str, Any]:
    import torch

    from bench.openvla_checkpoint import write_openvla_checkpoint

    _require_cuda(ctx)
    folder = ctx.workdir / ('openvla-tiny-random' if ctx.dry_run else 'openvla-7b-random')
    done = folder / '.complete'
    reused = done.exists()
    if not reused:
        write_openvla_checkpoint(
            folder, device=torch.device(ctx.device), dtype=_dtype(ctx), shrink=ctx.dry_run
        )
        done.write_text('written\n')
    size = sum(f.stat().st_size for f in folder.iterdir() if f.is_file())
    print(f'{folder}: {size / 1e9:.2f} GB{" (reused)" if reused else ""}', flush=True)
    return {'folder': str(folder), 'size_gb': size / 1e9, 'reused': reused}


def _floor(ctx: PartContext, folder: Path):
    """The floor of one robot's step at the environment part's rates (None without them)."""
    from bench.gpu_serving import step_floor

    env = ctx.data('environment')
    if not env:
        return None
    return step_floor(
        folder,
        _dtype(ctx),
        copy_bps=env['copy_gb_per_s'] * 1e9,
        flops_per_s=env['matmul_tflops'] * 1e12,
    )


def part_model(ctx: PartContext) -> dict[str, Any]:
    import statistics

    import numpy as np
    import torch

    from bench import gpu_model as gm
    from vla_sched.model.runner.model_runner import ModelRunner, RunnerConfig

    _require_cuda(ctx)
    plan = gm.make_plan(ctx.dry_run)
    plan = dataclasses.replace(
        plan, reps=1 if ctx.dry_run else 5, batch_sizes=(1,) if ctx.dry_run else (1, 16)
    )
    started = time.monotonic()
    hf, ours = gm.build_models(plan)
    spec = ours.spec
    print(f'models built in {time.monotonic() - started:.1f} s', flush=True)
    context = spec.num_image_tokens + plan.num_text_tokens + plan.num_action_tokens + 8
    max_batch = max(plan.batch_sizes)
    table = torch.arange(max_batch * context, dtype=torch.int32).reshape(max_batch, context)
    graphs = RunnerConfig(cuda_graphs=True, decode_batch_sizes=plan.batch_sizes)
    configs = {
        'eager': RunnerConfig(),
        # On the CPU, the padded persistent-buffer path that the graphs replay.
        'graphs': RunnerConfig(padded_decode=True) if ctx.dry_run else graphs,
    }
    runners = {
        name: ModelRunner(ours, req_to_token=table, num_kv_slots=table.numel(), config=config)
        for name, config in configs.items()
    }
    out: dict[str, Any] = {
        'preset': plan.preset,
        'dtype': str(plan.dtype).removeprefix('torch.'),
        'prompt_tokens': 1 + spec.num_image_tokens + plan.num_text_tokens,
        'num_action_tokens': plan.num_action_tokens,
        'decoder_params_m': spec.decoder.num_params() / 1e6,
        'graphs_runner': 'padded decode, no graphs (CPU)' if ctx.dry_run else 'CUDA graphs',
        'batches': [],
    }
    with torch.inference_mode():
        out['logits'] = _logits_check(gm, hf, ours, runners['eager'], plan)
        print(f'last-token logits: {out["logits"]}', flush=True)
        for batch_size in plan.batch_sizes:
            row: dict[str, Any] = {'robots': batch_size}
            tokens = {}
            for name, runner in runners.items():
                results = gm.repeat(
                    plan.reps,
                    lambda rep, r=runner, b=batch_size: gm.run_ours(r, spec, plan, b, rep),
                )
                row[name] = {
                    'prefill_ms': 1e3 * statistics.median(r[0] for r in results),
                    'decode_step_ms': 1e3 * statistics.median(s for r in results for s in r[1]),
                    'step_ms': 1e3 * statistics.median(r[0] + sum(r[1]) for r in results),
                }
                tokens[name] = np.array([r[2] for r in results])
            one = gm.repeat(
                plan.reps, lambda rep, b=batch_size: gm.run_hf(hf, ours, plan, b, rep, 1)
            )
            full = gm.repeat(
                plan.reps,
                lambda rep, b=batch_size: gm.run_hf(
                    hf, ours, plan, b, rep, plan.num_action_tokens
                ),
            )
            hf_tokens = np.array([r[1] for r in full])
            prefill = statistics.median(r[0] for r in one)
            total = statistics.median(r[0] for r in full)
            row['transformers'] = {
                'prefill_ms': 1e3 * prefill,
                'decode_step_ms': 1e3 * (total - prefill) / (plan.num_action_tokens - 1),
                'step_ms': 1e3 * total,
            }
            row['graphs_equal_eager_share'] = float(np.mean(tokens['graphs'] == tokens['eager']))
            row['eager_equal_transformers_share'] = float(np.mean(tokens['eager'] == hf_tokens))
            row['graphs_equal_transformers_share'] = float(np.mean(tokens['graphs'] == hf_tokens))
            print(json.dumps(row), flush=True)
            out['batches'].append(row)
    bandwidth = ctx.data('environment').get('copy_gb_per_s')
    if bandwidth:
        out['decode_floor_ms'] = gm.decoder_weight_bytes(ours) / (bandwidth * 1e9) * 1e3
    folder = ctx.data('checkpoint').get('folder')
    floor = _floor(ctx, Path(folder)) if folder else None
    if floor is not None:
        out['floor'] = dataclasses.asdict(floor)
        out['runner_step_over_floor'] = out['batches'][0]['graphs']['step_ms'] / floor.step_ms
    return out


def _logits_check(gm, hf, ours, runner, plan) -> dict[str, float]:
    """Our prefill's last-token logits against transformers' on the same inputs."""
    import torch

    from bench.bench_model_cpu import step_batch
    from vla_sched.core.forward_batch import ForwardMode, ImageInput, SamplingParams
    from vla_sched.model.layers.vision import preprocess_image

    spec = ours.spec
    prompt = gm.prompt_ids(spec, plan.num_text_tokens, 0)
    (frame,) = gm.frames(spec, 1, 0)
    images = ((ImageInput(77, 1, spec.num_image_tokens, frame),),)
    batch = step_batch(
        mode=ForwardMode.EXTEND,
        prompts=[prompt],
        prefix_lens=[0],
        req_to_token=runner.req_to_token,
        images=images,
        sampling=SamplingParams(0, spec.decoder.vocab_size),
    )
    ours_logits = runner.forward_logits(batch)[-1].float()
    ids = torch.tensor([prompt], device=plan.device)
    pixels = preprocess_image(frame, spec.preprocessing, device=plan.device)[None].to(plan.dtype)
    embeds = hf.get_input_embeddings()(ids)
    embeds[:, 1 : 1 + spec.num_image_tokens] = ours.encode_images(pixels)
    hf_logits = hf(inputs_embeds=embeds, attention_mask=torch.ones_like(ids)).logits
    hf_logits = hf_logits[0, -1].float()
    error = (ours_logits - hf_logits).abs().max() / hf_logits.abs().max().clamp_min(1e-30)
    top5 = set(ours_logits.topk(5).indices.tolist()) & set(hf_logits.topk(5).indices.tolist())
    return {
        'max_relative_error': float(error),
        'top1_equal': bool(ours_logits.argmax() == hf_logits.argmax()),
        'top5_overlap': len(top5),
    }


def part_engine_core(ctx: PartContext) -> dict[str, Any]:
    from bench.engine_paced import make_core, run_checked

    _require_cuda(ctx)
    started = time.perf_counter()
    core = make_core(str(ctx.folder()), device=ctx.device, cuda_graphs=not ctx.dry_run)
    load_s = time.perf_counter() - started
    print(f'engine core loaded (weights, KV pool, graphs captured) in {load_s:.1f} s', flush=True)
    run = run_checked(core, num_robots=4, steps_per_robot=2 if ctx.dry_run else 3)
    if run.num_results == 0:
        raise AssertionError(f'no step produced a result: {run.failure_reasons}')
    print(run, flush=True)
    vision = _vision_times(core.scheduler.runner, ctx)
    print(f'vision encoder: {vision}', flush=True)
    return {
        **dataclasses.asdict(run), 'cuda_graphs': not ctx.dry_run, 'load_s': load_s,
        'vision': vision,
    }  # fmt: skip


def _vision_times(runner, ctx: PartContext) -> list[dict[str, Any]]:
    """Host wall ms of the vision encoder per image count: eager and through the runner's
    padded (on a GPU, captured) path, median of 10 after 2 warm-ups."""
    import torch

    from vla_sched.model.runner.vision_graphs import VisionGraphs

    model = runner.model
    graphs = runner.vision_graphs
    if graphs is None and ctx.dry_run and model.vision is not None:  # the padded path, eager
        prep = model.spec.preprocessing
        graphs = VisionGraphs(
            model.vision, pixel_shape=(len(prep.mean), prep.image_size, prep.image_size),
            batch_sizes=(1, 2), device=runner.device, output_dtype=model.dtype, capture=False,
        )  # fmt: skip
    if graphs is None:
        return []
    out = []
    for count in (1, 2) if ctx.dry_run else (1, 4, 16):
        if graphs.padded_size(count) is None:
            continue
        pixels = torch.randn((count, *graphs.pixels.shape[1:]), device=runner.device)
        row: dict[str, Any] = {'images': count}
        for name, encode in (('eager', model.encode_images), ('graphs', graphs.encode)):
            times = []
            for i in range(12):
                _sync_device(runner.device)
                started = time.perf_counter()
                encode(pixels)
                _sync_device(runner.device)
                if i >= 2:
                    times.append((time.perf_counter() - started) * 1e3)
            row[f'{name}_ms'] = sorted(times)[len(times) // 2]
        out.append(row)
    return out


def _sync_device(device) -> None:
    import torch

    if device.type == 'cuda':
        torch.cuda.synchronize(device)


def part_serving(ctx: PartContext) -> dict[str, Any]:
    from bench.engine_paced import PacedPlan, make_core, markdown_table, run_checked, run_paced
    from vla_sched.model.config.formats import read_checkpoint_spec

    _require_cuda(ctx)
    folder = ctx.folder()
    # Graphs only where the engine-core check passed with them: else the numbers are eager.
    graphs = not ctx.dry_run and bool(ctx.data('engine_core'))
    if ctx.dry_run:
        plan = PacedPlan((1, 2), PERIOD_S, DEADLINE_MS, warmup_s=0.3, duration_s=1.0)
    else:
        plan = PacedPlan(
            (1, 4, 8, 12, 16, 32),
            PERIOD_S,
            DEADLINE_MS,
            warmup_s=1.0,
            duration_s=3.0,
            drain_timeout_s=10.0,
        )
    core = make_core(str(folder), device=ctx.device, cuda_graphs=graphs)
    warm = run_checked(core, num_robots=max(plan.robot_counts), steps_per_robot=1)
    print(f'warm-up: {warm.num_results} steps in {warm.seconds:.1f} s', flush=True)
    points = []
    for count in plan.robot_counts:
        (point,) = run_paced(core, dataclasses.replace(plan, robot_counts=(count,)))
        print(markdown_table([point]).splitlines()[-1], flush=True)
        points.append(point)
    # Mixed passes (each prefill pass also decodes the running steps) are on by default on
    # the CPU only; the same core, switched to them, measures what they do on this device.
    sched = core.scheduler
    sched.config = dataclasses.replace(sched.config, enable_mixed_chunk=True)
    mixed_points = []
    for count in plan.robot_counts[:4]:
        (point,) = run_paced(core, dataclasses.replace(plan, robot_counts=(count,)))
        print('mixed passes: ' + markdown_table([point]).splitlines()[-1], flush=True)
        mixed_points.append(point)
    out: dict[str, Any] = {
        'cuda_graphs': graphs,
        'period_s': plan.period_s,
        'deadline_ms': plan.deadline_ms,
        'warmup_s': plan.warmup_s,
        'duration_s': plan.duration_s,
        'points': [dataclasses.asdict(p) for p in points],
        'mixed_points': [dataclasses.asdict(p) for p in mixed_points],
    }
    served = [p.num_robots for p in points if _served(p)]
    out['max_robots_served'] = max(served, default=0)
    floor = _floor(ctx, folder)
    if floor is not None:
        spec = read_checkpoint_spec(folder)
        element = 4 if ctx.dry_run else 2
        decoder_params = floor.decoder_weight_gb * 1e9 / element
        step_flops = floor.prefill_tflop * 1e12 + 2 * decoder_params * spec.num_action_tokens
        flops_per_s = ctx.data('environment')['matmul_tflops'] * 1e12
        bound = flops_per_s * plan.period_s / step_flops
        out['floor'] = dataclasses.asdict(floor)
        out['step_tflop'] = step_flops / 1e12
        out['robots_bound'] = bound
        out['bound_share_served'] = out['max_robots_served'] / bound
        one = [p for p in points if p.num_robots == 1]
        if one:
            out['one_robot_step_over_floor'] = one[0].latency_ms_p50 / floor.step_ms
    return out


def _served(point) -> bool:
    """A robot count is served when its p99 step latency is under the deadline and it
    delivers at least 95% of its target actions per second."""
    return (
        point.latency_ms_p99 < DEADLINE_MS
        and point.actions_per_s >= 0.95 * point.target_actions_per_s
    )


def part_scheduler(ctx: PartContext) -> dict[str, Any]:
    from bench import scheduler_cost as sc

    _require_cuda(ctx)
    folder = str(ctx.folder())
    if ctx.dry_run:
        null, model, steps = ['1', '4'], ['1', '2'], '3'
    else:
        null, model, steps = ['1', '64'], ['1', '16', '64'], '20'
    common = ['--steps', steps, '--model-path', folder]
    points = sc.run(sc.parse_args([*common, '--runners', 'null', '--batch-sizes', *null]))
    argv = [*common, '--runners', 'model', '--device', ctx.device, '--batch-sizes', *model]
    points += sc.run(sc.parse_args(argv))
    rows = [
        {**dataclasses.asdict(p), 'sched_us': p.sched_us, 'sched_share': p.sched_share}
        for p in points
    ]
    return {'points': rows}


PART_FUNCTIONS: dict[str, Callable[[PartContext], dict[str, Any]]] = {
    'environment': part_environment,
    'kernels': part_kernels,
    'checkpoint': part_checkpoint,
    'model': part_model,
    'engine_core': part_engine_core,
    'serving': part_serving,
    'scheduler': part_scheduler,
}


class _HideModules:
    """A meta-path finder wrapper under which the named top-level modules do not exist."""

    def __init__(self, inner, names: tuple[str, ...]) -> None:
        self.inner, self.names = inner, names

    def find_spec(self, name, path=None, target=None):
        if name.partition('.')[0] in self.names:
            return None
        find = getattr(self.inner, 'find_spec', None)
        return find(name, path, target) if find is not None else None

    def __getattr__(self, name: str):  # find_distributions, invalidate_caches, ...
        return getattr(self.inner, name)


def hide_modules(names: tuple[str, ...]) -> None:
    """Make ``import name`` fail (and ``find_spec`` return None) for each of ``names``."""
    loaded = [n for n in names if n in sys.modules]
    if loaded:
        raise RuntimeError(f'already imported: {loaded}')
    sys.meta_path[:] = [_HideModules(finder, names) for finder in sys.meta_path]


def run_part(
    name: str, *, dry_run: bool, workdir: Path, prior_file: Path, result_file: Path, hang: bool
) -> int:
    """The child side: run one part, write its data as JSON to ``result_file``."""
    hide_modules(HIDDEN_MODULES)
    sys.path.insert(0, str(ROOT))
    if hang:
        print(f'{name}: hanging on purpose (--inject-hang)', flush=True)
        while True:
            time.sleep(3600)
    prior = json.loads(prior_file.read_text()) if prior_file.exists() else {}
    ctx = PartContext(dry_run=dry_run, workdir=workdir, prior=prior)
    data = PART_FUNCTIONS[name](ctx)
    result_file.write_text(json.dumps(data, indent=1, default=_jsonable) + '\n')
    return 0


def _jsonable(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, tuple | set):
        return list(value)
    return repr(value)


# --- the parent: limits, subprocesses, the report --------------------------------------------


def _stamp() -> str:
    return datetime.datetime.now().strftime('%H:%M:%S')


class Progress:
    """Progress lines with the wall-clock time and seconds since the start."""

    def __init__(self) -> None:
        self.started = time.monotonic()

    def elapsed_s(self) -> float:
        return time.monotonic() - self.started

    def say(self, text: str) -> None:
        print(f'[{_stamp()} +{self.elapsed_s():6.1f}s] {text}', flush=True)


def part_limits(budget_s: float, overrides: dict[str, float]) -> dict[str, float]:
    """Each part's limit: its share of the default budget scaled to ``budget_s``."""
    scale = budget_s / DEFAULT_BUDGET_S
    return {p.name: overrides.get(p.name, p.limit_s * scale) for p in PARTS}


def run_child(
    name: str, argv: list[str], limit_s: float, log, progress: Progress
) -> tuple[str, float, list[str]]:
    """Run one part's subprocess under ``limit_s``; (status, seconds, tail of its output)."""
    env = dict(os.environ, PYTHONUNBUFFERED='1', HF_HUB_OFFLINE='1', TRANSFORMERS_OFFLINE='1')
    if '--dry-run' in argv:
        env['TRITON_INTERPRET'] = '1'
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), *argv],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors='replace',
        start_new_session=True,  # its own process group: a timeout kills all it started
    )
    tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)

    def pump() -> None:
        for line in proc.stdout:
            tail.append(line.rstrip('\n'))
            log.write(f'[{name}] {line}')
            log.flush()
            print(f'    {name} | {line}', end='', flush=True)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    status = 'timed out'
    try:
        rc = proc.wait(timeout=limit_s)
        status = 'ok' if rc == 0 else 'failed'
    except subprocess.TimeoutExpired:
        pass
    finally:  # on a timeout, and when this process is stopped (SIGTERM) while waiting
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    reader.join(timeout=5)
    seconds = time.monotonic() - started
    if status == 'failed':
        tail.append(f'exit status {proc.returncode}')
    return status, seconds, list(tail)


def run_all(args: argparse.Namespace) -> dict[str, Any]:
    """The parent side: every selected part in order; writes the report after each."""
    progress = Progress()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    keep_workdir = bool(args.workdir)
    workdir = Path(args.workdir) if keep_workdir else Path(tempfile.mkdtemp(prefix='vla_gpu_'))
    workdir.mkdir(parents=True, exist_ok=True)
    limits = part_limits(args.budget_s, dict(args.limit or []))
    results: dict[str, Any] = {
        'started': datetime.datetime.now().isoformat(timespec='seconds'),
        'dry_run': args.dry_run,
        'budget_s': args.budget_s,
        'host': platform.node(),
        'hidden_modules': list(HIDDEN_MODULES),
        'modules_present_here': {
            m: importlib.util.find_spec(m) is not None for m in HIDDEN_MODULES
        },
        'parts': {},
    }
    selected = [p for p in PARTS if p.name in (args.parts or PART_NAMES)]
    for part in PARTS:
        if part not in selected:
            results['parts'][part.name] = _entry('skipped', why='not selected (--parts)')
    progress.say(
        f'gpu_check: {len(selected)} parts, budget {args.budget_s:.0f} s, '
        f'work dir {workdir}, out {out}'
    )
    write_outputs(out, results)
    signal.signal(signal.SIGTERM, _stop)
    try:
        with open(out / 'gpu_check.log', 'a') as log:
            for part in selected:
                run_one(part, args, results, limits, workdir, log, progress)
                write_outputs(out, results)
    finally:
        for part in PARTS:
            entry = results['parts'].get(part.name)
            if entry is None:
                results['parts'][part.name] = _entry('skipped', why='the run was stopped first')
            elif entry['status'] == 'running':
                entry.update(status='timed out', why='stopped with the whole run')
        results['seconds'] = progress.elapsed_s()
        write_outputs(out, results)
        if not keep_workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    counts = collections.Counter(e['status'] for e in results['parts'].values())
    progress.say('gpu_check: done, ' + ', '.join(f'{n} {s}' for s, n in counts.items()))
    return results


def _stop(signum, frame) -> None:
    """SIGTERM (the wrapper's overall timeout): end the running part, keep the report."""
    raise SystemExit(128 + signum)


def _entry(status: str, **fields: Any) -> dict[str, Any]:
    return {'status': status, **fields}


def run_one(part: Part, args, results: dict, limits: dict, workdir: Path, log, progress) -> None:
    parts = results['parts']
    remaining = args.budget_s - progress.elapsed_s()
    limit = min(limits[part.name], remaining)
    if part.needs_checkpoint and parts.get('checkpoint', {}).get('status') != 'ok':
        why = f'needs the checkpoint folder; the checkpoint part is {_status_of(parts)}'
        parts[part.name] = _entry('skipped', why=why)
    elif limit < 3:
        parts[part.name] = _entry('skipped', why=f'budget spent ({remaining:.0f} s left)')
    else:
        progress.say(f'{part.name}: start, limit {limit:.0f} s')
        parts[part.name] = _entry('running', limit_s=limit)
        prior_file = workdir / 'prior.json'
        prior_file.write_text(json.dumps(parts))
        result_file = workdir / f'{part.name}.json'
        result_file.unlink(missing_ok=True)
        argv = [
            '--run-part',
            part.name,
            '--workdir',
            str(workdir),
            '--prior',
            str(prior_file),
            '--result',
            str(result_file),
        ]
        argv += ['--dry-run'] if args.dry_run else []
        argv += ['--inject-hang', part.name] if part.name in (args.inject_hang or []) else []
        status, seconds, tail = run_child(part.name, argv, limit, log, progress)
        if status == 'ok' and not result_file.exists():
            status, tail = 'failed', [*tail, 'the part wrote no result']
        entry = _entry(status, seconds=seconds, limit_s=limit)
        if status == 'ok':
            entry['data'] = json.loads(result_file.read_text())
        else:
            entry['output_tail'] = tail
        parts[part.name] = entry
    entry = parts[part.name]
    note = entry.get('why') or (entry['output_tail'][-1] if entry.get('output_tail') else '')
    took = f' in {entry["seconds"]:.1f} s' if 'seconds' in entry else ''
    progress.say(f'{part.name}: {entry["status"]}{took}{"; " + note if note else ""}')


def _status_of(parts: dict) -> str:
    return parts.get('checkpoint', {}).get('status', 'not run')


# --- the report -----------------------------------------------------------------------------


def targets(results: dict) -> list[dict[str, Any]]:
    """The issue's GPU targets against what was measured (None: not measured)."""
    data = {n: e.get('data', {}) for n, e in results['parts'].items()}
    share = data['kernels'].get('decode_worst_copy_share') if 'kernels' in data else None
    serving = data.get('serving', {})
    model = data.get('model', {})
    rows = [
        _target(
            'decode attention, batch >= 32, context >= 2048: worst share of copy bandwidth',
            share,
            '>= 70%',
            _ge(share, 0.7),
            percent=True,
        ),
        _target(
            "one robot's step on the engine core (p50) / floor",
            serving.get('one_robot_step_over_floor'),
            '<= 1.5x',
            _le(serving.get('one_robot_step_over_floor'), 1.5),
        ),
        _target(
            "one robot's runner step with decode graphs / floor",
            model.get('runner_step_over_floor'),
            '<= 1.5x',
            _le(model.get('runner_step_over_floor'), 1.5),
        ),
        _target(
            'robots served at 10 Hz (p99 < 100 ms, >= 95% of actions) / robots the '
            'matmul rate allows',
            serving.get('bound_share_served'),
            '>= 80%',
            _ge(serving.get('bound_share_served'), 0.8),
            percent=True,
        ),
    ]
    return rows


def _le(value, bound) -> bool | None:
    return None if value is None else value <= bound


def _ge(value, bound) -> bool | None:
    return None if value is None else value >= bound


def _target(name: str, value, target: str, met, *, percent: bool = False) -> dict[str, Any]:
    return {'target': name, 'value': value, 'wanted': target, 'met': met, 'percent': percent}


def _fmt(value, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return '-'
    if isinstance(value, float):
        return f'{value:.{digits}f}'
    return str(value)


def report_markdown(results: dict) -> str:
    parts = results['parts']
    env = parts.get('environment', {}).get('data', {})
    title = 'dry run on the CPU (tiny shapes: checks the script, not speed)'
    lines = [f'# GPU check: {title if results["dry_run"] else "GPU run"}', '']
    if env:
        v = env['versions']
        gpu = env['gpu']
        lines.append(
            f'{gpu["name"]}{_gib(gpu)}; Python {v["python"]}, torch {v["torch"]} '
            f'(CUDA {v["cuda"] or "-"}), triton {v["triton"]}, transformers '
            f'{v["transformers"]}, numpy {v["numpy"]}. Copy {env["copy_gb_per_s"]:.0f} GB/s '
            f'(reads + writes), {env["matmul_dtype"]} matmul {env["matmul_tflops"]:.3g} TFLOP/s.'
        )
    lines += [f'Started {results["started"]}, budget {results["budget_s"]:.0f} s.', '']
    lines += ['| part | status | seconds | limit s | note |', '|---|---|---|---|---|']
    for name in PART_NAMES:
        e = parts.get(name, {'status': 'pending'})
        note = e.get('why') or ('; '.join(e['output_tail'][-2:]) if 'output_tail' in e else '')
        note = note.replace('|', '/')[:160]
        lines.append(
            f'| {name} | {e["status"]} | {_fmt(e.get("seconds"), 1)} '
            f'| {_fmt(e.get("limit_s"), 0)} | {note} |'
        )
    lines += ['', '## Targets', '', '| target | measured | wanted | met |', '|---|---|---|---|']
    for t in targets(results):
        value = t['value']
        shown = f'{100 * value:.0f}%' if t['percent'] and value is not None else _fmt(value)
        met = {True: 'yes', False: 'no', None: 'not measured'}[t['met']]
        lines.append(f'| {t["target"]} | {shown} | {t["wanted"]} | {met} |')
    for name, render in SECTIONS.items():
        data = parts.get(name, {}).get('data')
        if data:
            lines += ['', *render(data)]
    return '\n'.join(lines) + '\n'


def _gib(gpu: dict) -> str:
    if 'memory_gib' not in gpu:
        return ''
    return f' ({gpu["memory_gib"]:.0f} GiB, {gpu["num_sms"]} SMs, sm_{gpu["capability"]})'


def _kernels_section(d: dict) -> list[str]:
    s = d['shape']
    lines = [
        f'## Kernels (Hq={s["num_q_heads"]}, Hkv={s["num_kv_heads"]}, D={s["head_dim"]}, '
        f'page {s["page_size"]}, {s["dtype"]}, median of {s["num_reps"]}, L2 flushed)',
        '',
        'Checked against the float32 reference: ' + '; '.join(d['checks']) + '.',
        '',
        '| kernel | batch (tokens) | context | ms | GB/s | of copy | baseline ms |',
        '|---|---|---|---|---|---|---|',
    ]
    for r in d['rows']:
        lines.append(
            f'| {r["kernel"]} | {r["batch"]} | {r["context"]} | {r["ms"]:.3f} '
            f'| {r["gbs"]:.0f} | {100 * r["copy_share"]:.0f}% '
            f'| {r["baseline_ms"]:.3f} |'
        )
    return lines


def _model_section(d: dict) -> list[str]:
    lg = d['logits']
    lines = [
        f'## Model ({d["preset"]}, {d["dtype"]}, prompt {d["prompt_tokens"]} tokens, '
        f'{d["num_action_tokens"]} action tokens; "graphs": {d["graphs_runner"]})',
        '',
        f'Last-token logits against transformers: max relative error '
        f'{lg["max_relative_error"]:.2e}, top-1 {"equal" if lg["top1_equal"] else "differs"}, '
        f'top-5 overlap {lg["top5_overlap"]}/5.',
        '',
        '| robots | engine | prefill ms | decode step ms | step ms | tokens equal |',
        '|---|---|---|---|---|---|',
    ]
    for b in d['batches']:
        equal = {
            'eager': f'{100 * b["eager_equal_transformers_share"]:.0f}% to transformers',
            'graphs': f'{100 * b["graphs_equal_eager_share"]:.0f}% to eager, '
            f'{100 * b["graphs_equal_transformers_share"]:.0f}% to transformers',
            'transformers': '',
        }
        for engine in ('eager', 'graphs', 'transformers'):
            t = b[engine]
            lines.append(
                f'| {b["robots"]} | {engine} | {t["prefill_ms"]:.2f} '
                f'| {t["decode_step_ms"]:.2f} | {t["step_ms"]:.2f} | {equal[engine]} |'
            )
    if 'floor' in d:
        f = d['floor']
        lines += [
            '',
            f'Floor: prefill {f["prefill_ms"]:.2f} ms, decode step {f["decode_ms"]:.2f} '
            f'ms, step {f["step_ms"]:.2f} ms; runner step with graphs / floor: '
            f'{d["runner_step_over_floor"]:.2f}x.',
        ]
    return lines


def _engine_core_section(d: dict) -> list[str]:
    return [
        '## Engine core',
        '',
        f'{d["num_robots"]} robots, {d["num_steps_sent"]} steps: {d["num_results"]} results, '
        f'{d["num_failures"]} failures {d["failure_reasons"] or ""}; '
        f'{d["num_integrity_checks"]} integrity checks passed; actions {d["action_shape"]}; '
        f'CUDA graphs {"on" if d["cuda_graphs"] else "off"}; {d["seconds"]:.1f} s; '
        f'loaded in {d.get("load_s", float("nan")):.1f} s.',
        *_vision_lines(d.get('vision') or []),
    ]


def _vision_lines(rows: list[dict]) -> list[str]:
    if not rows:
        return []
    lines = ['', '| images | vision eager ms | vision graphs ms |', '|---|---|---|']
    lines += [f'| {r["images"]} | {r["eager_ms"]:.2f} | {r["graphs_ms"]:.2f} |' for r in rows]
    return lines


def _serving_section(d: dict) -> list[str]:
    lines = [
        f'## Serving without ROS (10 Hz per robot, deadline {d["deadline_ms"]:.0f} ms, '
        f'{d["duration_s"]:.0f} s per count, CUDA graphs {"on" if d["cuda_graphs"] else "off"})',
        '',
        '| robots | sent / results / failures | latency p50 ms | p99 ms | frame age p99 ms '
        '| deadline met | actions/s | target | superseded frames |',
        '|---|---|---|---|---|---|---|---|---|',
    ]
    for p in d['points']:
        lines.append(
            f'| {p["num_robots"]} | {p["num_sent"]} / {p["num_results"]} / {p["num_failures"]} '
            f'| {_fmt(p["latency_ms_p50"], 1)} | {_fmt(p["latency_ms_p99"], 1)} '
            f'| {_fmt(p["age_ms_p99"], 1)} | {_fmt(100 * p["deadline_met_share"], 0)}% '
            f'| {p["actions_per_s"]:.1f} | {p["target_actions_per_s"]:.0f} '
            f'| {p["num_superseded_frames"]} |'
        )
    lines.append('')
    lines.append(
        f'Most robots served (p99 < {d["deadline_ms"]:.0f} ms, >= 95% of the target '
        f'actions): {d["max_robots_served"]}.'
    )
    if 'robots_bound' in d:
        f = d['floor']
        lines.append(
            f'One step is {d["step_tflop"]:.3g} TFLOP; the matmul rate allows '
            f'{d["robots_bound"]:.1f} robots at 10 Hz; served {100 * d["bound_share_served"]:.0f}%'
            f" of that. Floor of one step {f['step_ms']:.2f} ms; one robot's step (p50) / floor: "
            f'{_fmt(d.get("one_robot_step_over_floor"))}x.'
        )
    return lines


def _scheduler_section(d: dict) -> list[str]:
    lines = [
        '## Scheduler host time per decode step',
        '',
        '| runner | overlap | batch | step us | scheduler us | share | next batch us '
        '| results us |',
        '|---|---|---|---|---|---|---|---|',
    ]
    for p in d['points']:
        lines.append(
            f'| {p["runner"]} | {"on" if p["overlap"] else "off"} | {p["batch_size"]} '
            f'| {p["step_us"]:.0f} | {p["sched_us"]:.0f} | {100 * p["sched_share"]:.1f}% '
            f'| {p["next_batch_us"]:.0f} | {p["process_us"]:.0f} |'
        )
    return lines


SECTIONS: dict[str, Callable[[dict], list[str]]] = {
    'kernels': _kernels_section,
    'model': _model_section,
    'engine_core': _engine_core_section,
    'serving': _serving_section,
    'scheduler': _scheduler_section,
}


def write_outputs(out: Path, results: dict) -> None:
    """Rewrite results.json and report.md (each through a temporary file and a rename)."""
    results['targets'] = targets(results)
    for name, text in (
        ('results.json', json.dumps(results, indent=1, default=_jsonable) + '\n'),
        ('report.md', report_markdown(results)),
    ):
        tmp = out / f'.{name}.tmp'
        tmp.write_text(text)
        tmp.replace(out / name)


def _limit_override(text: str) -> tuple[str, float]:
    name, _, seconds = text.partition('=')
    if name not in PART_NAMES or not seconds:
        raise argparse.ArgumentTypeError(f'--limit wants PART=SECONDS with PART in {PART_NAMES}')
    return name, float(seconds)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--out', type=Path, help='folder for report.md, results.json, the log')
    parser.add_argument('--dry-run', action='store_true', help='tiny shapes on the CPU')
    parser.add_argument(
        '--budget-s',
        type=float,
        default=DEFAULT_BUDGET_S,
        help='seconds for all parts together (limits scale with it)',
    )
    parser.add_argument(
        '--workdir',
        default='',
        help='where the checkpoint goes (kept); default: a temporary folder, deleted at the end',
    )
    parser.add_argument('--parts', nargs='+', choices=PART_NAMES, help='run only these')
    parser.add_argument(
        '--limit',
        type=_limit_override,
        action='append',
        help="PART=SECONDS: this part's limit instead of its share",
    )
    # Checks of the runner itself: a part that never returns.
    parser.add_argument('--inject-hang', nargs='+', choices=PART_NAMES, help=argparse.SUPPRESS)
    # The child side (one part): set by the parent.
    parser.add_argument('--run-part', choices=PART_NAMES, help=argparse.SUPPRESS)
    parser.add_argument('--prior', type=Path, help=argparse.SUPPRESS)
    parser.add_argument('--result', type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.run_part is None and args.out is None:
        parser.error('--out is required')
    if args.budget_s <= 0:
        parser.error('--budget-s must be > 0')
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.run_part:
        return run_part(
            args.run_part,
            dry_run=args.dry_run,
            workdir=Path(args.workdir),
            prior_file=args.prior,
            result_file=args.result,
            hang=bool(args.inject_hang),
        )
    results = run_all(args)
    return 0 if all(e['status'] in ('ok', 'skipped') for e in results['parts'].values()) else 1


if __name__ == '__main__':
    sys.exit(main())
