"""Builds a tiny random VLA checkpoint folder offline, deterministically, in well under 2 s.

The folder is a real LLaVA checkpoint (transformers' ``LlavaForConditionalGeneration`` loads
it): ``config.json``, ``model.safetensors`` (or shards plus an index), a byte-level
``tokenizer.json`` with OpenVLA-style action tokens, ``tokenizer_config.json``,
``preprocessor_config.json``, ``dataset_statistics.json`` and ``vla_config.json``. Its
actions are meaningless: the weights are random. Weights are drawn with a seeded generator
at a scale that keeps activations and logits O(1), so numerical comparisons mean something.

Tokenizer ids: 0-3 ``<pad> <s> </s> <unk>``, 4-259 the 256 byte symbols, 260-515 the action
tokens (OpenVLA counts them down from 516), 516 ``<image>``; the model's embedding is padded
to 520 rows.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch

from vla_sched.model.config.architecture import DecoderSpec, VisionSpec
from vla_sched.model.config.checkpoint_spec import (
    CONFIG_FILE,
    PREPROCESSOR_FILE,
    TOKENIZER_FILE,
    VLA_CONFIG_FILE,
    CheckpointSpec,
)
from vla_sched.model.config.formats import parse_architecture
from vla_sched.model.config.presets import (
    TINY_IMAGE_TOKEN_ID,
    TINY_VOCAB_END,
    tiny_llava_config,
    tiny_statistics,
    tiny_vla_config,
)
from vla_sched.model.loading.vla_model import VLAModel, assemble_model
from vla_sched.model.loading.weights import (
    DECODER_PREFIX,
    LM_HEAD,
    PROJECTOR_PREFIX,
    TOWER_PREFIX,
    decoder_shapes,
    projector_shapes,
    siglip_tower_shapes,
)

SPECIAL_TOKENS = ('<pad>', '<s>', '</s>', '<unk>')


def random_tensor(
    name: str,
    shape: tuple[int, ...],
    generator: torch.Generator,
    *,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """One random weight, scaled by its role, on the generator's device."""
    factory = {'generator': generator, 'device': generator.device, 'dtype': dtype}
    if name.endswith('norm.weight') or ('layer_norm' in name and name.endswith('weight')):
        return 1.0 + 0.1 * torch.randn(shape, **factory)
    if name.endswith('bias'):
        return 0.1 * torch.randn(shape, **factory)
    if name.endswith(('embed_tokens.weight', 'position_embedding.weight')):
        return 0.5 * torch.randn(shape, **factory)
    fan_in = math.prod(shape[1:])
    return torch.randn(shape, **factory) / math.sqrt(fan_in)


def random_state_dict(
    decoder: DecoderSpec,
    vision: VisionSpec | None,
    *,
    seed: int = 0,
    device: torch.device | str = 'cpu',
    dtype: torch.dtype = torch.float32,
) -> dict[str, torch.Tensor]:
    """Seeded random weights (canonical names) for a decoder and optional SigLIP tower."""
    names: dict[str, tuple[int, ...]] = {}
    for name, shape in decoder_shapes(decoder).items():
        names[name if name == LM_HEAD else DECODER_PREFIX + name] = shape
    if vision is not None:
        if vision.model_type != 'siglip_vision_model':
            raise ValueError('random weights are made for SigLIP towers only')
        names.update({PROJECTOR_PREFIX + n: s for n, s in projector_shapes(vision).items()})
        names.update({TOWER_PREFIX + n: s for n, s in siglip_tower_shapes(vision).items()})
    generator = torch.Generator(device=device).manual_seed(seed)
    return {
        name: random_tensor(name, shape, generator, dtype=dtype) for name, shape in names.items()
    }


def tiny_state_dict(config: dict[str, Any], *, seed: int = 0) -> dict[str, torch.Tensor]:
    """Seeded random weights for a LLaVA ``config.json`` with a SigLIP tower (canonical names)."""
    decoder, vision = parse_architecture(config)
    if vision is None:
        raise ValueError('the tiny builder makes LLaVA checkpoints with a vision tower')
    return random_state_dict(decoder, vision, seed=seed)


def random_model(
    spec: CheckpointSpec,
    *,
    device: torch.device | str = 'cpu',
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
) -> VLAModel:
    """A model with seeded random weights for a spec, e.g. ``preset_spec('openvla-7b')``.

    The weights are drawn on ``device`` (fast on a GPU even at 7B) and never written to
    disk; the actions such a model produces are meaningless.
    """
    tensors = random_state_dict(spec.decoder, spec.vision, seed=seed, device=device, dtype=dtype)
    return assemble_model(
        spec,
        list(tensors),
        shape_of=lambda name: tuple(tensors[name].shape),
        read=tensors.__getitem__,
        device=device,
        dtype=dtype,
    )


