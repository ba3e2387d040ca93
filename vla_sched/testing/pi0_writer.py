"""Writes a pi0 / pi0.5 checkpoint folder as LeRobot's ``save_pretrained`` does, with seeded
random weights.

The folder holds what ``lerobot/pi0_base`` or ``lerobot/pi05_libero`` hold: ``config.json``
(LeRobot's policy config, ``type`` ``pi0`` or ``pi05``), ``model.safetensors`` under LeRobot's
names (``checkpoint.pi0_weight_shapes``; the tied token embedding stored once as
``paligemma.lm_head.weight``, the metadata naming the dropped ``embed_tokens``), and the
processor pipelines ``policy_preprocessor.json`` / ``policy_postprocessor.json`` with their
normalizer statistics (``policy_preprocessor_step_<i>_normalizer_processor.safetensors``,
``policy_postprocessor_step_0_unnormalizer_processor.safetensors``: flat float32
``{feature}.{mean,std,min,max,q01,q99}``). Sizes other than the real variants' are declared in
``model_sizes.json`` (the one mechanism ``checkpoint.py`` reads). A real folder has no
tokenizer; ``tokenizer=True`` adds the tiny PaliGemma-like one (``paligemma_tokenizer_files``)
into a ``tokenizer/`` subfolder.

``weights_dtype='mixed'`` stores what LeRobot stores under ``dtype: bfloat16``: Gemma's and the
expert's projections and embeddings in bfloat16, the SigLIP tower, the projector, every norm and
the action/state/time projections in float32; ``'float32'`` stores everything in float32
(``dtype: float32``) for exact comparisons. The weights are random, scaled so that activations
stay O(1): the actions mean nothing.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vla_sched.model.config.lerobot_policy import WEIGHTS_PREFIX
from vla_sched.model.families.pi0.checkpoint import (
    EMBEDDING_NAME,
    GEMMA_VARIANTS,
    LANGUAGE_PREFIX,
    PALIGEMMA_VOCAB_SIZE,
    SIGLIP_SO400M_224,
    TINY_PI0_SIZES,
    Pi0Sizes,
    is_bf16_weight,
    pi0_weight_shapes,
)
from vla_sched.testing.paligemma_tokenizer_files import write_paligemma_tokenizer

DEFAULT_CAMERA_KEYS = ('observation.images.image', 'observation.images.image2')
STATE_KEY = 'observation.state'
ACTION_KEY = 'action'
TOKENIZER_NAME = 'google/paligemma-3b-pt-224'
WEIGHTS_DTYPES = ('float32', 'mixed')
TOKENIZER_MAX_LENGTH = {'pi0': 48, 'pi05': 200}
NORMALIZATION = {'pi0': 'MEAN_STD', 'pi05': 'QUANTILES'}
TOKENIZER_SUBFOLDER = 'tokenizer'


def _variant_of(sizes: Pi0Sizes) -> tuple[str, str] | None:
    """The variant names when ``sizes`` are the real ones (any image size), else None."""
    names = {size: name for name, size in GEMMA_VARIANTS.items()}
    real_vision = sizes.vision == replace(SIGLIP_SO400M_224, image_size=sizes.vision.image_size)
    if (
        sizes.paligemma in names
        and sizes.expert in names
        and real_vision
        and sizes.vocab_size == PALIGEMMA_VOCAB_SIZE
    ):
        return names[sizes.paligemma], names[sizes.expert]
    return None


def _size_dict(size: Any) -> dict[str, int]:
    return {name: getattr(size, name) for name in size.__slots__}


def model_sizes_json(sizes: Pi0Sizes) -> dict[str, Any]:
    """``model_sizes.json``: the sizes a folder of non-variant sizes declares."""
    return {
        'paligemma': _size_dict(sizes.paligemma),
        'action_expert': _size_dict(sizes.expert),
        'vision': _size_dict(sizes.vision),
        'vocab_size': sizes.vocab_size,
    }


def _random_weight(name: str, shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    """One random weight scaled by its role (float32, on the generator's device)."""
    kw = {'generator': generator, 'device': generator.device}
    noise = torch.randn(shape, **kw)
    if 'vision_tower' in name and ('layer_norm' in name or 'post_layernorm' in name):
        return noise * 0.1 + (1.0 if name.endswith('weight') else 0.0)  # LayerNorm w * x_hat
    if name.endswith('.dense.bias'):  # adaRMS scale, shift, gate: the gate near 1
        third = shape[0] // 3
        return 0.1 * noise + torch.cat(
            [
                torch.zeros(2 * third, device=generator.device),
                torch.ones(third, device=generator.device),
            ]
        )
    if name.endswith('.dense.weight'):
        return 0.3 * noise / math.sqrt(shape[1])
    if name.endswith('norm.weight'):  # Gemma RMSNorm: x_hat * (1 + w)
        return 0.1 * noise
    if name.endswith('bias'):
        return 0.1 * noise
    if name.endswith('position_embedding.weight'):
        return 0.5 * noise
    if name.endswith('lm_head.weight'):  # the embedding, scaled by sqrt(width) when used
        return noise / math.sqrt(shape[1])
    return noise / math.sqrt(math.prod(shape[1:]))


def pi0_random_weights(
    policy_type: str,
    sizes: Pi0Sizes,
    *,
    max_state_dim: int = 32,
    max_action_dim: int = 32,
    seed: int = 0,
    weights_dtype: str = 'mixed',
    device: torch.device | str = 'cpu',
) -> dict[str, torch.Tensor]:
    """Seeded random tensors under their stored names (with the ``model.`` prefix)."""
    if weights_dtype not in WEIGHTS_DTYPES:
        raise ValueError(f'weights_dtype must be one of {WEIGHTS_DTYPES}, got {weights_dtype!r}')
    generator = torch.Generator(device=device).manual_seed(seed)
    shapes = pi0_weight_shapes(
        policy_type, sizes, max_state_dim=max_state_dim, max_action_dim=max_action_dim
    )
    tensors = {}
    for name, shape in shapes.items():
        tensor = _random_weight(name, shape, generator)
        if weights_dtype == 'mixed' and is_bf16_weight(name):
            tensor = tensor.to(torch.bfloat16)
        tensors[WEIGHTS_PREFIX + name] = tensor.contiguous()
    return tensors


def _feature_statistics(dim: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    mean = rng.normal(0.0, 0.5, dim)
    std = rng.uniform(0.2, 1.0, dim)
    return {
        'mean': mean,
        'std': std,
        'min': mean - 3.0 * std,
        'max': mean + 3.0 * std,
        'q01': mean - 2.0 * std,
        'q99': mean + 2.5 * std,
    }


def normalizer_statistics(
    camera_keys: Sequence[str], *, state_dim: int, action_dim: int, seed: int = 0
) -> dict[str, np.ndarray]:
    """The normalizer's flat float32 state: ``{feature}.{stat}``; cameras get [3, 1, 1]
    statistics as a dataset's ``compute_stats`` gives them (unused: visual is IDENTITY)."""
    rng = np.random.default_rng(seed + 7)
    flat: dict[str, np.ndarray] = {}
    for key in camera_keys:
        for stat, values in _feature_statistics(3, rng).items():
            flat[f'{key}.{stat}'] = np.clip(values, 0.0, 1.0).reshape(3, 1, 1)
    for key, dim in ((STATE_KEY, state_dim), (ACTION_KEY, action_dim)):
        for stat, values in _feature_statistics(dim, rng).items():
            flat[f'{key}.{stat}'] = values
    return {name: np.ascontiguousarray(v, dtype=np.float32) for name, v in flat.items()}


def _features(
    camera_keys: Sequence[str], image_size: int, state_dim: int, action_dim: int
) -> tuple[dict[str, Any], dict[str, Any]]:
    inputs: dict[str, Any] = {
        key: {'type': 'VISUAL', 'shape': [3, image_size, image_size]} for key in camera_keys
    }
    inputs[STATE_KEY] = {'type': 'STATE', 'shape': [state_dim]}
    return inputs, {ACTION_KEY: {'type': 'ACTION', 'shape': [action_dim]}}


def pi0_config(
    policy_type: str,
    *,
    camera_keys: Sequence[str],
    state_dim: int,
    action_dim: int,
    chunk_size: int,
    n_action_steps: int,
    num_inference_steps: int,
    image_size: int,
    variants: tuple[str, str],
    dtype: str,
) -> dict[str, Any]:
    """``config.json`` with LeRobot's PI0Config / PI05Config fields."""
    inputs, outputs = _features(camera_keys, image_size, state_dim, action_dim)
    mode = NORMALIZATION[policy_type]
    return {
        'type': policy_type,
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
        'paligemma_variant': variants[0],
        'action_expert_variant': variants[1],
        'dtype': dtype,
        'chunk_size': chunk_size,
        'n_action_steps': n_action_steps,
        'max_state_dim': 32,
        'max_action_dim': 32,
        'num_inference_steps': num_inference_steps,
        'time_sampling_beta_alpha': 1.5,
        'time_sampling_beta_beta': 1.0,
        'time_sampling_scale': 0.999,
        'time_sampling_offset': 0.001,
        'min_period': 0.004,
        'max_period': 4.0,
        'rtc_config': None,
        'image_resolution': [image_size, image_size],
        'empty_cameras': 0,
        'tokenizer_max_length': TOKENIZER_MAX_LENGTH[policy_type],
        'normalization_mapping': {'VISUAL': 'IDENTITY', 'STATE': mode, 'ACTION': mode},
        'gradient_checkpointing': False,
        'compile_model': False,
        'compile_mode': 'max-autotune',
        'freeze_vision_encoder': False,
        'train_expert_only': False,
        'optimizer_lr': 2.5e-05,
        'optimizer_betas': [0.9, 0.95],
        'optimizer_eps': 1e-08,
        'optimizer_weight_decay': 0.01,
        'optimizer_grad_clip_norm': 1.0,
        'scheduler_warmup_steps': 1000,
        'scheduler_decay_steps': 30000,
        'scheduler_decay_lr': 2.5e-06,
    }


def _normalizer_config(features: dict[str, Any], mode: str) -> dict[str, Any]:
    return {
        'eps': 1e-08,
        'features': features,
        'norm_map': {'VISUAL': 'IDENTITY', 'STATE': mode, 'ACTION': mode},
    }


def processor_jsons(config: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``policy_preprocessor.json`` and ``policy_postprocessor.json`` as
    ``make_pi0_pre_post_processors`` / ``make_pi05_pre_post_processors`` save them (the
    normalizer before the state prompt step for pi0.5, last for pi0)."""
    policy_type = config['type']
    mode = NORMALIZATION[policy_type]
    features = {**config['input_features'], **config['output_features']}
    tokenizer_step = {
        'registry_name': 'tokenizer_processor',
        'config': {
            'max_length': config['tokenizer_max_length'],
            'task_key': 'task',
            'padding_side': 'right',
            'padding': 'max_length',
            'truncation': True,
            'tokenizer_name': TOKENIZER_NAME,
        },
    }
    normalizer = {
        'registry_name': 'normalizer_processor',
        'config': _normalizer_config(features, mode),
    }
    device = {
        'registry_name': 'device_processor',
        'config': {'device': 'cuda', 'float_dtype': None},
    }
    steps: list[dict[str, Any]] = [
        {'registry_name': 'rename_observations_processor', 'config': {'rename_map': {}}},
        {'registry_name': 'to_batch_processor', 'config': {}},
    ]
    if policy_type == 'pi0':
        steps += [
            {'registry_name': 'pi0_new_line_processor', 'config': {}},
            tokenizer_step,
            device,
            normalizer,
        ]
    else:
        steps += [
            normalizer,
            {
                'registry_name': 'pi05_prepare_state_tokenizer_processor_step',
                'config': {'max_state_dim': config['max_state_dim'], 'task_key': 'task'},
            },
            tokenizer_step,
            device,
        ]
    index = steps.index(normalizer)
    normalizer['state_file'] = f'policy_preprocessor_step_{index}_normalizer_processor.safetensors'
    unnormalizer = {
        'registry_name': 'unnormalizer_processor',
        'config': _normalizer_config(dict(config['output_features']), mode),
        'state_file': 'policy_postprocessor_step_0_unnormalizer_processor.safetensors',
    }
    post_device = {
        'registry_name': 'device_processor',
        'config': {'device': 'cpu', 'float_dtype': None},
    }
    pre = {'name': 'policy_preprocessor', 'steps': steps}
    post = {'name': 'policy_postprocessor', 'steps': [unnormalizer, post_device]}
    return pre, post


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=4) + '\n')


def write_pi0_checkpoint(
    folder: str | Path,
    *,
    policy_type: str = 'pi0',
    seed: int = 0,
    camera_keys: Sequence[str] = DEFAULT_CAMERA_KEYS,
    state_dim: int = 8,
    action_dim: int = 7,
    chunk_size: int = 4,
    n_action_steps: int = 4,
    num_inference_steps: int = 3,
    sizes: Pi0Sizes = TINY_PI0_SIZES,
    weights_dtype: str = 'mixed',
    tokenizer: bool = False,
    device: torch.device | str = 'cpu',
) -> Path:
    """Write a pi0 (``policy_type='pi0'``) or pi0.5 (``'pi05'``) folder into ``folder``.

    Args:
        folder: Destination (created if needed); files of the same names are overwritten.
        policy_type: ``pi0`` or ``pi05``.
        seed: Seed of every weight and statistic (same seed, same bytes).
        camera_keys: The config's camera features, in order.
        state_dim: Size of ``observation.state``.
        action_dim: Size of ``action``.
        chunk_size: Actions the model predicts per step.
        n_action_steps: Actions of a chunk a robot executes.
        num_inference_steps: Euler steps of the flow.
        sizes: The weights' sizes; ``image_resolution`` is ``sizes.vision.image_size``.
        weights_dtype: ``mixed`` (LeRobot's bfloat16 folders) or ``float32``.
        tokenizer: Also write the tiny tokenizer into ``folder/tokenizer``.
        device: Where the random weights are drawn (a GPU for real sizes).

    Returns:
        The folder.
    """
    if policy_type not in NORMALIZATION:
        raise ValueError(f'policy_type must be pi0 or pi05, got {policy_type!r}')
    if n_action_steps > chunk_size:
        raise ValueError(f'n_action_steps {n_action_steps} exceeds chunk_size {chunk_size}')
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    variants = _variant_of(sizes)
    config = pi0_config(
        policy_type,
        camera_keys=tuple(camera_keys),
        state_dim=state_dim,
        action_dim=action_dim,
        chunk_size=chunk_size,
        n_action_steps=n_action_steps,
        num_inference_steps=num_inference_steps,
        image_size=sizes.vision.image_size,
        variants=variants or ('gemma_2b', 'gemma_300m'),
        dtype='bfloat16' if weights_dtype == 'mixed' else 'float32',
    )
    _write_json(folder / 'config.json', config)
    sizes_file = folder / 'model_sizes.json'
    if variants is None:
        _write_json(sizes_file, model_sizes_json(sizes))
    elif sizes_file.exists():
        sizes_file.unlink()
    tensors = pi0_random_weights(
        policy_type,
        sizes,
        max_state_dim=config['max_state_dim'],
        max_action_dim=config['max_action_dim'],
        seed=seed,
        weights_dtype=weights_dtype,
        device=device,
    )
    _save_weights(folder / 'model.safetensors', tensors)
    pre, post = processor_jsons(config)
    stats = normalizer_statistics(
        tuple(camera_keys), state_dim=state_dim, action_dim=action_dim, seed=seed
    )
    _save_statistics(folder, pre, stats)
    _save_statistics(folder, post, stats)
    _write_json(folder / 'policy_preprocessor.json', pre)
    _write_json(folder / 'policy_postprocessor.json', post)
    if tokenizer:
        write_paligemma_tokenizer(folder / TOKENIZER_SUBFOLDER, vocab_size=sizes.vocab_size)
    return folder


def _save_weights(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    """As ``safetensors.torch.save_model`` saves a model with tied weights: the shared
    embedding once, the metadata naming the dropped name after the kept one."""
    from safetensors.torch import save_file

    dropped = WEIGHTS_PREFIX + LANGUAGE_PREFIX + 'embed_tokens.weight'
    metadata = {'format': 'pt', dropped: WEIGHTS_PREFIX + EMBEDDING_NAME}
    save_file({k: t.cpu() for k, t in tensors.items()}, str(path), metadata=metadata)


def _save_statistics(folder: Path, pipeline: dict[str, Any], stats: dict[str, np.ndarray]) -> None:
    from safetensors.numpy import save_file

    for step in pipeline['steps']:
        if 'state_file' in step:
            save_file(dict(stats), str(folder / step['state_file']))
