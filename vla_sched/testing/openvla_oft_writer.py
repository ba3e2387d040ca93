"""Writes a checkpoint folder as an OpenVLA-OFT fine-tune ships it, with seeded random weights.

The folder is an OpenVLA folder (``openvla_writer``: ``config.json``, safetensors, tokenizer
files) plus what openvla-oft's training adds: ``dataset_statistics.json`` with one entry per
dataset (``action`` with ``min``/``max``/``q01``/``q99``/``mask``, ``proprio`` without a
mask), ``action_head--<step>_checkpoint.pt`` (the L1 head's ``MLPResNet``) and, when the
settings use proprio, ``proprio_projector--<step>_checkpoint.pt``: torch ``state_dict``
files whose keys start with ``module.`` as DDP saves them. ``tiny=True`` keeps every name
with OpenVLA's tiny widths (decoder width 64); the weights are random, so the actions mean
nothing, scaled so that they stay O(1).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch

from vla_sched.model.config.action_space import ACTION_STATISTICS_FILE
from vla_sched.model.config.openvla import openvla_text_config
from vla_sched.model.families.openvla_oft.checkpoint import (
    ACTION_HEAD_COMPONENT,
    PROPRIO_PROJECTOR_COMPONENT,
    OFTSettings,
    oft_preset,
)
from vla_sched.model.families.openvla_oft.weights import (
    DDP_PREFIX,
    action_head_shapes,
    proprio_projector_shapes,
)
from vla_sched.testing.openvla_writer import write_openvla_checkpoint

OFT_DATASET = 'libero_spatial_no_noops'
# The published LIBERO-spatial checkpoints' step (their files are '*--150000_checkpoint.pt').
OFT_STEP = 150000


def _statistics_entry(dim: int, *, scale: float, offset: float) -> dict[str, list[float]]:
    q01 = [round(-0.05 * (i + 1) * scale + offset, 4) for i in range(dim)]
    q99 = [round(0.04 * (i + 1) * scale + offset, 4) for i in range(dim)]
    return {
        'q01': q01,
        'q99': q99,
        'min': [round(1.5 * v - 0.01, 4) for v in q01],
        'max': [round(1.5 * v + 0.01, 4) for v in q99],
        'mean': [round((a + b) / 2, 4) for a, b in zip(q01, q99, strict=True)],
        'std': [round(0.02 * (i + 1) * scale, 4) for i in range(dim)],
    }


def oft_statistics(
    datasets: tuple[str, ...], *, action_dim: int, proprio_dim: int
) -> dict[str, Any]:
    """``dataset_statistics.json`` in openvla-oft's layout, values made up but distinct per
    dataset; the last action dimension (the gripper) is not normalized (``mask`` False)."""
    stats: dict[str, Any] = {}
    for k, name in enumerate(datasets):
        scale = 1.0 + 0.5 * k
        action = _statistics_entry(action_dim, scale=scale, offset=0.0)
        action['mask'] = [True] * (action_dim - 1) + [False]
        stats[name] = {
            'action': action,
            'proprio': _statistics_entry(proprio_dim, scale=scale, offset=0.1 * k),
            'num_transitions': 1000 * (k + 1),
            'num_trajectories': 10 * (k + 1),
        }
    return stats


def _random_component_tensor(
    name: str, shape: tuple[int, ...], generator: torch.Generator
) -> torch.Tensor:
    """LayerNorm weights near 1, biases small, matrices scaled by their fan-in."""
    if name.endswith('weight') and len(shape) == 1:
        return 1.0 + 0.1 * torch.randn(shape, generator=generator)
    if name.endswith('bias'):
        return 0.1 * torch.randn(shape, generator=generator)
    return torch.randn(shape, generator=generator) / math.sqrt(shape[1])


def oft_head_state(*, hidden_size: int, action_dim: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Seeded random weights of the L1 head under its stripped names (float32)."""
    generator = torch.Generator().manual_seed(seed)
    return {
        name: _random_component_tensor(name, shape, generator)
        for name, shape in action_head_shapes(hidden_size, action_dim).items()
    }


def oft_proprio_state(
    *, hidden_size: int, proprio_dim: int, seed: int = 0
) -> dict[str, torch.Tensor]:
    """Seeded random weights of the proprio projector under its stripped names (float32)."""
    generator = torch.Generator().manual_seed(seed + 1)
    return {
        name: _random_component_tensor(name, shape, generator)
        for name, shape in proprio_projector_shapes(hidden_size, proprio_dim).items()
    }


def save_component(path: Path, state: dict[str, torch.Tensor], *, ddp_prefix: bool = True) -> Path:
    """``torch.save`` a state dict as training does (``module.`` keys from DDP)."""
    prefix = DDP_PREFIX if ddp_prefix else ''
    torch.save({prefix + name: t.contiguous() for name, t in state.items()}, path)
    return path


def component_file_name(component: str, step: int = OFT_STEP) -> str:
    return f'{component}--{step}_checkpoint.pt'


def write_openvla_oft_checkpoint(
    folder: str | Path,
    *,
    settings: OFTSettings | None = None,
    tiny: bool = True,
    seed: int = 0,
    datasets: tuple[str, ...] = (OFT_DATASET,),
    step: int = OFT_STEP,
    num_shards: int = 1,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = 'cpu',
) -> Path:
    """Write an OpenVLA-OFT-format checkpoint into ``folder`` (created if needed).

    Args:
        folder: Destination; files of the same names are overwritten.
        settings: The platform's settings (default: the ``libero`` preset): the statistics
            and component widths follow its action and proprio sizes, and a proprio
            projector is written only when it uses proprio.
        tiny: Tiny widths; False writes openvla-7b's real shapes (draw it on a GPU).
        seed: Seed of every weight (same seed, same bytes).
        datasets: Dataset names of the statistics (an ``unnorm_key`` picks one).
        step: Training step in the component file names.
        num_shards: One ``model.safetensors``, or this many shards with an index.
        dtype: The merged model's dtype on disk (components stay float32).
        device: Where the merged model's random weights are drawn.

    Returns:
        The folder.
    """
    settings = settings if settings is not None else oft_preset('libero')
    folder = write_openvla_checkpoint(
        folder,
        tiny=tiny,
        seed=seed,
        num_shards=num_shards,
        datasets=tuple(datasets),
        statistics_file=True,
        dtype=dtype,
        device=device,
    )
    stats = oft_statistics(
        tuple(datasets), action_dim=settings.action_dim, proprio_dim=settings.proprio_dim
    )
    path = folder / ACTION_STATISTICS_FILE
    path.write_text(json.dumps(stats, indent=2, sort_keys=True) + '\n')
    config = json.loads((folder / 'config.json').read_text())
    hidden = int(openvla_text_config(config)['hidden_size'])
    head = oft_head_state(hidden_size=hidden, action_dim=settings.action_dim, seed=seed)
    save_component(folder / component_file_name(ACTION_HEAD_COMPONENT, step), head)
    if settings.use_proprio:
        proprio = oft_proprio_state(
            hidden_size=hidden, proprio_dim=settings.proprio_dim, seed=seed
        )
        save_component(folder / component_file_name(PROPRIO_PROJECTOR_COMPONENT, step), proprio)
    return folder
