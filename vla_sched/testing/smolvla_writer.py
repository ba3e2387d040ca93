"""Writes a SmolVLA checkpoint folder as LeRobot's ``save_pretrained`` does, with seeded random
weights, and the tiny SmolVLM2-like VLM folder its sizes and tokenizer come from.

The policy folder holds what ``lerobot/smolvla_base`` holds: ``config.json`` (LeRobot's
``SmolVLAConfig`` fields, ``type`` ``smolvla``), ``model.safetensors`` under LeRobot's names
(``checkpoint.smolvla_weight_shapes``: the vision tower, the connector, the first
``num_vlm_layers`` text layers, the expert with its cross-attention ``k_proj`` / ``v_proj`` of
the VLM's K/V width, the state/action/time heads), and the processor pipelines
``policy_preprocessor.json`` / ``policy_postprocessor.json`` with their normalizer statistics,
as ``make_smolvla_pre_post_processors`` saves them (rename, batch, newline, tokenizer, device,
normalizer; unnormalizer, device). ``vlm=True`` also writes the VLM folder
(``smolvlm_files.write_smolvlm_folder``) into ``folder/vlm``: a real SmolVLA folder has none,
its user downloads it.

``weights_dtype='float32'`` stores everything in float32 for exact comparisons; ``'bfloat16'``
stores the matrices in bfloat16 as a ``dtype: bfloat16`` save does. The weights are random,
scaled so that activations stay O(1): the actions mean nothing.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vla_sched.model.families.smolvla.checkpoint import (
    CONNECTOR_NAME,
    EMBEDDING_NAME,
    WEIGHTS_PREFIX,
    SmolVLASizes,
    read_vlm_sizes,
    smolvla_weight_shapes,
)
from vla_sched.testing.pi0_writer import _features, _save_statistics, normalizer_statistics
from vla_sched.testing.smolvlm_files import TINY_SMOLVLM, TinySmolVLM, write_smolvlm_folder

DEFAULT_CAMERA_KEYS = ('observation.images.top', 'observation.images.wrist')
VLM_SUBFOLDER = 'vlm'
VLM_NAME = 'HuggingFaceTB/SmolVLM2-500M-Video-Instruct'
WEIGHTS_DTYPES = ('float32', 'bfloat16')
TINY_NUM_VLM_LAYERS = 4


def _random_weight(name: str, shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    """One random float32 weight scaled by its role."""
    noise = torch.randn(shape, generator=generator)
    if 'norm' in name and name.endswith('weight'):  # LayerNorm and Llama RMSNorm: w * x_hat
        return 1.0 + 0.1 * noise
    if name.endswith('bias'):
        return 0.1 * noise
    if name.endswith('position_embedding.weight'):
        return 0.5 * noise
    if name == EMBEDDING_NAME:  # scaled by sqrt(width) when used
        return noise / math.sqrt(shape[1])
    if name == CONNECTOR_NAME:  # image features are scaled by sqrt(width) too
        return noise / math.sqrt(shape[1] * shape[0])
    return noise / math.sqrt(math.prod(shape[1:]))


def smolvla_random_weights(
    sizes: SmolVLASizes,
    *,
    max_state_dim: int = 32,
    max_action_dim: int = 32,
    seed: int = 0,
    weights_dtype: str = 'float32',
) -> dict[str, torch.Tensor]:
    """Seeded random tensors under their stored names (with the ``model.`` prefix)."""
    if weights_dtype not in WEIGHTS_DTYPES:
        raise ValueError(f'weights_dtype must be one of {WEIGHTS_DTYPES}, got {weights_dtype!r}')
    generator = torch.Generator().manual_seed(seed)
    shapes = smolvla_weight_shapes(
        sizes, max_state_dim=max_state_dim, max_action_dim=max_action_dim
    )
    tensors = {}
    for name, shape in shapes.items():
        tensor = _random_weight(name, shape, generator)
        if weights_dtype == 'bfloat16' and len(shape) == 2:
            tensor = tensor.to(torch.bfloat16)
        tensors[WEIGHTS_PREFIX + name] = tensor.contiguous()
    return tensors


def smolvla_config(
    *,
    camera_keys: Sequence[str],
    state_dim: int,
    action_dim: int,
    chunk_size: int,
    n_action_steps: int,
    num_steps: int,
    image_size: int,
    num_vlm_layers: int,
    dtype: str,
) -> dict[str, Any]:
    """``config.json`` with LeRobot's ``SmolVLAConfig`` fields."""
    inputs, outputs = _features(camera_keys, image_size, state_dim, action_dim)
    return {
        'type': 'smolvla',
        'n_obs_steps': 1,
        'input_features': inputs,
        'output_features': outputs,
        'device': 'cuda',
        'use_amp': False,
        'push_to_hub': True,
        'repo_id': None,
        'private': None,
        'tags': None,
        'license': None,
        'pretrained_path': None,
        'dtype': dtype,
        'chunk_size': chunk_size,
        'n_action_steps': n_action_steps,
        'normalization_mapping': {'VISUAL': 'IDENTITY', 'STATE': 'MEAN_STD', 'ACTION': 'MEAN_STD'},
        'max_state_dim': 32,
        'max_action_dim': 32,
        'resize_imgs_with_padding': [image_size, image_size],
        'empty_cameras': 0,
        'adapt_to_pi_aloha': False,
        'use_delta_joint_actions_aloha': False,
        'tokenizer_max_length': 48,
        'num_steps': num_steps,
        'use_cache': True,
        'freeze_vision_encoder': True,
        'train_expert_only': True,
        'train_state_proj': True,
        'optimizer_lr': 0.0001,
        'optimizer_betas': [0.9, 0.95],
        'optimizer_eps': 1e-08,
        'optimizer_weight_decay': 1e-10,
        'optimizer_grad_clip_norm': 10,
        'scheduler_warmup_steps': 1000,
        'scheduler_decay_steps': 30000,
        'scheduler_decay_lr': 2.5e-06,
        'vlm_model_name': VLM_NAME,
        'load_vlm_weights': True,
        'add_image_special_tokens': False,
        'attention_mode': 'cross_attn',
        'prefix_length': -1,
        'pad_language_to': 'longest',
        'num_expert_layers': -1,
        'num_vlm_layers': num_vlm_layers,
        'self_attn_every_n_layers': 2,
        'expert_width_multiplier': 0.75,
        'min_period': 0.004,
        'max_period': 4.0,
        'rtc_config': None,
        'compile_model': False,
        'compile_mode': 'max-autotune',
    }


