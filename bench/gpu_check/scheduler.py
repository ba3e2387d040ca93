"""Part ``scheduler``: the scheduler's host time per decode step, with the null runner and
the checkpoint's runner (CUDA graphs on a GPU), overlap on and off
(``bench.scheduler_cost``)."""

from __future__ import annotations

import dataclasses
from typing import Any

from bench.gpu_check.parts import PartContext
from bench.lib.tables import markdown_table


def run(ctx: PartContext) -> dict[str, Any]:
    from bench import scheduler_cost as sc

    ctx.require_cuda()
    if ctx.dry_run:
        null, model, steps = ['1', '4'], ['1', '2'], '3'
    else:
        null, model, steps = ['1', '64'], ['1', '16', '64'], '20'
    common = ['--steps', steps, '--model-path', str(ctx.folder())]
    points = sc.run(sc.parse_args([*common, '--runners', 'null', '--batch-sizes', *null]))
    argv = [*common, '--runners', 'model', '--device', ctx.device, '--batch-sizes', *model]
    points += sc.run(sc.parse_args(argv))
    rows = [
        {**dataclasses.asdict(p), 'sched_us': p.sched_us, 'sched_share': p.sched_share}
        for p in points
    ]
    return {'points': rows}


def section(d: dict[str, Any]) -> list[str]:
    headers = ['runner', 'overlap', 'batch', 'step us', 'scheduler us', 'share']
    headers += ['next batch us', 'results us']
    rows = [
        [p['runner'], 'on' if p['overlap'] else 'off', p['batch_size'], f'{p["step_us"]:.0f}',
         f'{p["sched_us"]:.0f}', f'{100 * p["sched_share"]:.1f}%', f'{p["next_batch_us"]:.0f}',
         f'{p["process_us"]:.0f}']
        for p in d['points']
    ]  # fmt: skip
    return ['## Scheduler host time per decode step', '', markdown_table(headers, rows)]
