"""Radix cache keys: token ids, images keyed by their content, and a namespace.

A key is an int64 tensor with one element per prompt position plus an ``extra_key``
(any hashable: model, adapter, embodiment) that namespaces the tree, so keys with
different extra keys never share a node.

Text tokens keep their ids (which must be >= 0). Image placeholder tokens all carry the
same token id in the prompt, so each position of an image span is replaced by a negative
value derived from the image's content hash and the position's index within the image::

    value(h, i) = -(1 + ((fold62(h) + i * 0x9E3779B1) mod 2**62))

Text and image values cannot meet (>= 0 against < 0). For one index ``i`` the map
``fold62(h) -> value`` is a bijection, so two images whose content hashes differ (in their
62-bit fold, a 2**-62 chance for 64-bit digests) differ at the first position of their
span, and no page holding image tokens is shared between them.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from vla_sched.core.memory.pages import round_down_to_page

_MASK62 = (1 << 62) - 1
_INDEX_MIX = 0x9E3779B1  # odd, < 2**32: index * mix stays below 2**62 for index < 2**30


class ImageSpan(Protocol):
    """Where an image's placeholder tokens sit (``forward_batch.ImageInput`` fits)."""

    @property
    def content_hash(self) -> int: ...

    @property
    def token_offset(self) -> int: ...

    @property
    def num_tokens(self) -> int: ...


@dataclass(frozen=True, slots=True, eq=False)
class RadixKey:
    """Token key of a radix cache lookup, namespaced by ``extra_key``.

    Attributes:
        token_ids: int64 ``[n]`` key values (text ids >= 0, image values < 0).
        extra_key: namespace (None, or any hashable such as ``('model', 'adapter')``).
    """

    token_ids: torch.Tensor
    extra_key: Hashable = None

    def __post_init__(self) -> None:
        if self.token_ids.dtype != torch.int64 or self.token_ids.dim() != 1:
            raise ValueError(
                f'key token_ids must be a 1-D int64 tensor, got {self.token_ids.dtype} '
                f'{tuple(self.token_ids.shape)}'
            )

    def __len__(self) -> int:
        return int(self.token_ids.numel())

    def prefix(self, length: int) -> RadixKey:
        """The first ``length`` elements, same namespace (a view, no copy)."""
        return RadixKey(self.token_ids[:length], self.extra_key)

    def page_aligned(self, page_size: int) -> RadixKey:
        """The longest prefix whose length is a multiple of ``page_size``."""
        return self.prefix(round_down_to_page(len(self), page_size))

    def starts_with(self, other: RadixKey) -> bool:
        """Whether ``other`` is a prefix of this key in the same namespace."""
        n = len(other)
        return (
            self.extra_key == other.extra_key
            and n <= len(self)
            and torch.equal(self.token_ids[:n], other.token_ids)
        )


def fold62(content_hash: int) -> int:
    """Fold an int (any sign, any width) to 62 bits; identity on ``[0, 2**62)``."""
    h = content_hash % (1 << 64)
    return (h ^ (h >> 62)) & _MASK62


def image_key_values(content_hash: int, num_tokens: int) -> torch.Tensor:
    """Key values of an image span of ``num_tokens`` positions (all negative)."""
    return torch.from_numpy(_image_values(content_hash, num_tokens))


def build_key_tokens(
    token_ids: Sequence[int] | torch.Tensor, images: Iterable[ImageSpan] = ()
) -> torch.Tensor:
    """Key values of a prompt: its token ids with every image span keyed by content.

    Built in numpy (a request's key costs a few microseconds, where the same torch ops on
    a prompt's few hundred tokens cost tens).

    Args:
        token_ids: prompt token ids (>= 0), placeholders included.
        images: spans of image placeholder tokens inside ``token_ids``.

    Returns:
        int64 ``[len(token_ids)]``.

    Raises:
        ValueError: a negative token id, or an image span outside the prompt or
            overlapping another span.
    """
    if isinstance(token_ids, torch.Tensor):
        key = token_ids.detach().to(torch.int64).reshape(-1).numpy().copy()
    else:
        key = np.array(token_ids, dtype=np.int64).reshape(-1)
    if key.size and key.min() < 0:
        pos = int(np.flatnonzero(key < 0)[0])
        raise ValueError(f'token id {int(key[pos])} at position {pos} is negative')
    covered = np.zeros(key.size, dtype=np.bool_)
    for image in images:
        start, end = image.token_offset, image.token_offset + image.num_tokens
        if not 0 <= start <= end <= key.size:
            raise ValueError(
                f'image {image.content_hash:#x} spans [{start}, {end}), outside the '
                f'{key.size}-token prompt'
            )
        if covered[start:end].any():
            raise ValueError(f'image {image.content_hash:#x} overlaps another image span')
        covered[start:end] = True
        key[start:end] = _image_values(image.content_hash, image.num_tokens)
    return torch.from_numpy(key)


def _image_values(content_hash: int, num_tokens: int) -> np.ndarray:
    if not 0 <= num_tokens < (1 << 30):
        raise ValueError(f'image span of {num_tokens} tokens is out of range')
    index = np.arange(num_tokens, dtype=np.int64)
    return -(1 + ((fold62(content_hash) + index * _INDEX_MIX) & _MASK62))