def processor_jsons(config: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``policy_preprocessor.json`` and ``policy_postprocessor.json`` as
    ``make_smolvla_pre_post_processors`` saves them."""
    features = {**config['input_features'], **config['output_features']}
    norm_map = dict(config['normalization_mapping'])
    steps: list[dict[str, Any]] = [
        {'registry_name': 'rename_observations_processor', 'config': {'rename_map': {}}},
        {'registry_name': 'to_batch_processor', 'config': {}},
        {'registry_name': 'smolvla_new_line_processor', 'config': {}},
        {
            'registry_name': 'tokenizer_processor',
            'config': {
                'max_length': config['tokenizer_max_length'],
                'task_key': 'task',
                'padding_side': 'right',
                'padding': config['pad_language_to'],
                'truncation': True,
                'tokenizer_name': config['vlm_model_name'],
            },
        },
        {'registry_name': 'device_processor', 'config': {'device': 'cuda', 'float_dtype': None}},
    ]
    index = len(steps)
    steps.append(
        {
            'registry_name': 'normalizer_processor',
            'config': {'eps': 1e-08, 'features': features, 'norm_map': norm_map},
            'state_file': f'policy_preprocessor_step_{index}_normalizer_processor.safetensors',
        }
    )
    post_steps = [
        {
            'registry_name': 'unnormalizer_processor',
            'config': {
                'eps': 1e-08,
                'features': dict(config['output_features']),
                'norm_map': norm_map,
            },
            'state_file': 'policy_postprocessor_step_0_unnormalizer_processor.safetensors',
        },
        {'registry_name': 'device_processor', 'config': {'device': 'cpu', 'float_dtype': None}},
    ]
    return (
        {'name': 'policy_preprocessor', 'steps': steps},
        {'name': 'policy_postprocessor', 'steps': post_steps},
    )


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=4) + '\n')


def write_smolvla_checkpoint(
    folder: str | Path,
    *,
    seed: int = 0,
    camera_keys: Sequence[str] = DEFAULT_CAMERA_KEYS,
    state_dim: int = 6,
    action_dim: int = 6,
    chunk_size: int = 4,
    n_action_steps: int = 4,
    num_steps: int = 3,
    num_vlm_layers: int = TINY_NUM_VLM_LAYERS,
    vlm_sizes: TinySmolVLM = TINY_SMOLVLM,
    weights_dtype: str = 'float32',
    vlm: bool = True,
) -> Path:
    """Write a SmolVLA folder into ``folder`` (and its VLM folder into ``folder/vlm``).

    Args:
        folder: Destination (created if needed); files of the same names are overwritten.
        seed: Seed of every weight and statistic (same seed, same bytes).
        camera_keys: The config's camera features, in order.
        state_dim: Size of ``observation.state`` (an SO-100 arm has 6).
        action_dim: Size of ``action``.
        chunk_size: Actions the model predicts per step.
        n_action_steps: Actions of a chunk a robot executes.
        num_steps: Euler steps of the flow.
        num_vlm_layers: The VLM text layers the policy keeps (of ``vlm_sizes.text_layers``).
        vlm_sizes: The VLM folder's sizes.
        weights_dtype: ``float32`` or ``bfloat16``.
        vlm: Also write the VLM folder (config and tokenizer) into ``folder/vlm``.

    Returns:
        The folder.
    """
    if n_action_steps > chunk_size:
        raise ValueError(f'n_action_steps {n_action_steps} exceeds chunk_size {chunk_size}')
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    vlm_folder = write_smolvlm_folder(folder / VLM_SUBFOLDER, vlm_sizes)
    config = smolvla_config(
        camera_keys=tuple(camera_keys),
        state_dim=state_dim,
        action_dim=action_dim,
        chunk_size=chunk_size,
        n_action_steps=n_action_steps,
        num_steps=num_steps,
        image_size=vlm_sizes.image_size,
        num_vlm_layers=num_vlm_layers,
        dtype=weights_dtype,
    )
    sizes = read_vlm_sizes(
        vlm_folder,
        num_vlm_layers=num_vlm_layers,
        expert_width_multiplier=config['expert_width_multiplier'],
        attention_mode=config['attention_mode'],
        self_attn_every_n_layers=config['self_attn_every_n_layers'],
        image_size=vlm_sizes.image_size,
    )
    if not vlm:
        for name in ('config.json', 'tokenizer.json', 'tokenizer_config.json',
                     'special_tokens_map.json'):  # fmt: skip
            (vlm_folder / name).unlink()
        vlm_folder.rmdir()
    _write_json(folder / 'config.json', config)
    tensors = smolvla_random_weights(
        sizes,
        max_state_dim=config['max_state_dim'],
        max_action_dim=config['max_action_dim'],
        seed=seed,
        weights_dtype=weights_dtype,
    )
    from safetensors.torch import save_file

    save_file(tensors, str(folder / 'model.safetensors'), metadata={'format': 'pt'})
    pre, post = processor_jsons(config)
    stats = normalizer_statistics(
        tuple(camera_keys), state_dim=state_dim, action_dim=action_dim, seed=seed
    )
    _save_statistics(folder, pre, stats)
    _save_statistics(folder, post, stats)
    _write_json(folder / 'policy_preprocessor.json', pre)
    _write_json(folder / 'policy_postprocessor.json', post)
    return folder


def statistics_of(folder: str | Path) -> dict[str, np.ndarray]:
    """The preprocessor's flat statistics of a written folder (for tests)."""
    from safetensors.numpy import load_file

    pre = json.loads((Path(folder) / 'policy_preprocessor.json').read_text())
    step = next(s for s in pre['steps'] if 'state_file' in s)
    return load_file(str(Path(folder) / step['state_file']))
