"""What a LeRobot policy folder says, read from its JSON files, its normalizer statistics
and its weights' safetensors header (no torch, no model): the pieces every LeRobot family
(pi0, pi0.5, SmolVLA) reads the same way.

A folder holds ``config.json`` (the policy config: ``type``, the features, the chunk),
``model.safetensors`` (keys prefixed ``model.``), ``policy_preprocessor.json`` and
``policy_postprocessor.json`` (the processor pipelines, each step by its ``registry_name``),
and the statistics file each normalizer step names in its ``state_file`` (flat float32
``{feature}.{stat}`` tensors).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from vla_sched.model.config.checkpoint_spec import CheckpointError

CONFIG_FILE = 'config.json'
WEIGHTS_FILE = 'model.safetensors'
WEIGHTS_PREFIX = 'model.'
PREPROCESSOR_FILE = 'policy_preprocessor.json'
POSTPROCESSOR_FILE = 'policy_postprocessor.json'
STATE_KEY = 'observation.state'
ACTION_KEY = 'action'
# LeRobot's NormalizationMode values and the statistics each needs.
NORMALIZATION_STATS: Mapping[str, tuple[str, ...]] = {
    'IDENTITY': (),
    'MEAN_STD': ('mean', 'std'),
    'MIN_MAX': ('min', 'max'),
    'QUANTILES': ('q01', 'q99'),
    'QUANTILE10': ('q10', 'q90'),
}
STORED_DTYPES = ('F32', 'BF16', 'F16')


def read_json(path: Path, what: str) -> dict[str, Any]:
    """A JSON object file; a missing or malformed one is refused naming it (``what``: why
    the folder should hold it)."""
    if not path.is_file():
        raise CheckpointError(f'missing {path.name} in {path.parent}: {what}')
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise CheckpointError(f'{path.name} is not valid JSON: {exc}') from None
    if not isinstance(data, dict):
        raise CheckpointError(f'{path.name} must hold a JSON object')
    return data


def read_safetensors_header(path: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """``{name: (dtype, shape)}`` from a safetensors file's header (its data is not read)."""
    with open(path, 'rb') as f:
        length = int.from_bytes(f.read(8), 'little')
        if length <= 0 or length > 100_000_000:
            raise CheckpointError(f'{path} is not a safetensors file (header length {length})')
        header = json.loads(f.read(length))
    return {
        name: (entry['dtype'], tuple(entry['shape']))
        for name, entry in header.items()
        if name != '__metadata__'
    }


def check_weight_shapes(
    header: Mapping[str, tuple[str, tuple[int, ...]]],
    expected: Mapping[str, tuple[int, ...]],
    *,
    source: str,
    policy_type: str,
) -> None:
    """Refuse a weights header whose names or shapes are not ``expected`` (names unprefixed),
    naming the first tensor that disagrees and where the sizes came from."""
    stored = {
        n.removeprefix(WEIGHTS_PREFIX): v
        for n, v in header.items()
        if n.startswith(WEIGHTS_PREFIX)
    }
    for name, shape in expected.items():
        if name not in stored:
            raise CheckpointError(f'{WEIGHTS_FILE} lacks {WEIGHTS_PREFIX}{name} ({source})')
        dtype, found = stored[name]
        if found != shape:
            raise CheckpointError(
                f'{WEIGHTS_FILE} tensor {WEIGHTS_PREFIX}{name} has shape {list(found)} but the '
                f'sizes from {source} give {list(shape)}'
            )
        if dtype not in STORED_DTYPES:
            raise CheckpointError(f'{WEIGHTS_FILE} tensor {WEIGHTS_PREFIX}{name} is {dtype}')
    extra = sorted(set(header) - {WEIGHTS_PREFIX + n for n in expected})
    if extra:
        raise CheckpointError(
            f'{WEIGHTS_FILE} holds tensors a {policy_type} model does not have: {extra[:3]}'
        )


def feature_dim(features: Mapping[str, Any], key: str, kind: str, where: str) -> int:
    """The size of a one-dimensional ``kind`` feature of the config (``where``: which map)."""
    entry = features.get(key)
    if not isinstance(entry, Mapping) or entry.get('type') != kind:
        raise CheckpointError(f'{CONFIG_FILE} {where} has no {kind} feature {key!r}')
    shape = entry.get('shape')
    if not isinstance(shape, list) or len(shape) != 1 or not isinstance(shape[0], int):
        raise CheckpointError(f'{CONFIG_FILE} {where}[{key!r}] shape must be [dim], got {shape}')
    return shape[0]


def processor_step(
    pipeline: Mapping[str, Any], registry_name: str, file_name: str
) -> tuple[int, Mapping[str, Any]]:
    steps = pipeline.get('steps')
    if not isinstance(steps, list):
        raise CheckpointError(f'{file_name} has no steps list')
    found = [(i, s) for i, s in enumerate(steps) if s.get('registry_name') == registry_name]
    if len(found) != 1:
        raise CheckpointError(
            f'{file_name} must hold one {registry_name!r} step, found {len(found)}'
        )
    return found[0]


def read_statistics(
    folder: Path, step: Mapping[str, Any], file_name: str
) -> dict[str, dict[str, Any]]:
    """A normalizer step's statistics file as ``{feature: {stat: float32 array}}``."""
    import numpy as np
    from safetensors.numpy import load_file

    state_file = step.get('state_file')
    if not isinstance(state_file, str):
        raise CheckpointError(f'{file_name} {step["registry_name"]!r} names no state_file')
    path = folder / state_file
    if not path.is_file():
        raise CheckpointError(f'missing {state_file} in {folder}, which {file_name} names')
    stats: dict[str, dict[str, Any]] = {}
    for flat, values in load_file(str(path)).items():
        feature, _, stat = flat.rpartition('.')
        stats.setdefault(feature, {})[stat] = np.asarray(values, dtype=np.float32)
    return stats


def normalization_mode(norm_map: Mapping[str, Any], kind: str, file_name: str) -> str:
    mode = norm_map.get(kind, 'IDENTITY')
    if mode not in NORMALIZATION_STATS:
        raise CheckpointError(
            f'{file_name} normalizes {kind} with {mode!r}, not one of {list(NORMALIZATION_STATS)}'
        )
    return mode


def selected_statistics(
    stats: Mapping[str, Mapping[str, Any]], feature: str, mode: str, dim: int, file_name: str
) -> dict[str, Any]:
    selected = {}
    for stat in NORMALIZATION_STATS[mode]:
        values = stats.get(feature, {}).get(stat)
        if values is None:
            raise CheckpointError(f'{file_name} lacks {feature}.{stat}, which {mode} needs')
        if values.shape != (dim,):
            raise CheckpointError(
                f'{file_name} {feature}.{stat} has shape {list(values.shape)}, the feature [{dim}]'
            )
        selected[stat] = values
    return selected
