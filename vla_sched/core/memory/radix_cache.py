"""Radix prefix cache over page-aligned keys, holding KV pages by lock count.

Each node holds a key segment (a whole number of pages) and the KV slots of those tokens.
A node's ``lock_ref`` counts the locks held on it or on any node below it; tokens in
nodes with ``lock_ref == 0`` are *evictable*, the others *protected*
(``evictable_size() + protected_size()`` = tokens stored). Eviction frees unlocked
leaves, least recently used first (a logical clock ticks on every match and insert, so
the order is deterministic). Children are keyed by ``(extra_key, first page of key)``, so
namespaces never share a node.

Contracts:
    * Keys passed to ``match_prefix`` and ``insert`` are page-aligned (else
      ``KeyAlignmentError``); the caller truncates.
    * ``match_prefix`` never locks; a caller that keeps the returned slots must
      ``inc_lock_ref(last_node)`` before anything can evict.
    * ``insert`` takes ownership of the slots it stores; the slots of the first
      ``prefix_len`` tokens (already present) stay the caller's to free.
    * Splitting a node keeps the original node object as the lower half, so a
      ``last_node`` held by a request stays valid across splits.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Hashable, Iterator
from typing import NamedTuple

import torch

from vla_sched.core.memory.kv_errors import KeyAlignmentError, LockRefError
from vla_sched.core.memory.pages import round_down_to_page
from vla_sched.core.memory.radix_key import RadixKey
from vla_sched.core.memory.token_allocator import PagedTokenAllocator

_EMPTY = torch.empty(0, dtype=torch.int64)


class TreeNode:
    """One key segment of the radix tree and the KV slots of its tokens."""

    __slots__ = (
        'children',
        'extra_key',
        'is_evicted',
        'key',
        'last_access',
        'lock_ref',
        'node_id',
        'parent',
        'value',
    )

    def __init__(
        self,
        *,
        node_id: int,
        parent: TreeNode | None,
        key: torch.Tensor,
        value: torch.Tensor,
        extra_key: Hashable,
        last_access: int,
    ) -> None:
        self.node_id = node_id
        self.parent = parent
        self.children: dict[tuple, TreeNode] = {}
        self.key = key
        self.value = value
        self.extra_key = extra_key
        self.lock_ref = 0
        self.last_access = last_access
        self.is_evicted = False

    def __len__(self) -> int:
        return int(self.key.numel())

    def __repr__(self) -> str:
        return f'TreeNode(id={self.node_id}, len={len(self)}, lock_ref={self.lock_ref})'


class MatchResult(NamedTuple):
    """Result of ``match_prefix``.

    Attributes:
        device_indices: int64 KV slots of the matched prefix (page-aligned length).
        last_node: deepest node of the match (the root when nothing matched); lock it
            to keep ``device_indices`` valid.
    """

    device_indices: torch.Tensor
    last_node: TreeNode


class InsertResult(NamedTuple):
    """Result of ``insert``.

    Attributes:
        prefix_len: tokens of the key that were already in the tree (their existing slots
            were kept; the caller still owns the slots it passed for them).
        last_node: node ending at the inserted key.
    """

    prefix_len: int
    last_node: TreeNode


class RadixCache:
    """Radix tree of cached KV over page-aligned, namespaced token keys.

    Args:
        allocator: the pool evicted pages go back to; its page size aligns every key.
    """

    def __init__(self, allocator: PagedTokenAllocator) -> None:
        self.allocator = allocator
        self.page_size = allocator.page_size
        self._node_ids = itertools.count()
        self._clock = 0
        self.root = TreeNode(
            node_id=next(self._node_ids),
            parent=None,
            key=_EMPTY,
            value=_EMPTY,
            extra_key=None,
            last_access=0,
        )
        self.root.lock_ref = 1  # the root is never evicted
        self._evictable_size = 0
        self._protected_size = 0
        self._evictable_leaves: set[TreeNode] = set()

    # ---- public API ------------------------------------------------------------------

    def evictable_size(self) -> int:
        """Tokens stored in unlocked nodes."""
        return self._evictable_size

    def protected_size(self) -> int:
        """Tokens stored in locked nodes."""
        return self._protected_size

    def total_size(self) -> int:
        return self._evictable_size + self._protected_size

    def match_prefix(self, key: RadixKey) -> MatchResult:
        """Longest cached prefix of ``key`` (page-aligned); splits a node matched halfway.

        Raises:
            KeyAlignmentError: ``len(key)`` is not a multiple of the page size.
        """
        self._check_aligned(key, 'match_prefix')
        now = self._tick()
        tokens = key.token_ids
        node, pos, values = self.root, 0, []
        self.root.last_access = now
        while pos < tokens.numel():
            child = node.children.get(self._child_key(key.extra_key, tokens, pos))
            if child is None:
                break
            child.last_access = now
            matched = self._match_len(child.key, tokens[pos:])
            split = matched < len(child)
            if split:
                child = self._split(child, matched)
            values.append(child.value)
            node, pos = child, pos + matched
            if split:
                break
        indices = torch.cat(values) if values else _EMPTY
        return MatchResult(indices, node)

    def insert(self, key: RadixKey, value: torch.Tensor) -> InsertResult:
        """Store ``value`` (KV slots, one per key element) under ``key``.

        Raises:
            KeyAlignmentError: ``len(key)`` is not a multiple of the page size.
            ValueError: ``value`` does not hold one int64 slot per key element.
        """
        self._check_aligned(key, 'insert')
        tokens = key.token_ids
        num_tokens = tokens.numel()
        if value.dtype != torch.int64 or value.shape != (num_tokens,):
            raise ValueError(
                f'insert needs int64 [{num_tokens}] slots, got {value.dtype} {tuple(value.shape)}'
            )
        now = self._tick()
        node, pos = self.root, 0
        self.root.last_access = now
        while pos < num_tokens:
            child = node.children.get(self._child_key(key.extra_key, tokens, pos))
            if child is None:
                break
            child.last_access = now
            matched = self._match_len(child.key, tokens[pos:])
            if matched < len(child):
                child = self._split(child, matched)
            node, pos = child, pos + matched
        prefix_len = pos
        if pos < num_tokens:
            node = self._add_leaf(node, key.extra_key, tokens[pos:], value[pos:], now)
        return InsertResult(prefix_len, node)

    def evict(self, num_tokens: int) -> int:
        """Free unlocked leaves, least recently used first, until ``num_tokens`` are freed.

        Returns:
            Tokens freed (can exceed ``num_tokens`` by part of a node, or fall short when
            nothing more is evictable).
        """
        if num_tokens <= 0:
            return 0
        heap = [(n.last_access, n.node_id, n) for n in self._evictable_leaves]
        heapq.heapify(heap)
        num_evicted = 0
        while num_evicted < num_tokens and heap:
            _, _, node = heapq.heappop(heap)
            parent = node.parent
            self.allocator.free_pages(node.value[:: self.page_size] // self.page_size)
            num_evicted += len(node)
            self._delete_leaf(node)
            if parent in self._evictable_leaves:
                heapq.heappush(heap, (parent.last_access, parent.node_id, parent))
        return num_evicted

    def inc_lock_ref(self, node: TreeNode) -> None:
        """Lock ``node`` and its ancestors (their tokens become protected).

        Raises:
            LockRefError: ``node`` was evicted.
        """
        if node.is_evicted:
            raise LockRefError(f'cannot lock {self.describe(node)}: it was evicted')
        while node is not self.root:
            if node.lock_ref == 0:
                self._evictable_size -= len(node)
                self._protected_size += len(node)
                self._evictable_leaves.discard(node)
            node.lock_ref += 1
            node = node.parent

    def dec_lock_ref(self, node: TreeNode) -> None:
        """Undo one ``inc_lock_ref(node)``.

        Raises:
            LockRefError: a lock count on the path would drop below zero (nothing
                changes), or ``node`` was evicted.
        """
        if node.is_evicted:
            raise LockRefError(f'cannot unlock {self.describe(node)}: it was evicted')
        walk = node
        while walk is not self.root:
            if walk.lock_ref < 1:
                raise LockRefError(
                    f'unlocking {self.describe(node)} would drive the lock ref of '
                    f'{self.describe(walk)} below zero'
                )
            walk = walk.parent
        while node is not self.root:
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self._protected_size -= len(node)
                self._evictable_size += len(node)
                self._update_leaf_status(node)
            node = node.parent

    # ---- inspection (tests, integrity checks, diagnostics) ---------------------------

    def iter_nodes(self) -> Iterator[TreeNode]:
        """Every node except the root, parents before children."""
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def evictable_leaves(self) -> set[TreeNode]:
        return set(self._evictable_leaves)

    def path_len(self, node: TreeNode) -> int:
        """Tokens from the root down to the end of ``node``."""
        length = 0
        while node is not None:
            length += len(node)
            node = node.parent
        return length

    def path_values(self, node: TreeNode) -> torch.Tensor:
        """KV slots from the root down to the end of ``node``."""
        values = []
        while node is not None:
            values.append(node.value)
            node = node.parent
        return torch.cat(values[::-1]) if values else _EMPTY

    def child_key_of(self, node: TreeNode) -> tuple:
        """The key ``node`` is filed under in its parent's ``children``."""
        return self._child_key(node.extra_key, node.key, 0)

    def describe(self, node: TreeNode) -> str:
        """``node <id> (tokens [start, end) of namespace <extra_key>)``, for messages."""
        if node is self.root:
            return f'root node {node.node_id}'
        end = self.path_len(node) if not node.is_evicted else len(node)
        return (
            f'node {node.node_id} (tokens [{end - len(node)}, {end}) of namespace '
            f'{node.extra_key!r}{", evicted" if node.is_evicted else ""})'
        )

    # ---- internals -------------------------------------------------------------------

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def _check_aligned(self, key: RadixKey, what: str) -> None:
        if len(key) % self.page_size != 0:
            raise KeyAlignmentError(
                f'{what}: key of {len(key)} tokens (namespace {key.extra_key!r}) is not a '
                f'multiple of the page size {self.page_size}'
            )

    def _child_key(self, extra_key: Hashable, tokens: torch.Tensor, pos: int) -> tuple:
        return (extra_key, tuple(tokens[pos : pos + self.page_size].tolist()))

    def _match_len(self, node_key: torch.Tensor, tokens: torch.Tensor) -> int:
        n = min(node_key.numel(), tokens.numel())
        if torch.equal(node_key[:n], tokens[:n]):
            return n
        first_diff = int((node_key[:n] != tokens[:n]).nonzero()[0])
        return round_down_to_page(first_diff, self.page_size)

    def _split(self, node: TreeNode, split_len: int) -> TreeNode:
        """Cut ``node`` after ``split_len`` tokens; returns the new upper half."""
        parent = node.parent
        head = TreeNode(
            node_id=next(self._node_ids),
            parent=parent,
            key=node.key[:split_len],
            value=node.value[:split_len],
            extra_key=node.extra_key,
            last_access=node.last_access,
        )
        head.lock_ref = node.lock_ref
        child_key = self.child_key_of(node)
        node.key = node.key[split_len:]
        node.value = node.value[split_len:]
        node.parent = head
        head.children[self.child_key_of(node)] = node
        parent.children[child_key] = head
        return head

    def _add_leaf(
        self,
        parent: TreeNode,
        extra_key: Hashable,
        key: torch.Tensor,
        value: torch.Tensor,
        now: int,
    ) -> TreeNode:
        leaf = TreeNode(
            node_id=next(self._node_ids),
            parent=parent,
            key=key.clone(),
            value=value.clone(),
            extra_key=extra_key,
            last_access=now,
        )
        parent.children[self.child_key_of(leaf)] = leaf
        self._evictable_size += len(leaf)
        self._update_leaf_status(parent)
        self._update_leaf_status(leaf)
        return leaf

    def _delete_leaf(self, node: TreeNode) -> None:
        parent = node.parent
        del parent.children[self.child_key_of(node)]
        self._evictable_size -= len(node)
        self._evictable_leaves.discard(node)
        node.is_evicted = True
        node.parent = None
        self._update_leaf_status(parent)

    def _update_leaf_status(self, node: TreeNode) -> None:
        if node is not self.root and node.lock_ref == 0 and not node.children:
            self._evictable_leaves.add(node)
        else:
            self._evictable_leaves.discard(node)
