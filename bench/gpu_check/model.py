"""Part ``model``: our runner eager and through CUDA graphs against transformers on
openvla-7b (``bench.runner_vs_generate``) for 1 and 16 robots (1 and 2 of the tiny model in
the dry run); one robot's runner step against the floor, 16 robots' batched step against
the floor of a batch. The logits check and each robot count are saved as they end
(``PartContext.save_partial``)."""

from __future__ import annotations

from typing import Any

from bench.gpu_check.parts import PartContext


def run(ctx: PartContext) -> dict[str, Any]:
    from bench.runner_vs_generate import ComparePlan, compare

    ctx.require_cuda()
    if ctx.dry_run:
        plan = ComparePlan(device='cpu', tiny=True, batch_sizes=(1, 2), reps=1)
    else:
        plan = ComparePlan(device='cuda', tiny=False, batch_sizes=(1, 16), reps=5)
    return compare(
        plan,
        rates=ctx.rates(),
        progress=lambda line: print(line, flush=True),
        on_update=ctx.save_partial,
    )


def section(data: dict[str, Any]) -> list[str]:
    from bench.runner_vs_generate import markdown_lines

    return markdown_lines(data)
