"""OpenVLA-OFT's component files: read tensors-only, names and shapes checked.

``action_head--*checkpoint.pt`` and ``proprio_projector--*checkpoint.pt`` are torch
``state_dict`` files saved from DDP-wrapped modules, so every key starts with ``module.``.
Upstream publishes them only in torch's zip format, whose index is a pickle: they are the
one place the model reads such a file, and only through torch's restricted loader
(``torch.load(..., weights_only=True)``: tensors and plain containers, never an arbitrary
object or code; a file holding anything else is refused with ``CheckpointError``). Every
other weight is read from safetensors. The prefix is stripped, and every name and shape is
checked against the settings before anything is loaded; a disagreement names the file, the
tensor and the setting.
"""

from __future__ import annotations

import pickle
import zipfile
from collections.abc import Mapping
from pathlib import Path

import torch

from vla_sched.model.config.architecture import UnsupportedArchitectureError
from vla_sched.model.config.checkpoint_spec import CheckpointError
from vla_sched.model.families.openvla_oft.action_head import OFT_HEAD_NUM_BLOCKS

DDP_PREFIX = 'module.'
DIFFUSION_HEAD_PREFIX = 'noise_predictor.'


def load_component_state(path: Path) -> dict[str, torch.Tensor]:
    """A component file's tensors with a leading ``module.`` stripped from every name.

    Raises:
        CheckpointError: for a missing or unreadable file, one holding anything but tensors,
            or two names that are equal once stripped.
    """
    if not path.is_file():
        raise CheckpointError(f'missing {path.name} in {path.parent}')
    try:
        loaded = torch.load(path, map_location='cpu', weights_only=True)
    # weights_only refuses other objects with pickle's UnpicklingError
    except (pickle.UnpicklingError, RuntimeError, EOFError, zipfile.BadZipFile) as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(
            f'{path.name} is not a tensors-only torch file (read with weights_only=True): '
            f'{first_line}'
        ) from None
    if not isinstance(loaded, Mapping):
        raise CheckpointError(f'{path.name} holds a {type(loaded).__name__}, not a state dict')
    state: dict[str, torch.Tensor] = {}
    for name, tensor in loaded.items():
        if not isinstance(name, str) or not isinstance(tensor, torch.Tensor):
            raise CheckpointError(f'{path.name}: entry {name!r} is not a named tensor')
        stripped = name.removeprefix(DDP_PREFIX)
        if stripped in state:
            raise CheckpointError(f'{path.name}: {name!r} and another entry both name {stripped}')
        state[stripped] = tensor
    return state


def action_head_shapes(
    hidden_size: int, action_dim: int, *, num_blocks: int = OFT_HEAD_NUM_BLOCKS
) -> dict[str, tuple[int, ...]]:
    """Names and shapes of the L1 head's tensors (``L1ActionHead``'s state dict)."""
    d, width = hidden_size, hidden_size * action_dim
    shapes: dict[str, tuple[int, ...]] = {
        'model.layer_norm1.weight': (width,),
        'model.layer_norm1.bias': (width,),
        'model.fc1.weight': (d, width),
        'model.fc1.bias': (d,),
    }
    for i in range(num_blocks):
        block = f'model.mlp_resnet_blocks.{i}.ffn.'
        shapes.update({f'{block}0.weight': (d,), f'{block}0.bias': (d,)})
        shapes.update({f'{block}1.weight': (d, d), f'{block}1.bias': (d,)})
    shapes.update({'model.layer_norm2.weight': (d,), 'model.layer_norm2.bias': (d,)})
    shapes.update({'model.fc2.weight': (action_dim, d), 'model.fc2.bias': (action_dim,)})
    return shapes


def proprio_projector_shapes(hidden_size: int, proprio_dim: int) -> dict[str, tuple[int, ...]]:
    """Names and shapes of the proprio projector's tensors."""
    d = hidden_size
    return {
        'fc1.weight': (d, proprio_dim),
        'fc1.bias': (d,),
        'fc2.weight': (d, d),
        'fc2.bias': (d,),
    }


def _shape(state: Mapping[str, torch.Tensor], name: str) -> tuple[int, ...] | None:
    return tuple(state[name].shape) if name in state else None


def check_action_head(
    state: Mapping[str, torch.Tensor], *, file_name: str, hidden_size: int, action_dim: int
) -> None:
    """Check an action head's tensors against the decoder width and ``action_dim``.

    Raises:
        UnsupportedArchitectureError: for a diffusion head.
        CheckpointError: naming the tensor and the setting that disagree.
    """
    if any(name.startswith(DIFFUSION_HEAD_PREFIX) for name in state):
        raise UnsupportedArchitectureError(
            f'{file_name} is a diffusion action head ({DIFFUSION_HEAD_PREFIX}* tensors): only '
            'the L1-regression head is served'
        )
    fc1 = _shape(state, 'model.fc1.weight')
    if fc1 is not None and len(fc1) == 2 and fc1[1] != hidden_size * action_dim:
        raise CheckpointError(
            f'{file_name}: the head reads {fc1[1]} values per chunk step (model.fc1.weight '
            f'{list(fc1)}), but the decoder width {hidden_size} x OFT setting action_dim '
            f'{action_dim} is {hidden_size * action_dim}'
        )
    fc2 = _shape(state, 'model.fc2.weight')
    if fc2 is not None and len(fc2) == 2 and fc2[0] != action_dim:
        raise CheckpointError(
            f'{file_name}: the head gives {fc2[0]} values per action (model.fc2.weight '
            f'{list(fc2)}), but OFT setting action_dim is {action_dim}'
        )
    check_names_and_shapes(state, action_head_shapes(hidden_size, action_dim), file_name=file_name)


def check_proprio_projector(
    state: Mapping[str, torch.Tensor], *, file_name: str, hidden_size: int, proprio_dim: int
) -> None:
    """Check a proprio projector's tensors against the decoder width and ``proprio_dim``.

    Raises:
        CheckpointError: naming the tensor and the setting that disagree.
    """
    fc1 = _shape(state, 'fc1.weight')
    if fc1 is not None and len(fc1) == 2 and fc1[1] != proprio_dim:
        raise CheckpointError(
            f'{file_name}: the projector takes {fc1[1]} state values (fc1.weight {list(fc1)}), '
            f'but OFT setting proprio_dim is {proprio_dim}'
        )
    check_names_and_shapes(
        state, proprio_projector_shapes(hidden_size, proprio_dim), file_name=file_name
    )


def check_names_and_shapes(
    state: Mapping[str, torch.Tensor],
    expected: Mapping[str, tuple[int, ...]],
    *,
    file_name: str,
) -> None:
    """Raise ``CheckpointError`` naming missing, unexpected or wrongly shaped tensors."""
    missing = sorted(set(expected) - set(state))
    if missing:
        raise CheckpointError(f'{file_name} lacks {len(missing)} tensors, e.g. {missing[:3]}')
    unexpected = sorted(set(state) - set(expected))
    if unexpected:
        raise CheckpointError(
            f'{file_name} has {len(unexpected)} tensors the settings do not describe, e.g. '
            f'{unexpected[:3]}'
        )
    for name, shape in expected.items():
        if tuple(state[name].shape) != shape:
            raise CheckpointError(
                f'{file_name}: {name} has shape {list(state[name].shape)}, the settings imply '
                f'{list(shape)}'
            )
