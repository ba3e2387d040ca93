"""Part ``checkpoint``: the openvla-7b folder with random bf16 weights (15 GB) in the work
dir, written once (the tiny folder in fp32 in the dry run); the later parts read it."""

from __future__ import annotations

from typing import Any

from bench.gpu_check.parts import PartContext


def run(ctx: PartContext) -> dict[str, Any]:
    import torch

    from bench.lib.checkpoints import folder_size_bytes, openvla_folder_once

    ctx.require_cuda()
    folder, reused = openvla_folder_once(
        ctx.workdir, tiny=ctx.dry_run, device=torch.device(ctx.device), dtype=ctx.dtype
    )
    size = folder_size_bytes(folder)
    print(f'{folder}: {size / 1e9:.2f} GB{" (reused)" if reused else ""}', flush=True)
    return {'folder': str(folder), 'size_gb': size / 1e9, 'reused': reused}
