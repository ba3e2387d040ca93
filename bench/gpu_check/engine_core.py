"""Part ``engine_core``: ``ScheduledCore`` on the checkpoint folder, 4 robots x 3 steps:
``check_integrity()`` after every scheduler step, every step ends as exactly one result or
failure (``bench.engine_paced.run_checked``); then the vision encoder eager against the
runner's captured path per image count."""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Any

from bench.gpu_check.parts import PartContext
from bench.lib.tables import markdown_table


def run(ctx: PartContext) -> dict[str, Any]:
    from bench.engine_paced import make_core, run_checked

    ctx.require_cuda()
    started = time.perf_counter()
    core = make_core(str(ctx.folder()), device=ctx.device, cuda_graphs=not ctx.dry_run)
    load_s = time.perf_counter() - started
    print(f'engine core loaded (weights, KV pool, graphs captured) in {load_s:.1f} s', flush=True)
    checked = run_checked(core, num_robots=4, steps_per_robot=2 if ctx.dry_run else 3)
    if checked.num_results == 0:
        raise AssertionError(f'no step produced a result: {checked.failure_reasons}')
    print(checked, flush=True)
    vision = vision_times(core.scheduler.runner, dry_run=ctx.dry_run)
    print(f'vision encoder: {vision}', flush=True)
    return {
        **dataclasses.asdict(checked),
        'cuda_graphs': not ctx.dry_run,
        'load_s': load_s,
        'vision': vision,
    }


def vision_times(runner, *, dry_run: bool) -> list[dict[str, Any]]:
    """Host wall ms of the vision encoder per image count: eager and through the runner's
    padded (on a GPU, captured) path, median of 10 after 2 warm-ups."""
    import torch

    from vla_sched.model.runner.vision_graphs import VisionGraphs

    model = runner.model
    graphs = runner.vision_graphs
    if graphs is None and dry_run and model.vision is not None:  # the padded path, eager
        prep = model.spec.preprocessing
        graphs = VisionGraphs(
            model.vision, pixel_shape=(len(prep.mean), prep.image_size, prep.image_size),
            batch_sizes=(1, 2), device=runner.device, output_dtype=model.dtype, capture=False,
        )  # fmt: skip
    if graphs is None:
        return []
    out = []
    for count in (1, 2) if dry_run else (1, 4, 16):
        if graphs.padded_size(count) is None:
            continue
        pixels = torch.randn((count, *graphs.pixels.shape[1:]), device=runner.device)
        row: dict[str, Any] = {'images': count}
        for name, encode in (('eager', model.encode_images), ('graphs', graphs.encode)):
            times = []
            for i in range(12):
                _sync(runner.device)
                started = time.perf_counter()
                encode(pixels)
                _sync(runner.device)
                if i >= 2:
                    times.append((time.perf_counter() - started) * 1e3)
            row[f'{name}_ms'] = statistics.median(times)
        out.append(row)
    return out


def _sync(device) -> None:
    import torch

    if device.type == 'cuda':
        torch.cuda.synchronize(device)


def section(d: dict[str, Any]) -> list[str]:
    lines = [
        '## Engine core',
        '',
        f'{d["num_robots"]} robots, {d["num_steps_sent"]} steps: {d["num_results"]} results, '
        f'{d["num_failures"]} failures {d["failure_reasons"] or ""}; '
        f'{d["num_integrity_checks"]} integrity checks passed; actions {d["action_shape"]}; '
        f'CUDA graphs {"on" if d["cuda_graphs"] else "off"}; {d["seconds"]:.1f} s; '
        f'loaded in {d["load_s"]:.1f} s.',
    ]
    if d['vision']:
        rows = [[r['images'], r['eager_ms'], r['graphs_ms']] for r in d['vision']]
        lines += ['', markdown_table(['images', 'vision eager ms', 'vision graphs ms'], rows)]
    return lines