def tiny_tokenizer_json() -> str:
    """A byte-level BPE tokenizer (no merges) with action tokens and ``<image>``."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
    for symbol in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab[symbol] = len(vocab)
    for i in range(TINY_VOCAB_END - len(vocab)):
        vocab[f'<action_{i}>'] = len(vocab)
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token='<unk>'))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    specials = [AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS]
    tokenizer.add_special_tokens([*specials, AddedToken('<image>', special=True)])
    if tokenizer.token_to_id('<image>') != TINY_IMAGE_TOKEN_ID:
        raise RuntimeError('the tiny tokenizer put <image> at an unexpected id')
    return tokenizer.to_str()


def _tokenizer_config() -> dict[str, Any]:
    return {
        'tokenizer_class': 'PreTrainedTokenizerFast',
        'bos_token': '<s>',
        'eos_token': '</s>',
        'unk_token': '<unk>',
        'pad_token': '<pad>',
        'extra_special_tokens': {'image_token': '<image>'},
        'model_max_length': 512,
        'add_bos_token': False,
        'add_eos_token': False,
    }


def _preprocessor_config(image_size: int) -> dict[str, Any]:
    return {
        'image_processor_type': 'SiglipImageProcessor',
        'do_resize': True,
        'size': {'height': image_size, 'width': image_size},
        'resample': 3,
        'do_rescale': True,
        'rescale_factor': 1 / 255,
        'do_normalize': True,
        'image_mean': [0.5, 0.5, 0.5],
        'image_std': [0.5, 0.5, 0.5],
    }


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + '\n')


def write_weights(folder: Path, tensors: dict[str, torch.Tensor], *, num_shards: int = 1) -> None:
    """Write tensors as ``model.safetensors`` or as shards with an index."""
    from safetensors.torch import save_file

    if num_shards == 1:
        save_file(tensors, str(folder / 'model.safetensors'), metadata={'format': 'pt'})
        return
    names = sorted(tensors)
    weight_map = {}
    for shard in range(num_shards):
        file_name = f'model-{shard + 1:05d}-of-{num_shards:05d}.safetensors'
        part = {name: tensors[name] for name in names[shard::num_shards]}
        save_file(part, str(folder / file_name), metadata={'format': 'pt'})
        weight_map.update(dict.fromkeys(part, file_name))
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {'metadata': {'total_size': total}, 'weight_map': weight_map}
    _write_json(folder / 'model.safetensors.index.json', index)


def build_tiny_checkpoint(
    folder: str | Path,
    *,
    seed: int = 0,
    text_model_type: str = 'llama',
    rope_parameters: dict[str, Any] | None = None,
    tie_word_embeddings: bool = False,
    action_horizon: int = 1,
    num_shards: int = 1,
) -> Path:
    """Write a tiny random LLaVA-layout VLA checkpoint into ``folder`` (created if needed).

    Args:
        folder: Destination; existing files of the same names are overwritten.
        seed: Seed of the weights (same seed, same bytes).
        text_model_type: ``llama`` or ``qwen2`` (attention biases).
        rope_parameters: Overrides of the RoPE parameters, e.g. a ``llama3`` scaling.
        tie_word_embeddings: Share the embedding with the LM head (no ``lm_head.weight``).
        action_horizon: Actions per chunk H (each of 7 dof).
        num_shards: Split the weights over this many safetensors shards.

    Returns:
        The folder.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = tiny_llava_config(
        text_model_type=text_model_type,
        rope_parameters=rope_parameters,
        tie_word_embeddings=tie_word_embeddings,
    )
    _write_json(folder / CONFIG_FILE, config)
    _write_json(folder / VLA_CONFIG_FILE, tiny_vla_config(action_horizon=action_horizon))
    _write_json(folder / 'dataset_statistics.json', tiny_statistics())
    _write_json(
        folder / PREPROCESSOR_FILE, _preprocessor_config(config['vision_config']['image_size'])
    )
    _write_json(folder / 'tokenizer_config.json', _tokenizer_config())
    (folder / TOKENIZER_FILE).write_text(tiny_tokenizer_json())
    write_weights(folder, tiny_state_dict(config, seed=seed), num_shards=num_shards)
    return folder
