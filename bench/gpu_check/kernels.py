"""Part ``kernels``: every Triton kernel against its float32 reference, then timed
(``bench.gpu_kernels`` on fewer shapes: 9 decode shapes, 15 launches each). The checks, each
kernel's timed shapes and each sweep row are saved as they end (``PartContext.save_partial``)."""

from __future__ import annotations

from typing import Any

from bench.gpu_check.parts import PartContext


def plan(ctx: PartContext):
    """The prepared run's shapes: a Llama-style GQA layer in bf16 (tiny fp32 in the dry run)."""
    import torch

    from bench.gpu_kernels import BenchPlan

    if ctx.dry_run:
        return BenchPlan(
            torch.device('cpu'), torch.float32, 4, 2, 64, 4, (1,), (9,), 6, (2,), (5,), 1, 1
        )
    return BenchPlan(
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


def run(ctx: PartContext) -> dict[str, Any]:
    import torch

    from bench.gpu_kernels import run_kernels

    ctx.require_cuda()
    rates = ctx.rates()
    # fp16 besides the timed bf16 on a GPU; the interpreter runs fp32 only.
    extra = torch.float32 if ctx.dry_run else torch.float16
    return run_kernels(
        plan(ctx),
        copy_gb_per_s=rates.copy_gb_per_s if rates else None,
        extra_dtype=extra,
        progress=lambda line: print(line, flush=True),
        on_update=ctx.save_partial,
    )


def section(data: dict[str, Any]) -> list[str]:
    from bench.gpu_kernels import markdown_lines

    return markdown_lines(data)
