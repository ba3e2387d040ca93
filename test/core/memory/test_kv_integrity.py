"""check_integrity: passes on a healthy state and names each kind of corruption."""

from __future__ import annotations

import pytest
import torch
from kv_testing import make_memory, prefill

from vla_sched.core.memory.kv_errors import IntegrityError
from vla_sched.core.memory.kv_memory import KVMemory
from vla_sched.core.memory.radix_key import RadixKey
from vla_sched.core.memory.req_kv import ReqKV


@pytest.fixture
def state() -> tuple[KVMemory, ReqKV, ReqKV]:
    """A cached finished request, a session, and a running step with a partial page."""
    memory = make_memory(page_size=4, num_pages=32, session_step_kv='insert')
    done = ReqKV.from_prompt('done', list(range(50, 62)))
    prefill(memory, done)
    memory.release(done, insert=True)
    memory.sessions.open('r1', RadixKey(torch.arange(100, 108)), now_ns=0)
    waiting = ReqKV.from_prompt('waiting', [*range(100, 108), 3])
    memory.sessions.begin_step('r1', waiting, now_ns=0)
    running = ReqKV.from_prompt('running', [*range(100, 108), 1, 2, 3, 4, 5, 6])
    memory.sessions.begin_step('r1', running, now_ns=0)
    prefill(memory, running)
    return memory, running, waiting


def test_a_healthy_state_passes(state: tuple[KVMemory, ReqKV, ReqKV]) -> None:
    memory, running, waiting = state
    memory.check_integrity([running, waiting])
    memory.check_integrity()


def test_a_leaked_page_is_named(state: tuple[KVMemory, ReqKV, ReqKV]) -> None:
    memory, running, waiting = state
    page = int(memory.allocator.allocate_pages(1)[0])
    with pytest.raises(IntegrityError, match=f'page {page} is leaked: owned by nobody'):
        memory.check_integrity([running, waiting])


def test_a_page_both_cached_and_free_is_named(state: tuple[KVMemory, ReqKV, ReqKV]) -> None:
    memory, running, waiting = state
    node = next(n for n in memory.tree.iter_nodes() if n.lock_ref == 0)
    page = int(node.value[0]) // 4
    memory.allocator.free_pages(torch.tensor([page]))
    with pytest.raises(
        IntegrityError, match=rf"page {page} is owned 2 times \['free list', 'node"
    ):
        memory.check_integrity([running, waiting])


def test_a_page_held_by_a_request_and_the_tree_is_named(
    state: tuple[KVMemory, ReqKV, ReqKV],
) -> None:
    memory, running, waiting = state
    pool = memory.req_to_token_pool
    cached = next(n for n in memory.tree.iter_nodes() if n.lock_ref == 0)
    own_start = running.cache_protected_len
    pool.write(running.req_pool_idx, own_start, cached.value[:4])
    with pytest.raises(IntegrityError, match=r"owned 2 times .*request 'running'"):
        memory.check_integrity([running, waiting])


def test_a_stray_lock_is_named(state: tuple[KVMemory, ReqKV, ReqKV]) -> None:
    memory, running, waiting = state
    node = next(n for n in memory.tree.iter_nodes() if n.lock_ref == 0)
    memory.tree.inc_lock_ref(node)
    with pytest.raises(IntegrityError, match=rf'node {node.node_id} .* has lock_ref 1, but 0'):
        memory.check_integrity([running, waiting])


def test_a_lost_session_lock_is_named(state: tuple[KVMemory, ReqKV, ReqKV]) -> None:
    memory, running, waiting = state
    memory.tree.dec_lock_ref(memory.sessions.get('r1').locked_node)
    with pytest.raises(IntegrityError, match=r"lock_ref 1, but 2 .*\[\"request 'running'\""):
        memory.check_integrity([running, waiting])


def test_a_request_holding_memory_but_not_live_is_a_leak(
    state: tuple[KVMemory, ReqKV, ReqKV],
) -> None:
    memory, _, waiting = state
    with pytest.raises(IntegrityError, match=r"request 'running' holds memory but is not live"):
        memory.check_integrity([waiting])


def test_an_active_session_step_that_is_not_live_is_named(
    state: tuple[KVMemory, ReqKV, ReqKV],
) -> None:
    memory, running, _ = state
    with pytest.raises(IntegrityError, match=r"robot 'r1': step 'waiting' is active but not"):
        memory.check_integrity([running])


def test_a_row_pointing_away_from_the_tree_is_named(
    state: tuple[KVMemory, ReqKV, ReqKV],
) -> None:
    memory, running, waiting = state
    memory.req_to_token_pool.req_to_token[running.req_pool_idx, 1] = 0
    with pytest.raises(
        IntegrityError, match=r"request 'running': row \d+ position 1 holds slot 0"
    ):
        memory.check_integrity([running, waiting])


def test_a_broken_page_run_in_a_row_is_named(state: tuple[KVMemory, ReqKV, ReqKV]) -> None:
    memory, running, waiting = state
    pool = memory.req_to_token_pool
    start = running.cache_protected_len
    slots = pool.read(running.req_pool_idx, start, running.kv_allocated_len)
    pool.write(running.req_pool_idx, start, slots.flip(0))
    with pytest.raises(IntegrityError, match=r"request 'running': slot \d+ at position 0 breaks"):
        memory.check_integrity([running, waiting])


def test_a_request_slot_owned_by_a_dead_request_is_named(
    state: tuple[KVMemory, ReqKV, ReqKV],
) -> None:
    memory, running, waiting = state
    row = memory.req_to_token_pool.allocate('ghost')
    with pytest.raises(IntegrityError, match=f"request slot {row} is owned by 'ghost'"):
        memory.check_integrity([running, waiting])


def test_tampered_tree_counters_are_caught(state: tuple[KVMemory, ReqKV, ReqKV]) -> None:
    memory, running, waiting = state
    memory.tree._evictable_size += 4
    with pytest.raises(IntegrityError, match='tree counters say'):
        memory.check_integrity([running, waiting])


def test_a_free_flag_out_of_step_with_the_free_list_is_caught(
    state: tuple[KVMemory, ReqKV, ReqKV],
) -> None:
    memory, running, waiting = state
    memory.allocator._page_is_free[1] = not bool(memory.allocator._page_is_free[1])
    with pytest.raises(IntegrityError, match='page 1: free flag and free list disagree'):
        memory.check_integrity([running, waiting])
