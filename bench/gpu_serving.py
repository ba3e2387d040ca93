"""Serving on a GPU: the control loop, the ITL jump and the scheduler's cost with
openvla-7b's real architecture in bf16, against the physical floor.

One prepared run (under 8 minutes on an H200):

0. the floor: device-to-device copy bandwidth and the bf16 matmul rate are measured; a
   decode step's floor is the decoder's weight bytes (all but the gathered embedding) over
   the bandwidth, a prefill's is its FLOPs (decoder over the prompt, both towers and the
   projector over the patches) over the matmul rate (or its weight bytes over the
   bandwidth, if longer); one robot's step floor is a prefill plus ``H*D - 1`` decode
   steps;
1. an openvla-7b checkpoint in OpenVLA's format with random bf16 weights is written to disk
   (``bench/openvla_checkpoint.py``), since both serving nodes load folders;
2. one robot's step on the engine core, back to back, against the floor (target: within
   1.5x);
3. the scheduler's cost without the model (1-256 requests) and its share of a decode step
   with the model, overlap on and off (``bench/scheduler_cost.py``);
4. the ITL jump at 16 robots x 10 Hz for each scheduler variant (``bench/itl_jump.py``);
5. the control loop through ROS, vla_sched against the generate baseline, N = 1..16 at 10 Hz
   (``bench/control_loop.py``; target: 16 robots within a 100 ms p99). Skipped, with a note,
   where rclpy or the messages are missing.

    python bench/gpu_serving.py --out serving.md
    python bench/gpu_serving.py --dry-run          # the same steps, tiny and short, on the CPU
"""

from __future__ import annotations

import argparse
import contextlib
import io
import math
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault('HF_HUB_OFFLINE', '1')
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from typing import TYPE_CHECKING

import torch

from bench import scheduler_cost
from bench.openvla_checkpoint import write_openvla_checkpoint

if TYPE_CHECKING:  # loaded by the parts that use them (control_loop imports rclpy)
    from bench import control_loop, itl_jump


@dataclass(frozen=True, slots=True)
class GpuPlan:
    """Sizes and durations of each part (the dry run shrinks them all)."""

    device: str
    shrink: bool
    cost_batch_sizes: tuple[int, ...]
    model_batch_sizes: tuple[int, ...]
    cost_steps: int
    itl_robots: int
    itl_duration_s: float
    itl_variants: tuple[str, ...]
    single_duration_s: float
    loop_robots: tuple[int, ...]
    loop_warmup_s: float
    loop_duration_s: float


def make_plan(dry_run: bool) -> GpuPlan:
    if dry_run:
        return GpuPlan(
            device='cpu',
            shrink=True,
            cost_batch_sizes=(1, 4),
            model_batch_sizes=(1, 4),
            cost_steps=3,
            itl_robots=2,
            itl_duration_s=1.0,
            itl_variants=('sglang', 'chunked'),
            single_duration_s=1.0,
            loop_robots=(1,),
            loop_warmup_s=0.5,
            loop_duration_s=2.0,
        )
    if not torch.cuda.is_available():
        raise SystemExit('no CUDA device: run with --dry-run on a CPU')
    from bench import itl_jump

    return GpuPlan(
        device='cuda',
        shrink=False,
        cost_batch_sizes=(1, 2, 4, 8, 16, 32, 64, 128, 256),
        model_batch_sizes=(1, 4, 16, 64, 256),
        cost_steps=20,
        itl_robots=16,
        itl_duration_s=6.0,
        itl_variants=itl_jump.VARIANTS,
        single_duration_s=4.0,
        loop_robots=(1, 2, 4, 8, 16),
        loop_warmup_s=3.0,
        loop_duration_s=8.0,
    )


# --- the floor ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Floor:
    """Measured device rates and the floor of one robot's control step (milliseconds)."""

    copy_gb_per_s: float
    matmul_tflops: float
    decoder_weight_gb: float
    prefill_tflop: float
    prefill_ms: float
    decode_ms: float
    step_ms: float


def _sync(device: torch.device) -> None:
    if device.type == 'cuda':
        torch.cuda.synchronize(device)


def _median_time(device: torch.device, fn, reps: int = 10) -> float:
    fn()
    times = []
    for _ in range(reps):
        _sync(device)
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure_floor(folder: Path, device: torch.device, dtype: torch.dtype) -> Floor:
    """Copy bandwidth and matmul rate on ``device``, and the floor of one robot's step."""
    copy_bps, flops_per_s = measure_rates(device, dtype)
    return step_floor(folder, dtype, copy_bps=copy_bps, flops_per_s=flops_per_s)


