"""Write an openvla-7b checkpoint folder with random weights, for serving benchmarks.

The serving nodes load checkpoints from folders (the engine and the baseline run in their own
processes), so the ``openvla-7b`` preset is written out in OpenVLA's own format
(``vla_sched.testing.openvla_writer``): ``config.json`` with ``model_type: "openvla"``, the fused
DINOv2 + SigLIP towers at 224 px (256 image tokens right after BOS), the 3-layer projector,
a Llama-2-7B decoder with LlamaConfig's defaults, ``norm_stats``, the image preprocessor and
a Llama-2-like tokenizer (``<unk> <s> </s>`` at 0-2, ``▁`` at 29871, ``<PAD>`` at 32000).
Weights are seeded random bf16, drawn on the target device and written as safetensors
shards; the actions they produce are meaningless.

``shrink=True`` keeps that layout (names, vocabulary, image size and token count, prompt) with
tiny widths and depths, so the same code path runs on a CPU in seconds.
"""

from __future__ import annotations

from pathlib import Path

import torch

from vla_sched.testing.openvla_writer import write_openvla_checkpoint as write_openvla_folder


def write_openvla_checkpoint(
    folder: str | Path,
    *,
    device: torch.device | str = 'cpu',
    dtype: torch.dtype = torch.bfloat16,
    shrink: bool = False,
    seed: int = 0,
    num_shards: int = 4,
) -> Path:
    """Write the checkpoint into ``folder`` (created); returns the folder.

    Args:
        folder: Destination.
        device: Where the random weights are drawn (a GPU draws 7B in seconds).
        dtype: Weights dtype on disk.
        shrink: Tiny widths and depths with the same layout (CPU checks).
        seed: Seed of the weights.
        num_shards: safetensors files to split the weights over.
    """
    return write_openvla_folder(
        folder,
        variant='fused',
        tiny=shrink,
        seed=seed,
        num_shards=num_shards,
        dtype=dtype,
        device=device,
    )
