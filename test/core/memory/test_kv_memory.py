"""KVMemory: admission, extend/decode allocation, caching, release and bad input."""

from __future__ import annotations

import pytest
from kv_testing import decode, make_memory, prefill

from vla_sched.core.memory.kv_errors import KVMemoryError, OutOfPagesError, OutOfReqSlotsError
from vla_sched.core.memory.req_kv import ReqKV


def _req(rid: str, tokens: list[int]) -> ReqKV:
    return ReqKV.from_prompt(rid, tokens)


def test_admit_writes_the_matched_prefix_into_the_row_and_locks_it() -> None:
    memory = make_memory()
    a = _req('a', list(range(1, 9)))
    assert prefill(memory, a).tolist() == list(range(1, 9))
    memory.release(a, insert=True)
    b = _req('b', [*range(1, 9), 9, 10])
    assert memory.match_prefix(b).device_indices.tolist() == list(range(1, 9))
    memory.admit(b)
    pool = memory.req_to_token_pool
    assert pool.read(b.req_pool_idx, 0, 8).tolist() == list(range(1, 9))
    assert (b.cache_protected_len, b.kv_allocated_len, b.kv_committed_len) == (8, 8, 8)
    assert (memory.evictable_size(), memory.protected_size()) == (0, 8)
    memory.check_integrity([b])


@pytest.mark.parametrize(('page_size', 'matched'), [(1, 7), (4, 4)])
def test_a_full_cache_hit_still_leaves_one_token_to_compute(page_size: int, matched: int) -> None:
    memory = make_memory(page_size=page_size)
    a = _req('a', list(range(8)))
    prefill(memory, a)
    memory.release(a, insert=True)
    b = _req('b', list(range(8)))
    assert memory.match_prefix(b).device_indices.numel() == matched


def test_extend_slots_are_the_batch_out_cache_loc_and_land_in_the_rows() -> None:
    memory = make_memory(page_size=4)
    a, b = _req('a', [1, 2, 3]), _req('b', [4, 5, 6, 7, 8])
    for req in (a, b):
        memory.match_prefix(req)
        memory.admit(req)
    out = memory.allocate_extend([a, b], [3, 5])
    assert out.tolist() == [4, 5, 6, 8, 9, 10, 11, 12]
    pool = memory.req_to_token_pool
    assert pool.read(a.req_pool_idx, 0, 3).tolist() == [4, 5, 6]
    assert pool.read(b.req_pool_idx, 0, 5).tolist() == [8, 9, 10, 11, 12]
    memory.check_integrity([a, b])


def test_chunked_prefill_caches_each_chunk_and_continues_the_partial_page() -> None:
    memory = make_memory(page_size=4)
    req = _req('a', list(range(10)))
    memory.match_prefix(req)
    memory.admit(req)
    assert memory.allocate_extend([req], [6]).tolist() == [4, 5, 6, 7, 8, 9]
    memory.cache_unfinished_req(req)
    assert req.cache_protected_len == 4
    assert (memory.evictable_size(), memory.protected_size()) == (0, 4)
    memory.check_integrity([req])
    assert memory.allocate_extend([req], [4]).tolist() == [10, 11, 12, 13]
    memory.cache_unfinished_req(req)
    assert req.cache_protected_len == 8
    assert req.prefix_indices.tolist() == list(range(4, 14))
    assert memory.protected_size() == 8
    memory.check_integrity([req])


def test_duplicate_prefill_frees_the_copy_and_points_the_row_at_the_tree() -> None:
    memory = make_memory(num_pages=16)
    a, b = _req('a', list(range(6))), _req('b', list(range(6)))
    for req in (a, b):
        memory.match_prefix(req)
        memory.admit(req)
    memory.allocate_extend([a, b], [6, 6])
    memory.cache_unfinished_req(a)
    memory.cache_unfinished_req(b)
    pool = memory.req_to_token_pool
    assert pool.read(b.req_pool_idx, 0, 6).tolist() == list(range(1, 7))
    assert memory.allocator.free_page_ids()[:6].tolist() == list(range(7, 13))
    assert memory.protected_size() == 6
    memory.check_integrity([a, b])


def test_finish_inserts_prompt_and_outputs_and_frees_the_unaligned_tail() -> None:
    memory = make_memory(page_size=4, num_pages=8)
    req = _req('a', list(range(10)))
    prefill(memory, req)
    decode(memory, req, num_steps=3)
    assert (req.kv_committed_len, req.num_tokens) == (13, 14)
    memory.release(req, insert=True)
    assert req.req_pool_idx is None
    assert (memory.evictable_size(), memory.protected_size()) == (12, 0)
    assert memory.allocator.num_free_pages == 5
    memory.check_integrity([])


def test_abort_frees_the_requests_kv_and_unlocks_its_prefix() -> None:
    memory = make_memory(num_pages=16)
    a = _req('a', list(range(5)))
    prefill(memory, a)
    memory.release(a, insert=True)
    b = _req('b', [*range(5), 7, 7])
    prefill(memory, b)
    assert (memory.evictable_size(), memory.protected_size()) == (0, 7)
    memory.release(b, insert=False)
    assert (memory.evictable_size(), memory.protected_size()) == (7, 0)
    assert memory.allocator.num_free_pages == 16 - 7
    memory.check_integrity([])


def test_abort_before_the_prefill_is_cached_frees_everything_it_allocated() -> None:
    memory = make_memory(num_pages=16)
    req = _req('a', list(range(5)))
    memory.match_prefix(req)
    memory.admit(req)
    memory.allocate_extend([req], [5])
    memory.release(req, insert=False)
    assert memory.allocator.num_free_pages == 16
    assert memory.evictable_size() == 0
    memory.check_integrity([])


