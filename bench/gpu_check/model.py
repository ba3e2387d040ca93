"""Part ``model``: our runner eager and through CUDA graphs against transformers on
openvla-7b (``bench.runner_vs_generate``), and one robot's runner step against the floor."""

from __future__ import annotations

from typing import Any

from bench.gpu_check.parts import PartContext


def run(ctx: PartContext) -> dict[str, Any]:
    from bench.runner_vs_generate import ComparePlan, compare

    ctx.require_cuda()
    if ctx.dry_run:
        plan = ComparePlan(device='cpu', tiny=True, batch_sizes=(1,), reps=1)
    else:
        plan = ComparePlan(device='cuda', tiny=False, batch_sizes=(1, 16), reps=5)
    return compare(plan, rates=ctx.rates(), progress=lambda line: print(line, flush=True))


def section(data: dict[str, Any]) -> list[str]:
    from bench.runner_vs_generate import markdown_lines

    return markdown_lines(data)
