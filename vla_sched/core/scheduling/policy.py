"""Order of the waiting queue before each prefill pass (SGLang's ``SchedulePolicy``).

* ``fcfs``: arrival order (re-queued requests go to the back); with priority scheduling a
  stable sort by ``(priority * sign, wait_queue_entry)``.
* ``lof``: longest ``max_new_tokens`` first (after priority when it is on).
* ``lpm``: longest cached prefix first. With more than ``lpm_fcfs_fallback_queue_len``
  waiting requests the pass acts as fcfs, and as in SGLang that means the queue keeps
  its current order, unsorted. In-batch prefix caching: a request whose cached prefix is
  short but shares at least ``in_batch_prefix_deprioritize_threshold`` tokens with a
  request ahead of it in this pass goes last, so it can hit the cache next pass.
* ``dfs-weight``: requests grouped by their deepest matched tree node; the tree is walked
  depth-first, heavier subtrees (more waiting requests) first, a node's requests after
  its subtree.

Cache-aware policies match every waiting request against the tree (``match_prefix``),
which sets its prefix for the pass; nothing is locked.
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING

import torch

from vla_sched.core.memory.radix_cache import RadixCache, TreeNode
from vla_sched.core.memory.token_allocator import PagedTokenAllocator
from vla_sched.core.scheduling.schedule_batch import priority_value

if TYPE_CHECKING:
    from vla_sched.core.memory.kv_memory import KVMemory
    from vla_sched.core.scheduling.request import Req
    from vla_sched.core.scheduling.scheduler_config import SchedulerConfig


class SchedulePolicy:
    """Sorts the waiting queue in place.

    Args:
        config: policy name, priority settings and lpm constants.
        memory: the KV memory whose radix tree the cache-aware policies match against.
    """

    def __init__(self, config: SchedulerConfig, memory: KVMemory) -> None:
        self.config = config
        self.memory = memory

    def calc_priority(self, waiting_queue: list[Req]) -> None:
        """Sort ``waiting_queue`` for this pass."""
        policy = self.config.schedule_policy
        if policy == 'lpm' and len(waiting_queue) > self.config.lpm_fcfs_fallback_queue_len:
            return
        if policy == 'fcfs':
            if self.config.enable_priority_scheduling:
                waiting_queue.sort(key=self._priority_then_entry)
        elif policy == 'lof':
            waiting_queue.sort(key=self._lof_key)
        elif policy == 'lpm':
            deprioritized = self._compute_prefix_matches(waiting_queue)
            waiting_queue.sort(
                key=lambda r: (
                    float('inf') if id(r) in deprioritized else -r.num_matched_prefix_tokens
                )
            )
        elif policy == 'dfs-weight':
            self._compute_prefix_matches(waiting_queue)
            waiting_queue[:] = self._dfs_weight_order(waiting_queue)
        else:
            raise ValueError(f'unknown schedule policy {policy!r}')

    def _priority_then_entry(self, req: Req) -> tuple[int, int]:
        sign = self.config.priority_sign
        return (priority_value(req, sign) * sign, req.times.wait_queue_entry_ns or 0)

    def _lof_key(self, req: Req) -> tuple[int, ...]:
        if self.config.enable_priority_scheduling:
            sign = self.config.priority_sign
            return (priority_value(req, sign) * sign, -req.max_new_tokens)
        return (-req.max_new_tokens,)

    def _compute_prefix_matches(self, waiting_queue: list[Req]) -> set[int]:
        """Match each request against the tree; returns ids of deprioritized requests."""
        check = self.config.in_batch_prefix_check_threshold
        page_size = self.memory.page_size
        in_queue = RadixCache(PagedTokenAllocator(num_pages=1, page_size=page_size))
        deprioritized: set[int] = set()
        for req in waiting_queue:
            match = self.memory.match_prefix(req.kv)
            req.num_matched_prefix_tokens = int(match.device_indices.numel())
            if check < 0 or req.num_matched_prefix_tokens > check:
                continue
            key = req.kv.key.page_aligned(page_size)
            in_queue_len = int(in_queue.match_prefix(key).device_indices.numel())
            if in_queue_len >= self.config.in_batch_prefix_deprioritize_threshold:
                deprioritized.add(id(req))
            else:
                in_queue.insert(key, torch.zeros(len(key), dtype=torch.int64))
        return deprioritized

    def _dfs_weight_order(self, waiting_queue: list[Req]) -> list[Req]:
        root = self.memory.tree.root
        reqs_at: dict[TreeNode, list[Req]] = defaultdict(list)
        for req in waiting_queue:
            reqs_at[req.kv.last_node if req.kv.last_node is not None else root].append(req)
        weight: dict[TreeNode, int] = defaultdict(int)
        post_order = _post_order(root)
        for node in post_order:
            weight[node] = len(reqs_at.get(node, ())) + sum(
                weight[c] for c in node.children.values()
            )
        ordered: list[Req] = []
        stack: list[tuple[TreeNode, bool]] = [(root, False)]
        while stack:
            node, children_done = stack.pop()
            if children_done:
                ordered.extend(reqs_at.get(node, ()))
                continue
            stack.append((node, True))
            children = sorted(node.children.values(), key=lambda c: -weight[c])
            stack.extend((c, False) for c in reversed(children))
        return ordered


def _post_order(root: TreeNode) -> list[TreeNode]:
    """Every node of the tree, children before their parent."""
    order: list[TreeNode] = []
    stack = [root]
    while stack:
        node = stack.pop()
        order.append(node)
        stack.extend(node.children.values())
    return order[::-1]
