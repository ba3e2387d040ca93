"""OpenVLA checkpoint folders with random weights, for benchmarks that load folders.

The serving engines load checkpoints from folders, so the ``openvla-7b`` preset is written
out in OpenVLA's own format (``vla_sched.testing.openvla_writer``): ``config.json`` with
``model_type: "openvla"``, the fused DINOv2 + SigLIP towers at 224 px (256 image tokens
right after BOS), the 3-layer projector, a Llama-2-7B decoder with LlamaConfig's defaults,
``norm_stats``, the image preprocessor and a Llama-2-like tokenizer. Weights are seeded
random, drawn on the target device and written as safetensors shards; the actions they
produce are meaningless. ``tiny=True`` keeps that layout (names, vocabulary, image size and
token count, prompt) with tiny widths and depths, so the same code runs on a CPU in seconds.
"""

from __future__ import annotations

from pathlib import Path

import torch

from vla_sched.testing.openvla_writer import write_openvla_checkpoint

COMPLETE_MARKER = '.complete'


def write_openvla_folder(
    folder: str | Path,
    *,
    tiny: bool,
    device: torch.device | str = 'cpu',
    dtype: torch.dtype = torch.bfloat16,
    seed: int = 0,
    num_shards: int = 4,
) -> Path:
    """Write the fused OpenVLA checkpoint into ``folder`` (created); returns the folder.

    Args:
        folder: Destination.
        tiny: Tiny widths and depths with the same layout (CPU checks); else openvla-7b.
        device: Where the random weights are drawn (a GPU draws 7B in seconds).
        dtype: Weights dtype on disk.
        seed: Seed of the weights.
        num_shards: safetensors files to split the weights over.
    """
    return write_openvla_checkpoint(
        folder,
        variant='fused',
        tiny=tiny,
        seed=seed,
        num_shards=num_shards,
        dtype=dtype,
        device=device,
    )


def openvla_folder_once(
    workdir: Path, *, tiny: bool, device: torch.device | str, dtype: torch.dtype
) -> tuple[Path, bool]:
    """The OpenVLA folder in ``workdir``, written unless a finished one is there already.

    Returns:
        The folder, and whether it was reused. A folder counts as finished once every file
        is written (a marker file is written last), so an interrupted write is redone.
    """
    folder = workdir / ('openvla-tiny-random' if tiny else 'openvla-7b-random')
    done = folder / COMPLETE_MARKER
    reused = done.exists()
    if not reused:
        write_openvla_folder(folder, tiny=tiny, device=device, dtype=dtype)
        done.write_text('written\n')
    return folder, reused


def folder_size_bytes(folder: Path) -> int:
    """The bytes of the files directly in ``folder``."""
    return sum(f.stat().st_size for f in folder.iterdir() if f.is_file())
