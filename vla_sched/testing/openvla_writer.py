"""Writes a checkpoint folder exactly as OpenVLA saves one, with seeded random weights.

The folder is what a user downloads for ``openvla/openvla-7b`` (``variant='fused'``: DINOv2
+ SigLIP towers) or ``openvla/openvla-v01-7b`` (``variant='v01'``: one SigLIP tower):
``config.json`` (``model_type: "openvla"``, ``text_config`` as a diff against transformers'
``LlamaConfig``, ``norm_stats``), ``model.safetensors`` or shards with
``model.safetensors.index.json``, a Llama-2-like ``tokenizer.json`` with ``<PAD>`` at 32000,
``tokenizer_config.json``, ``special_tokens_map.json``, ``preprocessor_config.json`` (as
OpenVLA's ``PrismaticImageProcessor`` saves it), ``generation_config.json`` and, on request,
``dataset_statistics.json`` instead of ``norm_stats``.

Tensor names and shapes are OpenVLA's: ``language_model.model.*`` and
``language_model.lm_head.weight`` (Llama), ``projector.fc1..fc3`` (fused) or ``fc1..fc2``
(v01), ``vision_backbone.featurizer.*`` and ``vision_backbone.fused_featurizer.*`` (timm
ViT state dicts, SigLIP with its unused ``attn_pool`` head). ``tiny=True`` keeps the names,
the vocabulary, the 224 px images and the 256 image tokens with tiny widths and depths
(``timm_model_args`` and small ``text_config`` dims); ``tiny=False`` has openvla-7b's real
shapes (about 15 GB in bfloat16: draw it on a GPU). The weights are random, so the actions
mean nothing; they are scaled so that activations and logits stay O(1).

The tokenizer files come from ``llama_tokenizer_files``.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

import torch

from vla_sched.model.config.architecture import DecoderSpec
from vla_sched.model.config.checkpoint_spec import CONFIG_FILE, PREPROCESSOR_FILE, TOKENIZER_FILE
from vla_sched.model.config.openvla import openvla_text_config
from vla_sched.model.config.openvla_towers import OpenVLAVisionSpec, TowerSpec, openvla_vision_spec
from vla_sched.model.config.presets import (
    OPENVLA_DATASET,
    OPENVLA_PAD_TOKEN_ID,
    OPENVLA_VARIANTS,
    openvla_config,
    openvla_norm_stats,
)
from vla_sched.model.loading.openvla_weights import openvla_projector_shapes, timm_tower_shapes
from vla_sched.model.loading.tiny_checkpoint import random_tensor, write_weights
from vla_sched.model.loading.weights import LM_HEAD, decoder_shapes
from vla_sched.testing.llama_tokenizer_files import (
    BOS_TOKEN_ID,
    EOS_TOKEN_ID,
    llama_like_tokenizer_json,
    special_tokens_map,
    tokenizer_config,
)

LANGUAGE_MODEL_PREFIX = 'language_model.model.'
LANGUAGE_MODEL_HEAD = 'language_model.lm_head.weight'
PROJECTOR_PREFIX = 'projector.'
TOWER_PREFIXES = ('vision_backbone.featurizer.', 'vision_backbone.fused_featurizer.')
STATISTICS_FILE = 'dataset_statistics.json'
ACTION_ROW_SCALE = 1.6


def _attn_pool_shapes(tower: TowerSpec) -> dict[str, tuple[int, ...]]:
    """timm's attention-pool head of a SigLIP tower: stored in OpenVLA folders, never used."""
    d, m = tower.embed_dim, tower.mlp_hidden
    shapes: dict[str, tuple[int, ...]] = {'attn_pool.latent': (1, 1, d)}
    layers = (('q', d, d), ('kv', 2 * d, d), ('proj', d, d), ('mlp.fc1', m, d), ('mlp.fc2', d, m))
    for name, n_out, n_in in layers:
        shapes[f'attn_pool.{name}.weight'] = (n_out, n_in)
        shapes[f'attn_pool.{name}.bias'] = (n_out,)
    shapes.update({'attn_pool.norm.weight': (d,), 'attn_pool.norm.bias': (d,)})
    return shapes