def measure_rates(device: torch.device, dtype: torch.dtype) -> tuple[float, float]:
    """Device-to-device copy bandwidth (bytes/s, reads + writes) and the ``dtype`` matmul
    rate (FLOP/s) on ``device``, medians of 10."""
    num_bytes = (1 << 30) if device.type == 'cuda' else (64 << 20)
    src = torch.empty(num_bytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    copy_bps = 2 * num_bytes / _median_time(device, lambda: dst.copy_(src))
    n = 8192 if device.type == 'cuda' else 512
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    flops_per_s = 2 * n**3 / _median_time(device, lambda: torch.mm(a, b))
    return copy_bps, flops_per_s


def step_floor(folder: Path, dtype: torch.dtype, *, copy_bps: float, flops_per_s: float) -> Floor:
    """The floor of one robot's step on the checkpoint in ``folder`` at the given rates."""
    from vla_sched.model.config.checkpoint_spec import CONFIG_FILE, read_json
    from vla_sched.model.config.formats import read_checkpoint_spec
    from vla_sched.model.loading.weights import decoder_shapes
    from vla_sched.testing.openvla_writer import openvla_tensor_shapes

    spec = read_checkpoint_spec(folder)
    element = torch.finfo(dtype).bits // 8
    shapes = decoder_shapes(spec.decoder)
    decoder_params = sum(math.prod(s) for k, s in shapes.items() if 'embed_tokens' not in k)
    vision_params = sum(
        math.prod(s)
        for k, s in openvla_tensor_shapes(read_json(folder / CONFIG_FILE)).items()
        if k.startswith(('vision_backbone.', 'projector.')) and '.attn_pool.' not in k
    )  # both towers (their unused pooling head left out) and the projector
    num_prompt = 1 + spec.num_image_tokens + 23  # BOS, image, OpenVLA's instruction prompt
    prefill_flops = 2 * decoder_params * num_prompt + 2 * vision_params * spec.num_image_tokens
    weight_s = (decoder_params + vision_params) * element / copy_bps
    prefill_s = max(prefill_flops / flops_per_s, weight_s)
    decode_s = decoder_params * element / copy_bps
    step_s = prefill_s + (spec.num_action_tokens - 1) * decode_s
    return Floor(
        copy_gb_per_s=copy_bps / 1e9,
        matmul_tflops=flops_per_s / 1e12,
        decoder_weight_gb=decoder_params * element / 1e9,
        prefill_tflop=prefill_flops / 1e12,
        prefill_ms=prefill_s * 1e3,
        decode_ms=decode_s * 1e3,
        step_ms=step_s * 1e3,
    )


# --- the parts ------------------------------------------------------------------------------


def _quiet(fn, *args, **kwargs):
    """Run ``fn`` with its own progress lines captured (the report prints the tables)."""
    with contextlib.redirect_stdout(io.StringIO()):
        return fn(*args, **kwargs)


def single_robot(plan: GpuPlan, folder: Path) -> itl_jump.JumpResult:
    """One robot sending steps back to back through the engine core's default scheduler."""
    from bench import itl_jump

    argv = f'--robots 1 --period 0.001 --duration {plan.single_duration_s}'.split()
    argv += ['--variants', 'engine default', '--device', plan.device, '--model-path', str(folder)]
    (variant,) = itl_jump.make_variants(['engine default'], chunk=16, near_done=4)
    return itl_jump.run_variant(variant, itl_jump.parse_args(argv))


def scheduler_costs(plan: GpuPlan, folder: Path) -> list[scheduler_cost.CostPoint]:
    common = ['--steps', str(plan.cost_steps), '--model-path', str(folder)]
    null = [*common, '--runners', 'null', '--batch-sizes', *map(str, plan.cost_batch_sizes)]
    model = [*common, '--runners', 'model', '--device', plan.device, '--batch-sizes']
    model += [str(b) for b in plan.model_batch_sizes]
    return [
        *_quiet(scheduler_cost.run, scheduler_cost.parse_args(null)),
        *_quiet(scheduler_cost.run, scheduler_cost.parse_args(model)),
    ]


def itl_jumps(plan: GpuPlan, folder: Path) -> list[itl_jump.JumpResult]:
    from bench import itl_jump

    argv = f'--robots {plan.itl_robots} --period 0.1 --duration {plan.itl_duration_s}'.split()
    argv += ['--chunk', '64', '--device', plan.device, '--model-path', str(folder)]
    args = itl_jump.parse_args(argv)
    variants = itl_jump.make_variants(list(plan.itl_variants), chunk=64, near_done=2)
    return [itl_jump.run_variant(v, args) for v in variants]


def control_loops(plan: GpuPlan, folder: Path) -> list[control_loop.LoopPoint] | str:
    try:
        import rclpy  # noqa: F401

        import vla_sched.msg  # noqa: F401
        from bench import control_loop
    except ImportError as exc:
        return f'skipped: {exc}'
    loop = control_loop.LoopPlan(
        robot_counts=plan.loop_robots,
        period_s=0.1,
        budget_s=0.5,
        warmup_s=plan.loop_warmup_s,
        duration_s=plan.loop_duration_s,
        num_windows=1,
        model_path=str(folder),
        device=plan.device,
    )
    return _quiet(control_loop.run, loop)


# --- the report -----------------------------------------------------------------------------


def floor_lines(
    floor: Floor, single: itl_jump.JumpResult, cost: list[scheduler_cost.CostPoint]
) -> list[str]:
    """The floor against the engine core's step, and against one runner decode step (with
    CUDA graphs on a GPU) from the scheduler-cost run."""
    ratio = single.step_p50 / floor.step_ms
    decode = [p for p in cost if p.runner == 'model' and not p.overlap and p.batch_size == 1]
    decode_row = []
    if decode:
        d = decode[0]
        decode_row = [
            f'| runner decode step, 1 request (model only, with scheduler) | '
            f'| {d.model_us / 1e3:.2f}, {d.step_us / 1e3:.2f} | |'
        ]
    return [
        f'Measured: copy {floor.copy_gb_per_s:.3g} GB/s (reads + writes), matmul '
        f'{floor.matmul_tflops:.3g} TFLOP/s. Decoder weights {floor.decoder_weight_gb:.3g} GB.',
        '',
        '| | prefill ms | decode step ms | one robot step ms |',
        '|---|---|---|---|',
        f'| floor | {floor.prefill_ms:.2f} | {floor.decode_ms:.2f} | {floor.step_ms:.2f} |',
        f'| engine core (p50, p99) | | | {single.step_p50:.2f}, {single.step_p99:.2f} |',
        *decode_row,
        '',
        f'One robot step / floor: {ratio:.2f}x (target <= 1.5x: '
        f'{"met" if ratio <= 1.5 else "missed"}); prefill {floor.prefill_tflop:.3g} TFLOP.',
    ]


def report(plan: GpuPlan, parts: dict, elapsed: dict[str, float]) -> str:
    from bench import itl_jump

    lines = [f'# Serving on {plan.device} ({"dry run, tiny" if plan.shrink else "OpenVLA-7B"})']
    lines += ['', '## Floor and one robot', '']
    lines += floor_lines(parts['floor'], parts['single'], parts['cost'])
    lines += ['', '## Scheduler cost per decode step', '']
    lines.append(scheduler_cost.markdown_table(parts['cost']))
    lines += ['', f'## ITL jump ({plan.itl_robots} robots at 10 Hz)', '', itl_jump.HEADER]
    lines.append('|' + '---|' * (itl_jump.HEADER.count('|') - 1))
    lines += [itl_jump.format_row(r) for r in parts['itl']]
    lines += ['', '## Control loop through ROS (10 Hz per robot)', '']
    loops = parts['loop']
    if isinstance(loops, str):
        lines.append(loops)
    else:
        from bench import control_loop

        lines.append(control_loop.markdown_tables(loops))
    if not isinstance(loops, str):
        target = [p for p in loops if p.system == 'vla_sched' and p.num_robots == 16]
        if target:
            p = target[0]
            met = p.latency_ms_p99 <= 100 and min(p.actions_per_s) >= 0.95 * p.target_actions_per_s
            verdict = 'met' if met else 'missed'
            lines += [
                '',
                f'16 robots at 10 Hz within a 100 ms p99: {verdict} '
                f'(p99 {p.latency_ms_p99:.0f} ms).',
            ]
    lines += ['', 'Seconds per part: ' + ', '.join(f'{k} {v:.0f}' for k, v in elapsed.items())]
    return '\n'.join(lines) + '\n'


def run(plan: GpuPlan, *, skip_ros: bool, workdir: Path) -> str:
    device = torch.device(plan.device)
    dtype = torch.bfloat16 if device.type == 'cuda' else torch.float32
    elapsed: dict[str, float] = {}
    parts: dict = {}

    def timed(name: str, fn, *args):
        start = time.monotonic()
        parts[name] = fn(*args)
        elapsed[name] = time.monotonic() - start
        print(f'gpu_serving: {name} done in {elapsed[name]:.0f} s', file=sys.stderr, flush=True)

    folder = workdir / ('openvla-shaped-tiny' if plan.shrink else 'openvla-7b-random')
    timed(
        'checkpoint',
        lambda: write_openvla_checkpoint(folder, device=device, shrink=plan.shrink),
    )
    timed('floor', measure_floor, folder, device, dtype)
    timed('single', single_robot, plan, folder)
    timed('cost', scheduler_costs, plan, folder)
    timed('itl', itl_jumps, plan, folder)
    if skip_ros:
        parts['loop'] = 'skipped (--skip-ros)'
    else:
        timed('loop', control_loops, plan, folder)
    return report(plan, parts, elapsed)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--dry-run', action='store_true', help='tiny, short, on the CPU')
    parser.add_argument('--skip-ros', action='store_true', help='leave out the control loop')
    parser.add_argument('--workdir', default='', help='where the checkpoint goes (default: tmp)')
    parser.add_argument('--out', default='', help='also write the report here')
    args = parser.parse_args(argv)
    plan = make_plan(args.dry_run)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix='vla_gpu_serving_'))
    text = run(plan, skip_ros=args.skip_ros, workdir=workdir)
    print(text, end='')
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == '__main__':
    sys.exit(main())
