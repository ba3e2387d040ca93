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
from dataclasses import dataclass, field

import torch

from vla_sched.engine.memory.radix_cache import TreeNode
from vla_sched.engine.memory.radix_key import ImageSpan, RadixKey, build_key_tokens


def _empty_indices() -> torch.Tensor:
    return torch.empty(0, dtype=torch.int64)


@dataclass(eq=False, slots=True)
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
    """

    rid: str
    key: RadixKey
    session_id: str | None = None
    max_cache_len: int | None = None
    req_pool_idx: int | None = None
    prefix_indices: torch.Tensor = field(default_factory=_empty_indices)
    last_node: TreeNode | None = None
    cache_protected_len: int = 0
    kv_allocated_len: int = 0
    kv_committed_len: int = 0

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
        return len(self.key)

    @property
    def holds_memory(self) -> bool:
        """Whether the request is admitted (owns a row, a lock and maybe pages)."""
        return self.req_pool_idx is not None

    @property
    def prefix_len(self) -> int:
        return int(self.prefix_indices.numel())

    def append_tokens(self, token_ids: Sequence[int] | torch.Tensor) -> None:
        """Append generated (text) token ids to the key."""
        new = torch.as_tensor(token_ids, dtype=torch.int64).reshape(-1)
        if bool((new < 0).any()):
            raise ValueError(f'request {self.rid!r}: generated token ids must be >= 0')
        self.key = RadixKey(torch.cat([self.key.token_ids, new]), self.key.extra_key)

    def reset_memory_state(self) -> None:
        """Forget pool and tree state after release (tokens are kept for a re-prefill)."""
        self.req_pool_idx = None
        self.prefix_indices = _empty_indices()
        self.last_node = None
        self.cache_protected_len = 0
        self.kv_allocated_len = 0
        self.kv_committed_len = 0