def _tower_shapes(tower: TowerSpec) -> dict[str, tuple[int, ...]]:
    """timm names and shapes of one ViT tower as a folder stores it (SigLIP with its head)."""
    shapes = timm_tower_shapes(tower)
    if tower.kind == 'siglip':
        shapes.update(_attn_pool_shapes(tower))
    return shapes


def openvla_tensor_shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Every tensor name of an OpenVLA checkpoint with its shape, from its ``config.json``."""
    decoder = DecoderSpec.from_hf_config(openvla_text_config(config))
    vision = openvla_vision_spec(config, text_hidden_size=decoder.hidden_size)
    shapes: dict[str, tuple[int, ...]] = {}
    for name, shape in decoder_shapes(decoder).items():
        shapes[LANGUAGE_MODEL_HEAD if name == LM_HEAD else LANGUAGE_MODEL_PREFIX + name] = shape
    shapes.update({PROJECTOR_PREFIX + n: s for n, s in openvla_projector_shapes(vision).items()})
    for prefix, tower in zip(TOWER_PREFIXES, vision.towers, strict=False):
        shapes.update({prefix + n: s for n, s in _tower_shapes(tower).items()})
    return shapes


_NORM_WEIGHT = re.compile(r'norm\d?\.weight$')


def _random_openvla_tensor(
    name: str, shape: tuple[int, ...], generator: torch.Generator, dtype: torch.dtype
) -> torch.Tensor:
    """One random weight scaled by its role (timm roles here, the rest as the LLaVA writer)."""
    factory = {'generator': generator, 'device': generator.device, 'dtype': dtype}
    if _NORM_WEIGHT.search(name):
        return 1.0 + 0.1 * torch.randn(shape, **factory)
    if name.endswith('scale_factor'):  # LayerScale
        return 0.5 + 0.1 * torch.randn(shape, **factory)
    if name.endswith(('cls_token', 'reg_token', 'pos_embed', 'latent')):
        return 0.5 * torch.randn(shape, **factory)
    return random_tensor(name, shape, generator, dtype=dtype)


def openvla_state_dict(
    config: dict[str, Any],
    *,
    seed: int = 0,
    device: torch.device | str = 'cpu',
    dtype: torch.dtype = torch.float32,
) -> dict[str, torch.Tensor]:
    """Seeded random weights under OpenVLA's tensor names (same seed, same values).

    The LM head's rows of the action tokens are drawn ``ACTION_ROW_SCALE`` times larger, so
    that greedy decoding over the whole vocabulary mostly picks action tokens (as a trained
    OpenVLA does) while other ids still come up now and then (clipped into the bins).
    """
    generator = torch.Generator(device=device).manual_seed(seed)
    tensors = {
        name: _random_openvla_tensor(name, shape, generator, dtype)
        for name, shape in openvla_tensor_shapes(config).items()
    }
    vocab_end = int(config['text_config']['vocab_size']) - int(config['pad_to_multiple_of'])
    action_rows = slice(vocab_end - int(config['n_action_bins']), vocab_end)
    tensors[LANGUAGE_MODEL_HEAD][action_rows] *= ACTION_ROW_SCALE
    return tensors


def _preprocessor_config(vision: OpenVLAVisionSpec) -> dict[str, Any]:
    """``preprocessor_config.json`` as OpenVLA's ``PrismaticImageProcessor`` saves it."""
    size = vision.image_size
    k = len(vision.towers)
    means = [list(t.mean) for t in vision.towers]
    stds = [list(t.std) for t in vision.towers]
    resize = {'antialias': True, 'interpolation': 3, 'max_size': None, 'size': [size, size]}
    return {
        'auto_map': {
            'AutoImageProcessor': 'processing_prismatic.PrismaticImageProcessor',
            'AutoProcessor': 'processing_prismatic.PrismaticProcessor',
        },
        'image_processor_type': 'PrismaticImageProcessor',
        'processor_class': 'PrismaticProcessor',
        'use_fused_vision_backbone': vision.fused,
        'image_resize_strategy': vision.image_resize_strategy,
        'input_sizes': [[3, size, size]] * k,
        'interpolations': ['bicubic'] * k,
        'means': means,
        'stds': stds,
        'tvf_resize_params': [dict(resize) for _ in range(k)],
        'tvf_crop_params': [{'output_size': [size, size]} for _ in range(k)],
        'tvf_normalize_params': [
            {'inplace': False, 'mean': m, 'std': s} for m, s in zip(means, stds, strict=True)
        ],
        'tvf_do_letterbox': False,
        'tvf_letterbox_fill': None,
    }


