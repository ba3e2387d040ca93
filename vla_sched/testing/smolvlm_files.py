"""A tiny SmolVLM2-like VLM folder (``config.json`` and tokenizer files) for SmolVLA test
folders written offline.

A SmolVLA folder holds neither its VLM's sizes nor its tokenizer: users download them from
``HuggingFaceTB/SmolVLM2-500M-Video-Instruct``. This writes the same files at tiny sizes:

- ``config.json``: a ``smolvlm`` config (``scale_factor``, ``vision_config`` of the SigLIP-like
  tower, ``text_config`` of the Llama-like text model with ``head_dim`` and ``vocab_size``);
- ``tokenizer.json``, ``tokenizer_config.json``, ``special_tokens_map.json``: a byte-level BPE
  tokenizer as SmolLM2's (GPT-2's byte alphabet, ``Ġ`` for a leading space, no token added
  around a text) with ``<|endoftext|>`` 0, ``<|im_start|>`` 1, ``<|im_end|>`` 2, the 256 byte
  pieces, then words of robot instructions with the merges that build them until the
  vocabulary holds ``vocab_size`` pieces.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SPECIAL_TOKENS = ('<|endoftext|>', '<|im_start|>', '<|im_end|>')
TOKENIZER_FILES = ('tokenizer.json', 'tokenizer_config.json', 'special_tokens_map.json')
WORDS = (
    'the', 'pick', 'up', 'put', 'place', 'on', 'in', 'to', 'and', 'open', 'close', 'push',
    'move', 'red', 'blue', 'green', 'block', 'cup', 'cups', 'bowl', 'plate', 'drawer', 'top',
    'left', 'right', 'of', 'into', 'it', 'stack', 'lift', 'wave', 'grasp', 'cube', 'lego',
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class TinySmolVLM:
    """The VLM sizes of a test folder (SmolVLM2-500M: 960 wide, 32 layers, 15 heads of 64, 5
    KV heads, vision 768 wide, 12 layers, patch 16, image 512, scale_factor 4)."""

    text_hidden: int = 64
    text_layers: int = 6
    text_heads: int = 4
    text_kv_heads: int = 2
    text_head_dim: int = 16
    text_intermediate: int = 128
    vocab_size: int = 512
    vision_hidden: int = 32
    vision_layers: int = 2
    vision_heads: int = 4
    vision_intermediate: int = 64
    patch_size: int = 8
    image_size: int = 32
    scale_factor: int = 2


TINY_SMOLVLM = TinySmolVLM()


def smolvlm_config(sizes: TinySmolVLM = TINY_SMOLVLM) -> dict[str, Any]:
    """The VLM's ``config.json`` (the fields SmolVLA reads, as the hub file names them)."""
    return {
        'architectures': ['SmolVLMForConditionalGeneration'],
        'model_type': 'smolvlm',
        'image_token_id': sizes.vocab_size - 1,
        'scale_factor': sizes.scale_factor,
        'tie_word_embeddings': False,
        'text_config': {
            'model_type': 'llama',
            'hidden_size': sizes.text_hidden,
            'intermediate_size': sizes.text_intermediate,
            'num_hidden_layers': sizes.text_layers,
            'num_attention_heads': sizes.text_heads,
            'num_key_value_heads': sizes.text_kv_heads,
            'head_dim': sizes.text_head_dim,
            'hidden_act': 'silu',
            'rms_norm_eps': 1e-05,
            'rope_theta': 100000,
            'vocab_size': sizes.vocab_size,
            'max_position_embeddings': 8192,
        },
        'vision_config': {
            'model_type': 'smolvlm_vision',
            'hidden_size': sizes.vision_hidden,
            'intermediate_size': sizes.vision_intermediate,
            'num_hidden_layers': sizes.vision_layers,
            'num_attention_heads': sizes.vision_heads,
            'patch_size': sizes.patch_size,
            'image_size': sizes.image_size,
            'hidden_act': 'gelu_pytorch_tanh',
            'layer_norm_eps': 1e-06,
        },
    }


def _byte_alphabet() -> list[str]:
    """GPT-2's printable stand-ins of the 256 bytes, in byte order."""
    keep = [*range(ord('!'), ord('~') + 1), *range(ord('¡'), ord('¬') + 1)]
    keep += list(range(ord('®'), ord('ÿ') + 1))
    mapping, extra = {}, 0
    for b in range(256):
        if b in keep:
            mapping[b] = chr(b)
        else:
            mapping[b] = chr(256 + extra)
            extra += 1
    return [mapping[b] for b in range(256)]


def smolvlm_like_tokenizer_json(vocab_size: int = TINY_SMOLVLM.vocab_size) -> str:
    """``tokenizer.json`` of a byte-level BPE tokenizer over ``vocab_size`` pieces."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    pieces = [*SPECIAL_TOKENS, *_byte_alphabet()]
    if len(pieces) > vocab_size:
        raise ValueError(f'a byte-level vocabulary needs {len(pieces)} pieces at least')
    seen, merges = set(pieces), []
    for word in [*('Ġ' + w for w in WORDS), *WORDS]:
        for end in range(2, len(word) + 1):
            if len(pieces) == vocab_size:
                break
            if word[:end] not in seen:
                seen.add(word[:end])
                pieces.append(word[:end])
                merges.append((word[: end - 1], word[end - 1]))
    while len(pieces) < vocab_size:  # unreachable by merges: never changes a tokenization
        pieces.append(f'<unused{len(pieces)}>')
    vocab = {piece: i for i, piece in enumerate(pieces)}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(list(SPECIAL_TOKENS))
    return tokenizer.to_str()


def write_smolvlm_folder(folder: str | Path, sizes: TinySmolVLM = TINY_SMOLVLM) -> Path:
    """Write the VLM's ``config.json`` and tokenizer files into ``folder``; returns it."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / 'config.json').write_text(json.dumps(smolvlm_config(sizes), indent=2) + '\n')
    (folder / 'tokenizer.json').write_text(smolvlm_like_tokenizer_json(sizes.vocab_size))
    special = {
        'bos_token': '<|im_start|>',
        'eos_token': '<|im_end|>',
        'pad_token': '<|im_end|>',
        'unk_token': '<|endoftext|>',
    }
    config = {
        'tokenizer_class': 'GPT2Tokenizer',
        'add_bos_token': False,
        'add_eos_token': False,
        'model_max_length': 8192,
        'clean_up_tokenization_spaces': False,
        **special,
    }
    (folder / 'tokenizer_config.json').write_text(json.dumps(config, indent=2) + '\n')
    (folder / 'special_tokens_map.json').write_text(json.dumps(special, indent=2) + '\n')
    return folder
