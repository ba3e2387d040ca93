"""A scheduler-like driver of KVMemory for random operation sequences (not a test module).

It plays robots and plain requests through open / step / admit / prefill chunk / decode /
finish / abort / retract / evict / instruction change / close / idle reap, plus bad calls
that must raise and change nothing. A shadow KV buffer records, for every slot written,
the (namespace, key value, position) the model would have written there; every prefix the
cache serves is checked against it, so a wrong page shows up as a wrong token.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import pytest
import torch
from kv_testing import make_memory

from vla_sched.core.memory.kv_errors import (
    DoubleFreeError,
    KeyAlignmentError,
    KVMemoryError,
    LockRefError,
    OutOfPagesError,
    OutOfReqSlotsError,
    SessionError,
)
from vla_sched.core.memory.radix_key import RadixKey, build_key_tokens
from vla_sched.core.memory.req_kv import ReqKV

NUM_OPS = 19
NUM_ROBOTS = 3
MAX_LIVE_REQS = 6
NUM_PAGES = {1: 20, 4: 12, 16: 8}


@dataclass(frozen=True)
class _Image:
    content_hash: int
    token_offset: int
    num_tokens: int


@dataclass(eq=False)
class _Live:
    req: ReqKV
    decoding: bool = False


class KVMemoryDriver:
    """Applies ``(op, a, b)`` triples to a ``KVMemory`` and checks it after each."""

    def __init__(self, *, page_size: int, step_kv: str) -> None:
        p = page_size
        self.page_size = p
        self.memory = make_memory(
            page_size=p,
            num_pages=NUM_PAGES[p],
            num_req_slots=3,
            max_context_len=6 * p + 16,
            session_step_kv=step_kv,
            session_idle_timeout_s=5.0,
        )
        self.prefixes = [self._prefix(i, n) for i, n in enumerate((p + 3, 2 * p + 1, 3))]
        self.image_len = p + 2
        self.live: dict[str, _Live] = {}
        self.now_ns = 0
        self.next_rid = 0
        num_slots = self.memory.allocator.num_slots
        self.shadow = torch.full((num_slots, 3), -(1 << 62), dtype=torch.int64)
        self.namespaces: dict[object, int] = {}
        self.done: Counter[str] = Counter()

    # ---- entry point -----------------------------------------------------------------

    def apply(self, op: int, a: int, b: int) -> None:
        handlers = (  # weighted: the request lifecycle runs more often than sessions churn
            self._open,
            self._change_instruction,
            self._close,
            self._new_request,
            self._new_request,
            self._admit,
            self._admit,
            self._prefill,
            self._prefill,
            self._prefill,
            self._decode,
            self._decode,
            self._decode,
            self._finish,
            self._abort,
            self._retract,
            self._evict,
            self._tick,
            self._bad_call,
        )
        handlers[op % NUM_OPS](a, b)
        self.check()

    def check(self) -> None:
        self.memory.check_integrity([s.req for s in self.live.values()])
        p = self.page_size
        for session in self.memory.sessions.sessions():
            assert session.locked_len % p == 0
            assert session.locked_len <= len(session.prefix)
            slots = self.memory.tree.path_values(session.locked_node)
            self._check_shadow(session.prefix.prefix(session.locked_len), slots)
        for state in self.live.values():
            req = state.req
            if req.holds_memory:
                row = self.memory.req_to_token_pool.read(req.req_pool_idx, 0, req.kv_committed_len)
                self._check_shadow(req.key.prefix(req.kv_committed_len), row)

    # ---- operations ------------------------------------------------------------------

    def _open(self, a: int, b: int) -> None:
        robot = f'robot{a % NUM_ROBOTS}'
        if robot in self.memory.sessions:
            with pytest.raises(SessionError, match=robot):
                self.memory.sessions.open(robot, self.prefixes[b % 3], now_ns=self.now_ns)
            return
        self.memory.sessions.open(robot, self.prefixes[b % 3], now_ns=self.now_ns)
        self.done['open'] += 1

    def _change_instruction(self, a: int, b: int) -> None:
        robot = f'robot{a % NUM_ROBOTS}'
        if robot in self.memory.sessions:
            self.memory.sessions.change_prefix(robot, self.prefixes[b % 3], now_ns=self.now_ns)
            self.done['change_instruction'] += 1

    def _close(self, a: int, b: int) -> None:
        robot = f'robot{a % NUM_ROBOTS}'
        if robot not in self.memory.sessions:
            return
        for rid in self.memory.sessions.close(robot):
            self._drop(self.live[rid], insert=False)
        self.done['close'] += 1

    def _new_request(self, a: int, b: int) -> None:
        if len(self.live) >= MAX_LIVE_REQS:
            return
        robot = f'robot{a % NUM_ROBOTS}'
        rid = f'req{self.next_rid}'
        self.next_rid += 1
        image_hash = b % 3 + 1
        suffix = [7] * (1 + b % 3)
        if robot in self.memory.sessions:
            prefix = self.memory.sessions.get(robot).prefix
            req = self._make_req(rid, prefix, image_hash, suffix)
            self.memory.sessions.begin_step(robot, req, now_ns=self.now_ns)
        else:
            namespace = None if a % 2 else 'franka'
            req = self._make_req(rid, self.prefixes[0].prefix(2), image_hash, suffix, namespace)
        self.live[rid] = _Live(req)
        self.done['new_request'] += 1

    def _admit(self, a: int, b: int) -> None:
        waiting = [s for s in self.live.values() if not s.req.holds_memory]
        if not waiting:
            return
        req = waiting[a % len(waiting)].req
        match = self.memory.match_prefix(req)
        self._check_shadow(req.key.prefix(match.device_indices.numel()), match.device_indices)
        if not self.memory.req_to_token_pool.can_allocate():
            with pytest.raises(OutOfReqSlotsError, match=req.rid):
                self.memory.admit(req)
            return
        self.memory.admit(req)
        self.done['admit'] += 1

    def _prefill(self, a: int, b: int) -> None:
        states = [s for s in self.live.values() if s.req.holds_memory and not s.decoding]
        if not states:
            return
        state = states[a % len(states)]
        req = state.req
        p = self.page_size
        remaining = req.num_tokens - req.kv_allocated_len
        chunk = min(remaining, (max(p - 1, 1), p, 2 * p + 1, remaining)[b % 4])
        if not self._allocate([req], [chunk]):
            return
        self.memory.cache_unfinished_req(req)
        if req.kv_allocated_len == req.num_tokens:
            req.append_tokens([req.num_tokens % 5])  # the prefill's sampled token
            state.decoding = True
        self.done['prefill'] += 1

    def _decode(self, a: int, b: int) -> None:
        states = [s for s in self.live.values() if s.decoding]
        if not states:
            return
        if b % 2:
            states = [states[a % len(states)]]
        reqs = [s.req for s in states]
        limit = self.memory.config.max_context_len
        too_long = [r for r in reqs if r.kv_allocated_len + 1 > limit]
        if too_long:
            with pytest.raises(KVMemoryError, match=too_long[0].rid):
                self.memory.allocate_decode(reqs)
            self._drop(self.live[too_long[0].rid], insert=True)
            return
        if not self._allocate(reqs, [1] * len(reqs)):
            self._retract_state(states[-1])  # as retract_decode does, newest last
            return
        for req in reqs:
            req.append_tokens([req.num_tokens % 5])
        self.done['decode'] += 1

    def _finish(self, a: int, b: int) -> None:
        states = [s for s in self.live.values() if s.decoding]
        if states:
            self._drop(states[a % len(states)], insert=True)
            self.done['finish'] += 1

    def _abort(self, a: int, b: int) -> None:
        if self.live:
            states = list(self.live.values())
            self._drop(states[a % len(states)], insert=False)
            self.done['abort'] += 1

    def _retract(self, a: int, b: int) -> None:
        states = [s for s in self.live.values() if s.req.holds_memory]
        if states:
            self._retract_state(states[a % len(states)])

    def _evict(self, a: int, b: int) -> None:
        before = self.memory.num_free_tokens()
        evicted = self.memory.evict(b * self.page_size)
        assert self.memory.num_free_tokens() == before + evicted
        self.done['evict'] += int(evicted > 0)

    def _tick(self, a: int, b: int) -> None:
        self.now_ns += b * 10**9
        reaped = self.memory.sessions.reap_idle(now_ns=self.now_ns)
        assert not any(robot in self.memory.sessions for robot in reaped)
        self.done['reap'] += len(reaped)

    def _bad_call(self, a: int, b: int) -> None:
        memory = self.memory
        kind = b % 4
        if kind == 0:
            waiting = [s.req for s in self.live.values() if not s.req.holds_memory]
            if waiting:
                with pytest.raises(KVMemoryError, match=waiting[0].rid):
                    memory.release(waiting[0], insert=True)
        elif kind == 1:
            free = memory.allocator.free_page_ids()
            if free.numel():
                page = int(free[a % free.numel()])
                with pytest.raises(DoubleFreeError, match=f'page {page} '):
                    memory.allocator.free_pages(torch.tensor([page]))
        elif kind == 2:
            unlocked = [n for n in memory.tree.iter_nodes() if n.lock_ref == 0]
            if unlocked:
                with pytest.raises(LockRefError, match=f'node {unlocked[0].node_id}'):
                    memory.tree.dec_lock_ref(unlocked[0])
        elif self.page_size > 1:
            key = RadixKey(torch.arange(self.page_size + 1))
            with pytest.raises(KeyAlignmentError):
                memory.tree.insert(key, torch.arange(self.page_size + 1))
        self.done['bad_call'] += 1

    # ---- helpers ---------------------------------------------------------------------

    def _prefix(self, index: int, length: int) -> RadixKey:
        tokens = [1, 2] + [10 + index] * (length - 2)
        return RadixKey(torch.tensor(tokens[:length], dtype=torch.int64))

    def _make_req(
        self,
        rid: str,
        prefix: RadixKey,
        image_hash: int,
        suffix: list[int],
        namespace: object = None,
    ) -> ReqKV:
        head = prefix.token_ids.tolist()
        image = _Image(image_hash, len(head), self.image_len)
        tokens = head + [32000] * self.image_len + suffix
        return ReqKV(rid, RadixKey(build_key_tokens(tokens, [image]), namespace))

    def _allocate(self, reqs: list[ReqKV], lens: list[int]) -> bool:
        before = [(r.kv_allocated_len, r.kv_committed_len) for r in reqs]
        starts = [r.kv_allocated_len for r in reqs]
        try:
            slots = self.memory.allocate_extend(reqs, lens)
        except OutOfPagesError as err:
            assert all(r.rid in str(err) for r in reqs)
            assert before == [(r.kv_allocated_len, r.kv_committed_len) for r in reqs]
            self.done['out_of_pages'] += 1
            return False
        offset = 0
        for req, start, n in zip(reqs, starts, lens, strict=True):
            self._write_shadow(req, start, slots[offset : offset + n])
            offset += n
        return True

    def _retract_state(self, state: _Live) -> None:
        self.memory.retract(state.req)
        state.decoding = False
        self.done['retract'] += 1

    def _drop(self, state: _Live, *, insert: bool) -> None:
        req = state.req
        if req.holds_memory:
            self.memory.release(req, insert=insert, now_ns=self.now_ns)
        else:
            self.memory.sessions.end_step(req, now_ns=self.now_ns)
        del self.live[req.rid]

    def _namespace_id(self, key: RadixKey) -> int:
        return self.namespaces.setdefault(key.extra_key, len(self.namespaces))

    def _write_shadow(self, req: ReqKV, start: int, slots: torch.Tensor) -> None:
        n = slots.numel()
        self.shadow[slots, 0] = self._namespace_id(req.key)
        self.shadow[slots, 1] = req.key.token_ids[start : start + n]
        self.shadow[slots, 2] = torch.arange(start, start + n)

    def _check_shadow(self, key: RadixKey, slots: torch.Tensor) -> None:
        n = len(key)
        assert slots.numel() == n
        expected = torch.stack(
            [
                torch.full((n,), self._namespace_id(key), dtype=torch.int64),
                key.token_ids,
                torch.arange(n),
            ],
            dim=1,
        )
        assert torch.equal(self.shadow[slots], expected), 'the cache served KV of other tokens'
