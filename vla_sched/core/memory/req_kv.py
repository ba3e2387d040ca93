"""Per-request KV state, held by the scheduler's request object by composition.

Row ``req_to_token[req_pool_idx]`` of an admitted request::

    0 ........ cache_protected_len ............ kv_committed_len .. kv_allocated_len
    |  tree-owned KV, kept alive by   |  request-owned KV: freed, or     | allocated, not
    |  the lock on last_node          |  handed to the tree on insert    | yet written

``cache_protected_len`` is page-aligned, so every page of the row is wholly tree-owned or
wholly request-owned (the request's partial last page is its own).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence

import torch

from vla_sched.core.memory.radix_cache import TreeNode
from vla_sched.core.memory.radix_key import ImageSpan, RadixKey, build_key_tokens


def _empty_indices() -> torch.Tensor:
    return torch.empty(0, dtype=torch.int64)


class ReqKV:
    """KV memory state of one request.

    Attributes:
        rid: request id (unique among requests holding memory).
        key: radix key of every token known so far (prompt, then appended outputs).
        session_id: robot whose session this request is a step of, or None.
        max_cache_len: tokens past this never enter the tree (set for session steps
            whose KV is freed at finish); None: no limit.
        req_pool_idx: row in ``ReqToTokenPool`` while admitted, else None.
        prefix_indices: KV slots of the reusable prefix (tree hit after ``match_prefix``;
            everything written so far after ``cache_unfinished_req``).
        last_node: deepest matched/inserted tree node; locked while admitted.
        cache_protected_len: leading tokens of the row owned by the tree.
        kv_allocated_len: tokens of the row with a slot.
        kv_committed_len: tokens whose KV is (being) written.

    Appended tokens are kept as a list until ``key`` is read (a tree lookup or insert), so
    a decode step appends in well under a microsecond instead of building a key tensor.
    """

    __slots__ = (
        '_appended',
        '_key',
        'cache_protected_len',
        'kv_allocated_len',
        'kv_committed_len',
        'last_node',
        'max_cache_len',
        'prefix_indices',
        'req_pool_idx',
        'rid',
        'session_id',
    )

    def __init__(
        self,
        rid: str,
        key: RadixKey,
        session_id: str | None = None,
        max_cache_len: int | None = None,
        req_pool_idx: int | None = None,
        prefix_indices: torch.Tensor | None = None,
        last_node: TreeNode | None = None,
        cache_protected_len: int = 0,
        kv_allocated_len: int = 0,
        kv_committed_len: int = 0,
    ) -> None:
        self.rid = rid
        self._key = key
        self._appended: list[int] = []
        self.session_id = session_id
        self.max_cache_len = max_cache_len
        self.req_pool_idx = req_pool_idx
        self.prefix_indices = _empty_indices() if prefix_indices is None else prefix_indices
        self.last_node = last_node
        self.cache_protected_len = cache_protected_len
        self.kv_allocated_len = kv_allocated_len
        self.kv_committed_len = kv_committed_len

    def __repr__(self) -> str:
        return (
            f'ReqKV(rid={self.rid!r}, num_tokens={self.num_tokens}, '
            f'session_id={self.session_id!r}, req_pool_idx={self.req_pool_idx}, '
            f'cache_protected_len={self.cache_protected_len}, '
            f'kv_committed_len={self.kv_committed_len}, '
            f'kv_allocated_len={self.kv_allocated_len})'
        )

    @property
    def key(self) -> RadixKey:
        """Radix key of every token known so far (prompt, then appended outputs)."""
        if self._appended:
            new = torch.tensor(self._appended, dtype=torch.int64)
            self._key = RadixKey(torch.cat([self._key.token_ids, new]), self._key.extra_key)
            self._appended = []
        return self._key

    @key.setter
    def key(self, key: RadixKey) -> None:
        self._key = key
        self._appended = []

    @classmethod
    def from_prompt(
        cls,
        rid: str,
        token_ids: Sequence[int] | torch.Tensor,
        *,
        images: Iterable[ImageSpan] = (),
        extra_key: Hashable = None,
    ) -> ReqKV:
        """A request whose key is ``token_ids`` with image spans keyed by content."""
        return cls(rid=rid, key=RadixKey(build_key_tokens(token_ids, images), extra_key))

    @property
    def num_tokens(self) -> int:
        """Tokens known so far (prompt plus appended outputs)."""
        return len(self._key) + len(self._appended)

    @property
    def holds_memory(self) -> bool:
        """Whether the request is admitted (owns a row, a lock and maybe pages)."""
        return self.req_pool_idx is not None

    @property
    def prefix_len(self) -> int:
        return int(self.prefix_indices.numel())

    def append_tokens(self, token_ids: Sequence[int] | torch.Tensor) -> None:
        """Append generated (text) token ids to the key.

        Raises:
            ValueError: a token id is negative (nothing is appended).
        """
        if isinstance(token_ids, torch.Tensor):
            new = token_ids.detach().to(torch.int64).reshape(-1).tolist()
        else:
            new = [int(t) for t in token_ids]
        if new and min(new) < 0:
            raise ValueError(f'request {self.rid!r}: generated token ids must be >= 0')
        self._appended += new

    def reset_memory_state(self) -> None:
        """Forget pool and tree state after release (tokens are kept for a re-prefill)."""
        self.req_pool_idx = None
        self.prefix_indices = _empty_indices()
        self.last_node = None
        self.cache_protected_len = 0
        self.kv_allocated_len = 0
        self.kv_committed_len = 0
