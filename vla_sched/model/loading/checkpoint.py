"""Loads a Hugging Face VLA checkpoint folder: safetensors only, offline, with clear errors.

Weights come from ``model.safetensors`` or from the shards listed in
``model.safetensors.index.json``. Pickle formats (``*.bin``, ``*.pt``) are refused, never
opened.
"""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path

import torch

from vla_sched.model.config.checkpoint_spec import CheckpointError, CheckpointSpec, read_json
from vla_sched.model.config.formats import read_checkpoint_spec
from vla_sched.model.loading.vla_model import VLAModel, assemble_model
from vla_sched.model.loading.weights import canonical_name

SINGLE_FILE = 'model.safetensors'
INDEX_FILE = 'model.safetensors.index.json'
PICKLE_SUFFIXES = ('.bin', '.pt', '.pth', '.ckpt')


def weight_files(folder: Path) -> dict[str, Path]:
    """Map every stored tensor name to the safetensors file holding it.

    Raises:
        CheckpointError: for a missing shard, no safetensors weights at all, or pickle
            weights only.
    """
    index = folder / INDEX_FILE
    if index.is_file():
        weight_map = read_json(index).get('weight_map')
        if not isinstance(weight_map, dict) or not weight_map:
            raise CheckpointError(f'{INDEX_FILE} has no weight_map')
        files = {name: folder / str(shard) for name, shard in weight_map.items()}
        for shard in sorted({p for p in files.values()}):
            if not shard.is_file():
                held = sum(1 for p in files.values() if p == shard)
                raise CheckpointError(
                    f'missing shard {shard.name} (listed in {INDEX_FILE} for {held} tensors)'
                )
        return files
    single = folder / SINGLE_FILE
    if single.is_file():
        from safetensors import safe_open

        with safe_open(str(single), framework='pt', device='cpu') as handle:
            return {name: single for name in handle.keys()}  # noqa: SIM118
    pickles = sorted(p.name for p in folder.iterdir() if p.suffix in PICKLE_SUFFIXES)
    if pickles:
        raise CheckpointError(
            f'{folder} holds only pickle weights {pickles}; convert them to safetensors '
            '(pickle checkpoints are never loaded)'
        )
    raise CheckpointError(f'no {SINGLE_FILE} or {INDEX_FILE} in {folder}')


def load_checkpoint(
    folder: str | Path,
    *,
    device: torch.device | str = 'cpu',
    dtype: torch.dtype = torch.float32,
    spec: CheckpointSpec | None = None,
) -> VLAModel:
    """Load a VLA (or text-only decoder) checkpoint folder into a ``VLAModel``.

    Args:
        folder: The checkpoint folder.
        device: Where the weights go.
        dtype: Parameter dtype (weights are converted on load).
        spec: The folder's spec if already read.

    Raises:
        CheckpointError: for missing files or shards, pickle-only weights, missing or
            unexpected tensors, or a tensor whose shape disagrees with ``config.json``.
        UnsupportedArchitectureError: for a model type this package cannot run.
        ActionStatisticsError: for missing or malformed action statistics.
    """
    folder = Path(folder)
    spec = spec if spec is not None else read_checkpoint_spec(folder)
    files = weight_files(folder)
    canonical = {}
    for stored in files:
        name = canonical_name(stored)
        if name in canonical:
            raise CheckpointError(f'tensors {canonical[name]} and {stored} both map to {name}')
        canonical[name] = stored
    from safetensors import safe_open

    with ExitStack() as stack:
        handles = {
            path: stack.enter_context(safe_open(str(path), framework='pt', device='cpu'))
            for path in sorted(set(files.values()))
        }
        for path, handle in handles.items():
            present = set(handle.keys())
            listed = [s for s, p in files.items() if p == path and s not in present]
            if listed:
                raise CheckpointError(f'{path.name} lacks tensors its index lists: {listed[:3]}')

        def shape_of(name: str) -> tuple[int, ...]:
            stored = canonical[name]
            return tuple(handles[files[stored]].get_slice(stored).get_shape())

        def read(name: str) -> torch.Tensor:
            stored = canonical[name]
            return handles[files[stored]].get_tensor(stored)

        return assemble_model(
            spec, list(canonical), shape_of=shape_of, read=read, device=device, dtype=dtype
        )
