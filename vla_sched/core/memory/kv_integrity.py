"""Integrity check of the KV memory layer: pools, tree, locks, rows and requests.

Every page ``1..num_pages`` has exactly one owner: the free list, one tree node, or one
admitted request (its row from ``cache_protected_len`` to ``kv_allocated_len``); hence
``free + evictable + protected + held by requests == total``. Each node's lock count
equals the locks the admitted requests and open sessions hold on it or below. Every
request slot is free or owned by exactly one admitted request. The first violation
raises ``IntegrityError`` naming the page, node, slot, request or robot.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch

from vla_sched.core.memory.kv_errors import IntegrityError
from vla_sched.core.memory.radix_cache import RadixCache, TreeNode

if TYPE_CHECKING:
    from vla_sched.core.memory.kv_memory import KVMemory
    from vla_sched.core.memory.req_kv import ReqKV
    from vla_sched.core.memory.token_allocator import PagedTokenAllocator


def check_kv_integrity(memory: KVMemory, live_reqs: Iterable[ReqKV] | None = None) -> None:
    """Raise ``IntegrityError`` at the first inconsistency (see the module docstring)."""
    _check_allocator(memory.allocator)
    nodes = _check_tree(memory.tree)
    _check_admitted_reqs(memory)
    if live_reqs is not None:
        _check_live_reqs(memory, list(live_reqs))
    _check_lock_refs(memory, nodes)
    _check_page_owners(memory, nodes)
    _check_req_slots(memory)


def _check_allocator(allocator: PagedTokenAllocator) -> None:
    free_ids = allocator.free_page_ids()
    is_free = allocator.page_is_free()
    out = (free_ids < 1) | (free_ids > allocator.num_pages)
    if bool(out.any()):
        raise IntegrityError(
            f'free list holds page {int(free_ids[out][0])}, outside 1..{allocator.num_pages}'
        )
    counts = torch.bincount(free_ids, minlength=allocator.num_pages + 1)
    if bool((counts > 1).any()):
        raise IntegrityError(f'page {int((counts > 1).nonzero()[0])} is on the free list twice')
    flagged = is_free.nonzero().reshape(-1)
    if not torch.equal(flagged, torch.sort(free_ids).values):
        diff = set(flagged.tolist()) ^ set(free_ids.tolist())
        raise IntegrityError(f'page {min(diff)}: free flag and free list disagree')


def _check_tree(tree: RadixCache) -> list[TreeNode]:
    root = tree.root
    if root.lock_ref != 1 or root.parent is not None or root.is_evicted:
        raise IntegrityError(f'root node {root.node_id} is damaged (lock_ref {root.lock_ref})')
    nodes = list(tree.iter_nodes())
    evictable = protected = 0
    leaves = set()
    for node in nodes:
        _check_node(tree, node)
        if node.lock_ref == 0:
            evictable += len(node)
            if not node.children:
                leaves.add(node)
        else:
            protected += len(node)
    if (evictable, protected) != (tree.evictable_size(), tree.protected_size()):
        raise IntegrityError(
            f'tree counters say {tree.evictable_size()} evictable / {tree.protected_size()} '
            f'protected tokens, the nodes hold {evictable} / {protected}'
        )
    if leaves != tree.evictable_leaves():
        bad = next(iter(leaves ^ tree.evictable_leaves()))
        raise IntegrityError(f'{tree.describe(bad)} is misfiled in the evictable leaf set')
    return nodes


def _check_node(tree: RadixCache, node: TreeNode) -> None:
    p = tree.page_size
    name = tree.describe(node)
    if node.is_evicted or node.parent is None:
        raise IntegrityError(f'{name} is reachable but marked evicted')
    if node.parent.children.get(tree.child_key_of(node)) is not node:
        raise IntegrityError(f'{name} is filed under the wrong key in its parent')
    if node.parent is not tree.root and node.parent.extra_key != node.extra_key:
        raise IntegrityError(f'{name} sits under a node of another namespace')
    if len(node) == 0 or len(node) % p or node.value.shape != node.key.shape:
        raise IntegrityError(
            f'{name} has {len(node)} key tokens and {node.value.numel()} slots (page size {p})'
        )
    if node.lock_ref < 0:
        raise IntegrityError(f'{name} has negative lock_ref {node.lock_ref}')
    _check_page_runs(node.value, p, name)


def _check_page_runs(slots: torch.Tensor, page_size: int, name: str) -> None:
    """Slots must fill pages in order: position ``k`` of a page run is ``page * P + k``."""
    if slots.numel() == 0:
        return
    offsets = torch.arange(slots.numel()) % page_size
    page_start = slots[::page_size] - slots[::page_size] % page_size
    expected = torch.repeat_interleave(page_start, page_size)[: slots.numel()] + offsets
    if not torch.equal(slots, expected):
        k = int((slots != expected).nonzero()[0])
        raise IntegrityError(
            f'{name}: slot {int(slots[k])} at position {k} breaks its page run '
            f'(expected {int(expected[k])})'
        )


def _check_admitted_reqs(memory: KVMemory) -> None:
    p = memory.page_size
    pool = memory.req_to_token_pool
    tree = memory.tree
    for req in memory.admitted_reqs():
        rid = req.rid
        row = req.req_pool_idx
        if row is None or pool.owner(row) != rid:
            raise IntegrityError(
                f'request {rid!r} holds memory but request slot {row} is owned by '
                f'{pool.owner(row) if row is not None else None!r}'
            )
        lens = (req.cache_protected_len, req.kv_committed_len, req.kv_allocated_len)
        if not 0 <= lens[0] <= lens[1] <= lens[2] <= pool.max_context_len or lens[0] % p:
            raise IntegrityError(
                f'request {rid!r}: protected/committed/allocated lengths {lens} are out of '
                f'order or unaligned (page size {p})'
            )
        node = req.last_node
        if node is None or node.is_evicted:
            raise IntegrityError(f'request {rid!r} holds a lock on an evicted or missing node')
        tree_slots = tree.path_values(node)
        if tree_slots.numel() != lens[0]:
            raise IntegrityError(
                f'request {rid!r}: {tree.describe(node)} ends at {tree_slots.numel()} tokens '
                f'but the request protects {lens[0]}'
            )
        row_slots = pool.read(row, 0, lens[0])
        if not torch.equal(row_slots, tree_slots):
            k = int((row_slots != tree_slots).nonzero()[0])
            raise IntegrityError(
                f'request {rid!r}: row {row} position {k} holds slot {int(row_slots[k])}, '
                f'the tree holds {int(tree_slots[k])}'
            )
        _check_page_runs(pool.read(row, lens[0], lens[2]), p, f'request {rid!r}')


def _check_live_reqs(memory: KVMemory, live_reqs: list[ReqKV]) -> None:
    counts = Counter(r.rid for r in live_reqs)
    dup = [rid for rid, n in counts.items() if n > 1]
    if dup:
        raise IntegrityError(f'request {dup[0]!r} is live twice')
    live = {r.rid: r for r in live_reqs}
    for req in memory.admitted_reqs():
        if live.get(req.rid) is not req:
            raise IntegrityError(f'request {req.rid!r} holds memory but is not live (leak)')
    admitted = {r.rid for r in memory.admitted_reqs()}
    for req in live_reqs:
        if req.holds_memory and req.rid not in admitted:
            raise IntegrityError(
                f'request {req.rid!r} claims request slot {req.req_pool_idx} but holds no memory'
            )
    for session in memory.sessions.sessions():
        stray = session.active_rids - live.keys()
        if stray:
            raise IntegrityError(
                f'robot {session.robot_id!r}: step {min(stray)!r} is active but not live'
            )


def _check_lock_refs(memory: KVMemory, nodes: list[TreeNode]) -> None:
    tree = memory.tree
    expected: Counter[TreeNode] = Counter()
    holders: dict[TreeNode, list[str]] = {}
    lock_points = [(f'request {r.rid!r}', r.last_node) for r in memory.admitted_reqs()]
    for session in memory.sessions.sessions():
        node = session.locked_node
        if node.is_evicted or tree.path_len(node) != session.locked_len:
            raise IntegrityError(
                f'robot {session.robot_id!r} locks {tree.describe(node)}, expected '
                f'{session.locked_len} live prefix tokens'
            )
        lock_points.append((f'session {session.robot_id!r}', node))
    for holder, node in lock_points:
        holders.setdefault(node, []).append(holder)
        while node is not tree.root:
            expected[node] += 1
            node = node.parent
    for node in nodes:
        if node.lock_ref != expected[node]:
            below = sorted(h for n, hs in holders.items() if _is_under(n, node) for h in hs)
            raise IntegrityError(
                f'{tree.describe(node)} has lock_ref {node.lock_ref}, but {expected[node]} '
                f'locks are held on it or below: {below}'
            )


def _is_under(node: TreeNode, ancestor: TreeNode) -> bool:
    while node is not None:
        if node is ancestor:
            return True
        node = node.parent
    return False


def _check_page_owners(memory: KVMemory, nodes: list[TreeNode]) -> None:
    p = memory.page_size
    num_pages = memory.allocator.num_pages
    free = memory.allocator.free_page_ids()
    tree_pages = [n.value[::p] // p for n in nodes]
    req_pages = [_req_pages(memory, r) for r in memory.admitted_reqs()]
    owned = torch.cat([free, *tree_pages, *req_pages])
    counts = torch.bincount(owned, minlength=num_pages + 1)
    if counts.numel() > num_pages + 1 or counts[0] != 0:
        page = 0 if counts[0] != 0 else int(owned.max())
        raise IntegrityError(f'page {page} is handed out but is not allocatable')
    bad = (counts[1:] != 1).nonzero()
    if bad.numel():
        page = int(bad[0]) + 1
        owners = _owners_of(memory, nodes, page)
        what = 'leaked: owned by nobody' if not owners else f'owned {len(owners)} times'
        raise IntegrityError(f'page {page} is {what} {owners}')
    num_free = free.numel()
    num_held = sum(t.numel() for t in req_pages)
    evictable, protected = memory.evictable_size() // p, memory.protected_size() // p
    if num_free + evictable + protected + num_held != num_pages:
        raise IntegrityError(
            f'pages: {num_free} free + {evictable} evictable + {protected} protected + '
            f'{num_held} held by requests != {num_pages} total'
        )


def _req_pages(memory: KVMemory, req: ReqKV) -> torch.Tensor:
    p = memory.page_size
    slots = memory.req_to_token_pool.read(
        req.req_pool_idx, req.cache_protected_len, req.kv_allocated_len
    )
    return slots[::p] // p


def _owners_of(memory: KVMemory, nodes: list[TreeNode], page: int) -> list[str]:
    p = memory.page_size
    owners = []
    if bool((memory.allocator.free_page_ids() == page).any()):
        owners.append('free list')
    owners += [memory.tree.describe(n) for n in nodes if bool((n.value[::p] // p == page).any())]
    owners += [
        f'request {r.rid!r}'
        for r in memory.admitted_reqs()
        if bool((_req_pages(memory, r) == page).any())
    ]
    return owners


def _check_req_slots(memory: KVMemory) -> None:
    pool = memory.req_to_token_pool
    free_rows = pool.free_slot_list()
    if len(set(free_rows)) != len(free_rows):
        raise IntegrityError(f'request slot free list has duplicates: {sorted(free_rows)}')
    admitted = {r.rid: r for r in memory.admitted_reqs()}
    free_set = set(free_rows)
    for row in range(pool.num_req_slots):
        owner = pool.owner(row)
        if row in free_set:
            if owner is not None:
                raise IntegrityError(f'request slot {row} is free but owned by {owner!r}')
            continue
        if owner is None:
            raise IntegrityError(f'request slot {row} is neither free nor owned (leaked)')
        req = admitted.get(owner)
        if req is None or req.req_pool_idx != row:
            raise IntegrityError(
                f'request slot {row} is owned by {owner!r}, which does not hold it'
            )
