"""A Llama-2-like tokenizer as OpenVLA folders ship it, for checkpoints written offline.

``tokenizer.json`` (BPE with byte fallback over 32000 pieces), ``tokenizer_config.json`` and
``special_tokens_map.json``. Ids: ``<unk> <s> </s>`` at 0-2, the byte pieces
``<0x00>..<0xFF>`` at 3-258, the bare ``▁`` at 29871, ``<PAD>`` (added) at 32000, as in
Llama-2's tokenizer. The other pieces are printable characters, common words of robot
instructions (with their BPE merges, so prompts tokenize into whole-word pieces) and filler
pieces.
"""

from __future__ import annotations

import itertools
import string
from typing import Any

from vla_sched.model.config.presets import OPENVLA_PAD_TOKEN_ID

BASE_VOCAB_SIZE = 32000  # Llama-2's sentencepiece pieces
SPECIAL_PIECES = ('<unk>', '<s>', '</s>')
BOS_TOKEN_ID = 1
EOS_TOKEN_ID = 2
FIRST_BYTE_ID = 3
SPACE_PIECE = '\u2581'
SPACE_PIECE_ID = 29871
PAD_TOKEN = '<PAD>'
# Words of OpenVLA's prompts and of typical instructions; each becomes a piece with and
# without the leading space marker, reachable through left-to-right merges.
COMMON_WORDS = (
    'In', 'What', 'Out', 'USER', 'ASSISTANT', 'A', 'The', 'a', 'an', 'and', 'the', 'to',
    'of', 'on', 'in', 'into', 'from', 'up', 'down', 'off', 'out', 'with', 'what', 'action',
    'should', 'robot', 'take', 'chat', 'between', 'curious', 'user', 'artificial',
    'intelligence', 'assistant', 'gives', 'helpful', 'detailed', 'polite', 'answers',
    'questions', 'pick', 'place', 'put', 'push', 'pull', 'open', 'close', 'move', 'lift',
    'stack', 'wipe', 'fold', 'turn', 'slide', 'drawer', 'block', 'cup', 'cups', 'lid', 'table',
    'towel', 'button', 'bowl', 'plate', 'pot', 'pan', 'sink', 'spoon', 'carrot', 'can',
    'red', 'blue', 'green', 'yellow', 'left', 'right', 'top', 'bottom', 'door', 'cloth',
)  # fmt: skip


def _llama_like_vocab() -> tuple[dict[str, int], list[tuple[str, str]]]:
    """The 32000 model pieces and the BPE merges that build the word pieces."""
    pieces: list[str] = []
    merges: list[tuple[str, str]] = []
    seen = set(SPECIAL_PIECES) | {f'<0x{b:02X}>' for b in range(256)} | {SPACE_PIECE}

    def add(piece: str) -> None:
        if piece not in seen:
            seen.add(piece)
            pieces.append(piece)

    for char in string.ascii_letters + string.digits + string.punctuation:
        add(char)
    for word in (*(SPACE_PIECE + w for w in COMMON_WORDS), *COMMON_WORDS):
        for end in range(2, len(word) + 1):
            if word[:end] not in seen:
                merges.append((word[: end - 1], word[end - 1]))
            add(word[:end])
    # Filler: letter pairs and triples, bare and after the space marker (unreachable by
    # merges, so they never change how a text tokenizes).
    for length in (2, 3):
        for letters in itertools.product(string.ascii_lowercase, repeat=length):
            add(''.join(letters))
            add(SPACE_PIECE + ''.join(letters))
    vocab = {piece: i for i, piece in enumerate(SPECIAL_PIECES)}
    vocab.update({f'<0x{b:02X}>': FIRST_BYTE_ID + b for b in range(256)})
    vocab[SPACE_PIECE] = SPACE_PIECE_ID
    free = (i for i in range(FIRST_BYTE_ID + 256, BASE_VOCAB_SIZE) if i != SPACE_PIECE_ID)
    vocab.update({piece: token_id for token_id, piece in zip(free, pieces, strict=False)})
    if len(vocab) != BASE_VOCAB_SIZE or len(set(vocab.values())) != BASE_VOCAB_SIZE:
        raise RuntimeError(f'the tokenizer vocabulary has {len(vocab)} pieces, not 32000')
    return vocab, merges


def llama_like_tokenizer_json() -> str:
    """A Llama-2-like ``tokenizer.json``: BPE with byte fallback over 32000 pieces.

    The text gets a ``▁`` prefix and ``▁`` for spaces (Metaspace, prefix on the first
    piece), the post-processor adds BOS, and ``<PAD>`` is an added special token at 32000.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    vocab, merges = _llama_like_vocab()
    model = models.BPE(
        vocab=vocab, merges=merges, unk_token='<unk>', byte_fallback=True, fuse_unk=True
    )
    tokenizer = Tokenizer(model)
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement=SPACE_PIECE, prepend_scheme='first', split=False
    )
    tokenizer.decoder = decoders.Sequence(
        [
            decoders.Replace(SPACE_PIECE, ' '),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(' ', 1, 0),
        ]
    )
    tokenizer.post_processor = processors.TemplateProcessing(
        single='<s> $A', pair='<s> $A <s> $B', special_tokens=[('<s>', BOS_TOKEN_ID)]
    )
    specials = [AddedToken(t, special=True, normalized=False) for t in SPECIAL_PIECES]
    tokenizer.add_special_tokens([*specials, AddedToken(PAD_TOKEN, special=True)])
    if tokenizer.token_to_id(PAD_TOKEN) != OPENVLA_PAD_TOKEN_ID:
        raise RuntimeError(f'the tokenizer put {PAD_TOKEN} at {tokenizer.token_to_id(PAD_TOKEN)}')
    return tokenizer.to_str()


def special_tokens_map() -> dict[str, Any]:
    def token(content: str) -> dict[str, Any]:
        return {
            'content': content,
            'lstrip': False,
            'normalized': False,
            'rstrip': False,
            'single_word': False,
        }

    return {
        'bos_token': token('<s>'),
        'eos_token': token('</s>'),
        'pad_token': token(PAD_TOKEN),
        'unk_token': token('<unk>'),
    }


def tokenizer_config() -> dict[str, Any]:
    added = {
        str(i): {
            'content': content,
            'lstrip': False,
            'normalized': False,
            'rstrip': False,
            'single_word': False,
            'special': True,
        }
        for i, content in (*enumerate(SPECIAL_PIECES), (OPENVLA_PAD_TOKEN_ID, PAD_TOKEN))
    }
    return {
        'tokenizer_class': 'LlamaTokenizer',
        'added_tokens_decoder': added,
        'bos_token': '<s>',
        'eos_token': '</s>',
        'unk_token': '<unk>',
        'pad_token': PAD_TOKEN,
        'add_bos_token': True,
        'add_eos_token': False,
        'legacy': False,
        'clean_up_tokenization_spaces': False,
        'model_max_length': 2048,
        'padding_side': 'right',
        'use_default_system_prompt': False,
    }
