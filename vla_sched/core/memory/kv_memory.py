"""The KV memory facade the scheduler calls each step.

``KVMemory`` owns the request-to-token pool, the paged token allocator, the radix cache
and the robot sessions, and keeps the requests that hold memory. A request's life::

    match_prefix(req)            tree hit -> req.prefix_indices, req.last_node (no lock)
    admit(req)                   row + lock on last_node; row[:prefix_len] = prefix
    allocate_extend(reqs, lens)  slots for the next chunk / whole prompt (evicts if needed)
    cache_unfinished_req(req)    after a prefill chunk: the prompt so far enters the tree
    allocate_decode(reqs)        one slot per request per decode step
    release(req, insert=...)     finish (insert=True) or abort (insert=False)
    retract(req)                 KV pool full: free without insert, back to waiting

Every method that raises leaves the pools, the tree and the request as they were (the
tree may have evicted unlocked pages, which only drops cache).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from vla_sched.core.memory.kv_config import KVMemoryConfig
from vla_sched.core.memory.kv_errors import IntegrityError, KVMemoryError, OutOfPagesError
from vla_sched.core.memory.kv_integrity import check_kv_integrity
from vla_sched.core.memory.pages import num_new_pages, round_down_to_page, round_up_to_page
from vla_sched.core.memory.radix_cache import MatchResult, RadixCache
from vla_sched.core.memory.req_kv import ReqKV
from vla_sched.core.memory.req_to_token_pool import ReqToTokenPool
from vla_sched.core.memory.sessions import SessionManager
from vla_sched.core.memory.token_allocator import PagedTokenAllocator


class KVMemory:
    """Pools, radix cache and sessions behind one per-step API.

    Args:
        config: pool sizes and session policy.
    """

    def __init__(self, config: KVMemoryConfig) -> None:
        self.config = config
        self.page_size = config.page_size
        self.req_to_token_pool = ReqToTokenPool(
            num_req_slots=config.num_req_slots, max_context_len=config.max_context_len
        )
        self.allocator = PagedTokenAllocator(
            num_pages=config.num_pages, page_size=config.page_size
        )
        self.tree = RadixCache(self.allocator)
        self.sessions = SessionManager(
            self.tree,
            step_kv=config.session_step_kv,
            idle_timeout_ns=round(config.session_idle_timeout_s * 1e9),
        )
        self._reqs: dict[str, ReqKV] = {}

    # ---- sizes (tokens) --------------------------------------------------------------

    def num_free_tokens(self) -> int:
        return self.allocator.available_size()

    def evictable_size(self) -> int:
        return self.tree.evictable_size()

    def protected_size(self) -> int:
        return self.tree.protected_size()

    def available_size(self) -> int:
        """Tokens that can be allocated now: free plus evictable."""
        return self.num_free_tokens() + self.evictable_size()

    def num_req_held_tokens(self) -> int:
        """Tokens in pages owned by admitted requests (whole pages)."""
        return sum(
            round_up_to_page(r.kv_allocated_len - r.cache_protected_len, self.page_size)
            for r in self._reqs.values()
        )

    def admitted_reqs(self) -> list[ReqKV]:
        """Requests holding memory, in admission order."""
        return list(self._reqs.values())

    def tokens_needed(self, reqs: Sequence[ReqKV], extend_lens: Sequence[int]) -> int:
        """Tokens (whole new pages) that extending ``reqs`` by ``extend_lens`` takes.

        A request not admitted yet counts from its matched prefix.
        """
        prefix_lens = [_start_len(r) for r in reqs]
        seq_lens = [start + int(n) for start, n in zip(prefix_lens, extend_lens, strict=True)]
        return num_new_pages(prefix_lens, seq_lens, self.page_size) * self.page_size

    def can_allocate_extend(self, reqs: Sequence[ReqKV], extend_lens: Sequence[int]) -> bool:
        return self.tokens_needed(reqs, extend_lens) <= self.available_size()

    def can_allocate_decode(self, reqs: Sequence[ReqKV]) -> bool:
        return self.can_allocate_extend(reqs, [1] * len(reqs))

    # ---- request lifecycle -----------------------------------------------------------

    def match_prefix(self, req: ReqKV, *, reuse: bool = True) -> MatchResult:
        """Find the cached prefix of ``req`` (at most ``num_tokens - 1``, page-aligned).

        One token is always left to compute so the step has logits. Nothing is locked.
        ``reuse=False`` matches nothing (the tree's root): for a request whose KV cannot
        be shared because its pass attends both ways (a prefill-only request).

        Raises:
            KVMemoryError: the request already holds memory.
        """
        if req.holds_memory:
            raise KVMemoryError(f'request {req.rid!r} holds memory; match before admission')
        limit = max(req.num_tokens - 1, 0) if reuse else 0
        result = self.tree.match_prefix(req.key.prefix(limit).page_aligned(self.page_size))
        req.prefix_indices = result.device_indices
        req.last_node = result.last_node
        return result

    def admit(self, req: ReqKV) -> None:
        """Give a matched request its row and lock its prefix.

        Raises:
            KVMemoryError: duplicate id, already admitted, not matched, matched prefix
                evicted since, or the request is longer than ``max_context_len``.
            OutOfReqSlotsError: no free row (names the request).
        """
        self._check_admissible(req)
        row = self.req_to_token_pool.allocate(req.rid)
        self.tree.inc_lock_ref(req.last_node)
        prefix_len = req.prefix_len
        self.req_to_token_pool.write(row, 0, req.prefix_indices)
        req.req_pool_idx = row
        req.cache_protected_len = prefix_len
        req.kv_allocated_len = prefix_len
        req.kv_committed_len = prefix_len
        self._reqs[req.rid] = req

    def allocate_extend(self, reqs: Sequence[ReqKV], extend_lens: Sequence[int]) -> torch.Tensor:
        """Slots for the next ``extend_lens[i]`` tokens of each admitted request.

        Positions ``[kv_allocated_len, kv_allocated_len + extend_lens[i])`` get slots
        (written into the rows); evicts from the tree when free pages run short.

        Returns:
            int64 ``[sum(extend_lens)]``, the batch's ``out_cache_loc``.

        Raises:
            OutOfPagesError: not enough free + evictable pages (names the requests).
            KVMemoryError: a request is not admitted, listed twice, or would pass
                ``max_context_len``.
        """
        extend = [int(n) for n in extend_lens]
        if len(extend) != len(reqs) or (extend and min(extend) < 0):
            raise KVMemoryError(f'need one extend length >= 0 per request, got {extend_lens}')
        rows = self._rows_of(reqs)
        prefix_lens = [r.kv_allocated_len for r in reqs]
        seq_lens = [start + n for start, n in zip(prefix_lens, extend, strict=True)]
        self._check_context_len(reqs, seq_lens)
        p = self.page_size
        self._ensure_free_pages(num_new_pages(prefix_lens, seq_lens, p), reqs)
        pool = self.req_to_token_pool
        # slot of each row's last token (read at 0 for an empty row: not used there)
        last_slots = pool.slots_at(rows, [max(start - 1, 0) for start in prefix_lens])
        slots = self.allocator.extend_slots(prefix_lens, seq_lens, last_slots)
        pool.write_runs(rows, prefix_lens, extend, slots)
        for req, seq_len in zip(reqs, seq_lens, strict=True):
            req.kv_allocated_len = seq_len
            req.kv_committed_len = seq_len
        return torch.from_numpy(slots)

    def allocate_decode(self, reqs: Sequence[ReqKV]) -> torch.Tensor:
        """One slot per request for its next token (see ``allocate_extend``)."""
        return self.allocate_extend(reqs, [1] * len(reqs))

    def cache_unfinished_req(self, req: ReqKV) -> None:
        """Insert the request's KV so far (page-aligned) into the tree and keep going.

        Call after each prefill chunk, and when the prefill completes: the prompt becomes
        shareable at once. The lock moves to the new node; KV the tree already had is
        freed and the row points at the tree's copy.
        """
        self._require_admitted(req)
        key_len = self._cacheable_len(req)
        if key_len > req.cache_protected_len:
            self._insert_and_adopt(req, key_len)
        req.prefix_indices = self.req_to_token_pool.read(req.req_pool_idx, 0, req.kv_committed_len)

    def release(self, req: ReqKV, *, insert: bool, now_ns: int | None = None) -> None:
        """Free a request's memory at its end: finish (``insert=True``) or abort (False).

        With ``insert`` the committed KV (page-aligned, up to ``max_cache_len``) enters
        the tree; everything else the request owns is freed; its lock and row are
        released and its memory state reset. Its session step ends (``now_ns`` updates the
        session's idle clock). Insert only KV the model has written: a request aborted
        before its last allocated chunk ran must be released with ``insert=False``.
        """
        self._release(req, insert=insert)
        self.sessions.end_step(req, now_ns=now_ns)

    def retract(self, req: ReqKV) -> None:
        """Free a request's memory without inserting it; it goes back to waiting.

        Its tokens are kept (the re-prefill covers prompt and outputs) and it stays its
        session's active step.
        """
        self._release(req, insert=False)

    def evict(self, num_tokens: int) -> int:
        """Evict at least ``num_tokens`` unlocked cached tokens if there are that many."""
        return self.tree.evict(num_tokens)

    def check_integrity(self, live_reqs: Iterable[ReqKV] | None = None) -> None:
        """Raise ``IntegrityError`` unless pools, tree, sessions and requests agree.

        Args:
            live_reqs: every request the caller still tracks (waiting, running,
                chunked); when given, the requests holding memory must be among them.
        """
        check_kv_integrity(self, live_reqs)

    # ---- internals -------------------------------------------------------------------

    def _check_admissible(self, req: ReqKV) -> None:
        if req.rid in self._reqs:
            raise KVMemoryError(f'request id {req.rid!r} already holds memory')
        if req.holds_memory:
            raise KVMemoryError(f'request {req.rid!r} already has request slot {req.req_pool_idx}')
        if req.last_node is None:
            raise KVMemoryError(f'request {req.rid!r} is admitted before match_prefix')
        if req.last_node.is_evicted:
            raise KVMemoryError(
                f'request {req.rid!r}: its matched prefix was evicted after match_prefix; '
                f'match it again'
            )
        if req.num_tokens > self.config.max_context_len:
            raise KVMemoryError(
                f'request {req.rid!r} has {req.num_tokens} tokens, more than '
                f'max_context_len={self.config.max_context_len}'
            )

    def _require_admitted(self, req: ReqKV) -> None:
        if self._reqs.get(req.rid) is not req:
            raise _not_admitted(req)

    def _rows_of(self, reqs: Sequence[ReqKV]) -> list[int]:
        admitted = self._reqs
        rows = []
        for req in reqs:
            if admitted.get(req.rid) is not req:
                raise _not_admitted(req)
            rows.append(req.req_pool_idx)
        if len(set(rows)) != len(rows):  # admitted requests own distinct rows
            seen: set[int] = set()
            for req in reqs:
                if req.req_pool_idx in seen:
                    raise KVMemoryError(f'request {req.rid!r} is listed twice in one allocation')
                seen.add(req.req_pool_idx)
        return rows

    def _check_context_len(self, reqs: Sequence[ReqKV], seq_lens: list[int]) -> None:
        limit = self.config.max_context_len
        if seq_lens and max(seq_lens) > limit:
            i = next(i for i, n in enumerate(seq_lens) if n > limit)
            raise KVMemoryError(
                f'request {reqs[i].rid!r} would hold {seq_lens[i]} tokens, more than '
                f'max_context_len={limit}'
            )

    def _ensure_free_pages(self, num_pages: int, reqs: Sequence[ReqKV]) -> None:
        missing = num_pages - self.allocator.num_free_pages
        if missing > 0:
            self.tree.evict(missing * self.page_size)
        if num_pages > self.allocator.num_free_pages:
            rids = [r.rid for r in reqs]
            raise OutOfPagesError(
                f'requests {rids} need {num_pages} pages: {self.allocator.num_free_pages} '
                f'free, {self.evictable_size()} tokens evictable, '
                f'{self.protected_size()} protected'
            )

    def _release(self, req: ReqKV, *, insert: bool) -> None:
        self._require_admitted(req)
        if insert:
            key_len = self._cacheable_len(req)
            if key_len > req.cache_protected_len:
                self._insert_and_adopt(req, key_len)
        row = req.req_pool_idx
        self.allocator.free(
            self.req_to_token_pool.read(row, req.cache_protected_len, req.kv_allocated_len)
        )
        self.tree.dec_lock_ref(req.last_node)
        self.req_to_token_pool.free(row, req.rid)
        del self._reqs[req.rid]
        req.reset_memory_state()

    def _cacheable_len(self, req: ReqKV) -> int:
        length = min(req.kv_committed_len, req.num_tokens)
        if req.max_cache_len is not None:
            length = min(length, req.max_cache_len)
        return round_down_to_page(length, self.page_size)

    def _insert_and_adopt(self, req: ReqKV, key_len: int) -> None:
        """Insert ``row[:key_len]`` under ``key[:key_len]``; the lock moves to its node.

        ::

            0 ..... cache_protected_len ..... prefix_len (already in tree) ..... key_len
            | locked by req |  duplicates: freed, row -> tree copy  | new: tree-owned |
        """
        row, protected = req.req_pool_idx, req.cache_protected_len
        pool = self.req_to_token_pool
        result = self.tree.insert(req.key.prefix(key_len), pool.read(row, 0, key_len))
        if result.prefix_len < protected:
            raise IntegrityError(
                f'request {req.rid!r}: insert found {result.prefix_len} cached tokens, '
                f'fewer than the {protected} it holds locked'
            )
        if result.prefix_len > protected:
            self.allocator.free(pool.read(row, protected, result.prefix_len))
            canonical = self.tree.path_values(result.last_node)
            pool.write(row, protected, canonical[protected : result.prefix_len])
        self.tree.inc_lock_ref(result.last_node)
        self.tree.dec_lock_ref(req.last_node)
        req.last_node = result.last_node
        req.cache_protected_len = key_len
        if req.session_id is not None and req.session_id in self.sessions:
            self.sessions.refresh(req.session_id)


def _not_admitted(req: ReqKV) -> KVMemoryError:
    return KVMemoryError(f'request {req.rid!r} holds no memory (not admitted)')


def _start_len(req: ReqKV) -> int:
    return req.kv_allocated_len if req.holds_memory else req.prefix_len