def test_retract_keeps_tokens_and_a_rematch_finds_the_cached_prompt() -> None:
    memory = make_memory(page_size=4, num_pages=8)
    req = _req('a', list(range(9)))
    prefill(memory, req)
    decode(memory, req, num_steps=2)
    memory.retract(req)
    assert not req.holds_memory
    assert req.num_tokens == 12
    assert (memory.evictable_size(), memory.protected_size()) == (8, 0)
    memory.check_integrity([req])
    assert memory.match_prefix(req).device_indices.tolist() == list(range(4, 12))


def test_allocation_evicts_the_least_recently_used_cache_when_pages_run_short() -> None:
    memory = make_memory(num_pages=8)
    old, newer = _req('old', [1, 1, 1, 1]), _req('newer', [2, 2])
    for req in (old, newer):
        prefill(memory, req)
        memory.release(req, insert=True)
    big = _req('big', [3, 3, 3, 3, 3])
    memory.match_prefix(big)
    memory.admit(big)
    memory.allocate_extend([big], [5])  # 2 free, evicts the older entry (4 pages)
    assert memory.match_prefix(_req('probe', [1, 1, 1, 1])).device_indices.numel() == 0
    assert memory.match_prefix(_req('probe', [2, 2, 9])).device_indices.tolist() == [5, 6]
    memory.check_integrity([big])


def test_out_of_pages_names_the_requests_and_changes_nothing() -> None:
    memory = make_memory(num_pages=8)
    a = _req('a', list(range(6)))
    prefill(memory, a)
    b = _req('b', [9, 9, 9, 9, 9])
    memory.match_prefix(b)
    memory.admit(b)
    assert not memory.can_allocate_extend([b], [5])
    with pytest.raises(OutOfPagesError, match=r"requests \['b'\] need 5 pages: 2 free"):
        memory.allocate_extend([b], [5])
    assert b.kv_allocated_len == 0
    assert memory.allocator.num_free_pages == 2
    memory.check_integrity([a, b])


def test_more_requests_than_slots_raises_naming_the_request_and_takes_no_lock() -> None:
    memory = make_memory(num_req_slots=1)
    a = _req('a', [1, 2, 3])
    prefill(memory, a)
    memory.release(a, insert=True)
    b, c = _req('b', [1, 2, 3, 4]), _req('c', [1, 2, 3, 5])
    memory.match_prefix(b)
    memory.admit(b)
    memory.match_prefix(c)
    with pytest.raises(OutOfReqSlotsError, match="request 'c'"):
        memory.admit(c)
    assert not c.holds_memory
    assert memory.protected_size() == 3
    memory.check_integrity([b, c])


def test_admitting_after_the_matched_prefix_was_evicted_asks_for_a_new_match() -> None:
    memory = make_memory()
    a = _req('a', [1, 2, 3])
    prefill(memory, a)
    memory.release(a, insert=True)
    b = _req('b', [1, 2, 3, 4])
    memory.match_prefix(b)
    memory.evict(100)
    with pytest.raises(KVMemoryError, match=r"request 'b'.*evicted.*match it again"):
        memory.admit(b)
    memory.match_prefix(b)
    memory.admit(b)
    assert b.kv_allocated_len == 0
    memory.check_integrity([b])


def test_request_longer_than_the_context_is_rejected_naming_it() -> None:
    memory = make_memory(max_context_len=8)
    long_req = _req('long', list(range(9)))
    memory.match_prefix(long_req)
    with pytest.raises(KVMemoryError, match="request 'long' has 9 tokens"):
        memory.admit(long_req)
    req = _req('a', list(range(8)))
    prefill(memory, req)
    req.append_tokens([1])
    with pytest.raises(KVMemoryError, match="request 'a' would hold 9 tokens"):
        memory.allocate_decode([req])
    memory.check_integrity([req])


def test_releasing_twice_or_matching_an_admitted_request_raises() -> None:
    memory = make_memory()
    req = _req('a', [1, 2, 3])
    prefill(memory, req)
    with pytest.raises(KVMemoryError, match="request 'a' holds memory"):
        memory.match_prefix(req)
    memory.release(req, insert=False)
    with pytest.raises(KVMemoryError, match="request 'a' holds no memory"):
        memory.release(req, insert=False)
    memory.check_integrity([])


def test_a_request_listed_twice_in_one_allocation_is_rejected() -> None:
    memory = make_memory()
    req = _req('a', [1, 2, 3])
    prefill(memory, req)
    with pytest.raises(KVMemoryError, match="request 'a' is listed twice"):
        memory.allocate_decode([req, req])


def test_budget_helpers_count_free_plus_evictable_and_partial_pages() -> None:
    memory = make_memory(page_size=4, num_pages=8)
    a = _req('a', list(range(6)))
    prefill(memory, a)  # pages 1, 2; first page cached and locked
    assert memory.available_size() == 6 * 4
    assert memory.num_req_held_tokens() == 4
    # a continues its partial page: 2 more tokens fit, the third needs a new page
    assert memory.tokens_needed([a], [2]) == 0
    assert memory.tokens_needed([a], [3]) == 4
    fresh = _req('b', list(range(100, 109)))
    assert memory.tokens_needed([fresh], [9]) == 12
    memory.release(a, insert=True)
    assert (memory.available_size(), memory.evictable_size()) == (32, 4)
