"""A tiny PaliGemma-like tokenizer for pi0 / pi0.5 folders written offline.

PaliGemma's tokenizer (``google/paligemma-3b-pt-224``) is Gemma's: BPE with byte fallback,
spaces replaced by ``▁`` without a dummy prefix, digits as single pieces, ``<bos>`` added in
front, no ``<eos>``. Its special ids are kept: ``<pad>`` 0, ``<eos>`` 1, ``<bos>`` 2,
``<unk>`` 3, ``<mask>`` 4 (transformers' ``GemmaTokenizer`` adds it when missing). Then the
byte pieces ``<0x00>..<0xFF>``, the newline and ``▁`` pieces, the printable characters, and
words of robot instructions and of pi0.5's prompt (``Task``, ``State``, ``Action``) with the
merges that build them, after ``▁`` and bare, until the vocabulary holds ``vocab_size`` pieces
(the tiny model's vocabulary; a word that does not fit is spelled in smaller pieces).
``write_paligemma_tokenizer`` writes ``tokenizer.json``, ``tokenizer_config.json`` and
``special_tokens_map.json`` as the hub folder has them.
"""

from __future__ import annotations

import json
import string
from pathlib import Path
from typing import Any

from vla_sched.model.families.pi0.checkpoint import TINY_PI0_SIZES

SPECIAL_TOKENS = ('<pad>', '<eos>', '<bos>', '<unk>', '<mask>')
PAD_TOKEN_ID, EOS_TOKEN_ID, BOS_TOKEN_ID, UNK_TOKEN_ID, MASK_TOKEN_ID = range(5)
SPACE_PIECE = '\u2581'
TOKENIZER_FILES = ('tokenizer.json', 'tokenizer_config.json', 'special_tokens_map.json')
# Most frequent first: the vocabulary takes words in this order until it is full.
PROMPT_WORDS = (
    'the', 'Task', 'State', 'Action', 'pick', 'up', 'put', 'place', 'on', 'in', 'to', 'and',
    'open', 'close', 'push', 'move', 'red', 'blue', 'green', 'block', 'cup', 'bowl', 'plate',
    'drawer', 'top', 'left', 'right', 'of', 'into', 'it', 'stack', 'lift', 'pot', 'towel',
)  # fmt: skip


def _vocabulary(vocab_size: int) -> tuple[dict[str, int], list[tuple[str, str]]]:
    pieces = [*SPECIAL_TOKENS, *(f'<0x{b:02X}>' for b in range(256)), '\n', SPACE_PIECE]
    pieces += [c for c in string.printable if c not in string.whitespace]
    if len(pieces) > vocab_size:
        raise ValueError(f'a PaliGemma-like vocabulary needs {len(pieces)} pieces at least')
    seen = set(pieces)
    merges: list[tuple[str, str]] = []
    words = [SPACE_PIECE + w for w in PROMPT_WORDS] + list(PROMPT_WORDS)
    for word in words:
        for end in range(2, len(word) + 1):
            if len(pieces) == vocab_size:
                break
            if word[:end] not in seen:
                seen.add(word[:end])
                pieces.append(word[:end])
                merges.append((word[: end - 1], word[end - 1]))
    filler = 0
    while len(pieces) < vocab_size:  # unreachable by merges: never changes a tokenization
        pieces.append(f'<unused{filler}>')
        filler += 1
    return {piece: i for i, piece in enumerate(pieces)}, merges


def paligemma_like_tokenizer_json(vocab_size: int = TINY_PI0_SIZES.vocab_size) -> str:
    """``tokenizer.json`` of a Gemma-style BPE tokenizer over ``vocab_size`` pieces."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, processors

    vocab, merges = _vocabulary(vocab_size)
    model = models.BPE(
        vocab=vocab, merges=merges, unk_token='<unk>', byte_fallback=True, fuse_unk=True
    )
    tokenizer = Tokenizer(model)
    tokenizer.normalizer = normalizers.Replace(' ', SPACE_PIECE)
    tokenizer.decoder = decoders.Sequence(
        [decoders.Replace(SPACE_PIECE, ' '), decoders.ByteFallback(), decoders.Fuse()]
    )
    tokenizer.post_processor = processors.TemplateProcessing(
        single='<bos> $A', pair='<bos> $A $B', special_tokens=[('<bos>', BOS_TOKEN_ID)]
    )
    tokenizer.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS]
    )
    return tokenizer.to_str()


def _token_entry(content: str) -> dict[str, Any]:
    return {
        'content': content,
        'lstrip': False,
        'normalized': False,
        'rstrip': False,
        'single_word': False,
    }


def special_tokens_map() -> dict[str, Any]:
    return {
        'bos_token': _token_entry('<bos>'),
        'eos_token': _token_entry('<eos>'),
        'pad_token': _token_entry('<pad>'),
        'unk_token': _token_entry('<unk>'),
    }


def tokenizer_config() -> dict[str, Any]:
    added = {
        str(i): {**_token_entry(content), 'special': True}
        for i, content in enumerate(SPECIAL_TOKENS)
    }
    return {
        'tokenizer_class': 'GemmaTokenizer',
        'added_tokens_decoder': added,
        'bos_token': '<bos>',
        'eos_token': '<eos>',
        'pad_token': '<pad>',
        'unk_token': '<unk>',
        'add_bos_token': True,
        'add_eos_token': False,
        'clean_up_tokenization_spaces': False,
        'model_max_length': 1000000000000000019884624838656,
        'padding_side': 'right',
        'spaces_between_special_tokens': False,
    }


def write_paligemma_tokenizer(
    folder: str | Path, *, vocab_size: int = TINY_PI0_SIZES.vocab_size
) -> Path:
    """Write the three tokenizer files into ``folder`` (created if needed); returns it."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / 'tokenizer.json').write_text(paligemma_like_tokenizer_json(vocab_size))
    (folder / 'tokenizer_config.json').write_text(json.dumps(tokenizer_config(), indent=2) + '\n')
    (folder / 'special_tokens_map.json').write_text(
        json.dumps(special_tokens_map(), indent=2) + '\n'
    )
    return folder
