"""Write an OpenVLA-7B-shaped checkpoint folder with random weights, for serving benchmarks.

The serving nodes load checkpoints from folders (the engine and the baseline run in their own
processes), so the ``openvla-7b`` preset is written out: LLaVA ``config.json`` (Llama-2-7B
decoder, SigLIP-so400m tower at 224 px, 256 image tokens), OpenVLA's ``vla_config.json``
(image first, 7-dof actions on the last 256 ids below 32000), statistics, the image
preprocessor and a byte-level tokenizer laid out like Llama's (``<unk> <s> </s>`` at 0-2,
``<pad>`` at 32000, ``<image>`` at 32001). Weights are seeded random bf16, drawn on the target
device and written as safetensors shards; the actions they produce are meaningless.

``shrink=True`` keeps that layout (vocabulary, image size and token count, prompt) with tiny
widths and depths, so the same code path runs on a CPU in seconds.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import torch

from vla_sched.model.checkpoint_spec import (
    CONFIG_FILE,
    PREPROCESSOR_FILE,
    TOKENIZER_FILE,
    VLA_CONFIG_FILE,
    parse_architecture,
)
from vla_sched.model.presets import openvla_7b_config, openvla_7b_vla_config, tiny_statistics
from vla_sched.model.tiny_checkpoint import random_state_dict, write_weights

SPECIALS = ('<unk>', '<s>', '</s>')
PAD_TOKEN_ID = 32000
IMAGE_TOKEN_ID = 32001
TEXT_VOCAB_END = 32000


def openvla_config(*, shrink: bool) -> dict[str, Any]:
    """``config.json``: the ``openvla-7b`` preset, or its layout at tiny widths."""
    config = copy.deepcopy(openvla_7b_config())
    if shrink:
        config['text_config'].update(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=4,
            head_dim=16,
        )
        config['vision_config'].update(
            hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2
        )
        config['vision_feature_layer'] = -1
    return config


def tokenizer_json() -> str:
    """A byte-level BPE tokenizer (no merges) with Llama's special ids and 32002 entries."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    vocab = {token: i for i, token in enumerate(SPECIALS)}
    for symbol in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab[symbol] = len(vocab)
    while len(vocab) < TEXT_VOCAB_END:
        vocab[f'<unused_{len(vocab)}>'] = len(vocab)
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token='<unk>'))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIALS])
    tokenizer.add_special_tokens(
        [AddedToken('<pad>', special=True), AddedToken('<image>', special=True)]
    )
    for token, expected in (('<pad>', PAD_TOKEN_ID), ('<image>', IMAGE_TOKEN_ID)):
        if tokenizer.token_to_id(token) != expected:
            raise RuntimeError(f'the tokenizer put {token} at {tokenizer.token_to_id(token)}')
    return tokenizer.to_str()


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + '\n')


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
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = openvla_config(shrink=shrink)
    config['text_config']['pad_token_id'] = PAD_TOKEN_ID
    _write_json(folder / CONFIG_FILE, config)
    _write_json(folder / VLA_CONFIG_FILE, openvla_7b_vla_config())
    _write_json(folder / 'dataset_statistics.json', tiny_statistics())
    size = config['vision_config']['image_size']
    _write_json(
        folder / PREPROCESSOR_FILE,
        {
            'image_processor_type': 'SiglipImageProcessor',
            'do_resize': True,
            'size': {'height': size, 'width': size},
            'resample': 3,
            'do_rescale': True,
            'rescale_factor': 1 / 255,
            'do_normalize': True,
            'image_mean': [0.5, 0.5, 0.5],
            'image_std': [0.5, 0.5, 0.5],
        },
    )
    _write_json(
        folder / 'tokenizer_config.json',
        {
            'tokenizer_class': 'PreTrainedTokenizerFast',
            'bos_token': '<s>',
            'eos_token': '</s>',
            'unk_token': '<unk>',
            'pad_token': '<pad>',
            'model_max_length': 2048,
            'add_bos_token': False,
            'add_eos_token': False,
        },
    )
    (folder / TOKENIZER_FILE).write_text(tokenizer_json())
    decoder, vision = parse_architecture(config)
    tensors = random_state_dict(decoder, vision, seed=seed, device=device, dtype=dtype)
    write_weights(folder, {k: v.cpu() for k, v in tensors.items()}, num_shards=num_shards)
    return folder