def _generation_config() -> dict[str, Any]:
    return {
        '_from_model_config': True,
        'bos_token_id': BOS_TOKEN_ID,
        'eos_token_id': EOS_TOKEN_ID,
        'pad_token_id': OPENVLA_PAD_TOKEN_ID,
    }


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + '\n')


_DTYPE_NAMES = {torch.float32: 'float32', torch.bfloat16: 'bfloat16', torch.float16: 'float16'}


def write_openvla_checkpoint(
    folder: str | Path,
    *,
    variant: str = 'fused',
    tiny: bool = True,
    seed: int = 0,
    num_shards: int = 1,
    datasets: tuple[str, ...] = (OPENVLA_DATASET,),
    statistics_file: bool = False,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = 'cpu',
) -> Path:
    """Write an OpenVLA-format checkpoint into ``folder`` (created if needed).

    Args:
        folder: Destination; files of the same names are overwritten.
        variant: ``fused`` (openvla-7b: DINOv2 + SigLIP) or ``v01`` (one SigLIP tower).
        tiny: Tiny widths and depths; False writes openvla-7b's real shapes (7.5 B
            parameters: bfloat16 on a GPU ``device``, never in unit tests).
        seed: Seed of the weights (same seed, same bytes).
        num_shards: One ``model.safetensors``, or this many shards with an index.
        datasets: Dataset names of the action statistics (an ``unnorm_key`` picks one).
        statistics_file: Put the statistics in ``dataset_statistics.json`` (as fine-tunes
            ship them) instead of ``norm_stats`` in ``config.json``.
        dtype: Weights dtype on disk.
        device: Where the random weights are drawn.

    Returns:
        The folder.
    """
    if dtype not in _DTYPE_NAMES:
        raise ValueError(f'dtype must be one of {list(_DTYPE_NAMES)}, got {dtype}')
    if num_shards < 1:
        raise ValueError(f'num_shards must be >= 1, got {num_shards}')
    if not datasets:
        raise ValueError('datasets must name at least one dataset')
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    stats = openvla_norm_stats(tuple(datasets))
    config = openvla_config(variant, tiny=tiny, norm_stats=None if statistics_file else stats)
    config['torch_dtype'] = _DTYPE_NAMES[dtype]
    _write_json(folder / CONFIG_FILE, config)
    if statistics_file:
        _write_json(folder / STATISTICS_FILE, stats)
    text = openvla_text_config(config)
    vision = openvla_vision_spec(config, text_hidden_size=int(text['hidden_size']))
    _write_json(folder / PREPROCESSOR_FILE, _preprocessor_config(vision))
    _write_json(folder / 'generation_config.json', _generation_config())
    _write_json(folder / 'tokenizer_config.json', tokenizer_config())
    _write_json(folder / 'special_tokens_map.json', special_tokens_map())
    (folder / TOKENIZER_FILE).write_text(llama_like_tokenizer_json())
    tensors = openvla_state_dict(config, seed=seed, device=device, dtype=dtype)
    write_weights(folder, {k: v.cpu() for k, v in tensors.items()}, num_shards=num_shards)
    return folder


def main(argv: list[str] | None = None) -> int:
    """Write a tiny OpenVLA-format checkpoint (random weights) from the command line."""
    parser = argparse.ArgumentParser(
        description='Write a tiny OpenVLA-format checkpoint with random weights (its actions '
        'are meaningless): the real file and tensor names, tiny widths and depths.'
    )
    parser.add_argument('folder', help='where to write it')
    parser.add_argument('--variant', choices=list(OPENVLA_VARIANTS), default='fused')
    parser.add_argument(
        '--datasets',
        nargs='+',
        default=[OPENVLA_DATASET],
        help='dataset names of the action statistics (unnorm_key picks one)',
    )
    parser.add_argument('--seed', type=int, default=0)
    args = parser.parse_args(argv)
    folder = write_openvla_checkpoint(
        args.folder, variant=args.variant, datasets=tuple(args.datasets), seed=args.seed
    )
    print(f'openvla_writer: wrote a tiny {args.variant} OpenVLA-format checkpoint to {folder}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
