"""RadixCache: exact matches, splits, namespaces, LRU eviction order and locks."""

from __future__ import annotations

import pytest
import torch

from vla_sched.core.memory.kv_errors import KeyAlignmentError, LockRefError
from vla_sched.core.memory.radix_cache import InsertResult, RadixCache
from vla_sched.core.memory.radix_key import RadixKey
from vla_sched.core.memory.token_allocator import PagedTokenAllocator


def _cache(page_size: int = 1, num_pages: int = 64) -> RadixCache:
    return RadixCache(PagedTokenAllocator(num_pages=num_pages, page_size=page_size))


def _key(tokens: list[int], extra_key: object = None) -> RadixKey:
    return RadixKey(torch.tensor(tokens, dtype=torch.int64), extra_key)


def _put(cache: RadixCache, tokens: list[int], extra_key: object = None) -> InsertResult:
    """Insert like a request would: fresh pages, duplicates of cached tokens freed."""
    p = cache.page_size
    pages = cache.allocator.allocate_pages(len(tokens) // p)
    slots = (pages[:, None] * p + torch.arange(p)).reshape(-1)
    result = cache.insert(_key(tokens, extra_key), slots)
    cache.allocator.free(slots[: result.prefix_len])
    return result


def _slots(cache: RadixCache, tokens: list[int], extra_key: object = None) -> list[int]:
    return cache.match_prefix(_key(tokens, extra_key)).device_indices.tolist()


def test_match_on_empty_tree_returns_nothing_and_the_root() -> None:
    cache = _cache()
    result = cache.match_prefix(_key([1, 2, 3]))
    assert result.device_indices.numel() == 0
    assert result.last_node is cache.root


def test_insert_then_match_returns_the_inserted_slots() -> None:
    cache = _cache()
    _put(cache, [7, 8, 9, 10])
    assert _slots(cache, [7, 8, 9, 10]) == [1, 2, 3, 4]
    assert _slots(cache, [7, 8, 9, 10, 11]) == [1, 2, 3, 4]
    assert cache.evictable_size() == 4
    assert cache.protected_size() == 0


def test_partial_match_splits_the_node_and_locks_only_the_head() -> None:
    cache = _cache()
    _put(cache, [1, 2, 3, 4])
    result = cache.match_prefix(_key([1, 2, 9]))
    assert result.device_indices.tolist() == [1, 2]
    assert len(result.last_node) == 2
    assert sorted(len(n) for n in cache.iter_nodes()) == [2, 2]
    cache.inc_lock_ref(result.last_node)
    assert (cache.evictable_size(), cache.protected_size()) == (2, 2)


def test_insert_reports_the_prefix_that_was_already_cached() -> None:
    cache = _cache()
    assert _put(cache, [1, 2, 3, 4]).prefix_len == 0
    second = _put(cache, [1, 2, 5, 6])
    assert second.prefix_len == 2
    # the cached head keeps slots 1, 2; the new leaf takes 7, 8 of the fresh 5..8
    assert _slots(cache, [1, 2, 5, 6]) == [1, 2, 7, 8]
    assert cache.allocator.free_page_ids()[:2].tolist() == [5, 6]  # our duplicates
    assert cache.evictable_size() == 6


def test_namespaces_never_share_nodes() -> None:
    cache = _cache()
    _put(cache, [1, 2, 3], extra_key='widowx')
    assert _slots(cache, [1, 2, 3], extra_key='franka') == []
    assert _put(cache, [1, 2, 3], extra_key='franka').prefix_len == 0
    assert _slots(cache, [1, 2, 3], extra_key='widowx') == [1, 2, 3]
    assert _slots(cache, [1, 2, 3], extra_key='franka') == [4, 5, 6]


def test_keys_must_be_page_aligned() -> None:
    cache = _cache(page_size=16)
    with pytest.raises(KeyAlignmentError, match=r'key of 20 tokens .* page size 16'):
        cache.match_prefix(_key(list(range(20))))
    with pytest.raises(KeyAlignmentError, match='insert'):
        cache.insert(_key(list(range(20))), torch.arange(20))


def test_page_size_16_matches_whole_pages_only() -> None:
    cache = _cache(page_size=16)
    tokens = list(range(32))
    _put(cache, tokens)
    other = [*tokens[:31], 99]  # differs in the last token of page 2
    assert _slots(cache, other) == list(range(16, 32))
    assert _slots(cache, tokens) == list(range(16, 48))


def test_eviction_frees_least_recently_used_leaves_first() -> None:
    cache = _cache()
    _put(cache, [1, 1])  # pages 1, 2
    _put(cache, [2, 2])  # pages 3, 4
    _put(cache, [3, 3])  # pages 5, 6
    _slots(cache, [1, 1])  # touch the first: now the second is oldest
    assert cache.evict(1) == 2  # whole node, overshoots the request
    assert cache.allocator.free_page_ids()[:2].tolist() == [3, 4]
    assert cache.evict(2) == 2
    assert cache.allocator.free_page_ids()[:4].tolist() == [5, 6, 3, 4]
    assert _slots(cache, [1, 1]) == [1, 2]
    assert cache.evictable_size() == 2


def test_a_parent_left_childless_is_evicted_in_the_same_call() -> None:
    cache = _cache()
    _put(cache, [1, 2, 3])  # pages 1, 2, 3
    _put(cache, [1, 2, 4])  # pages 4, 5 are duplicates (freed), page 6 for the new leaf
    assert cache.evict(4) == 4
    # leaf [3] (page 3), leaf [4] (page 6; tie on access time: older node first), then
    # their parent (pages 1, 2); the free list shows the last freed first
    assert cache.allocator.free_page_ids()[:5].tolist() == [1, 2, 6, 3, 4]
    assert cache.total_size() == 0
    assert list(cache.iter_nodes()) == []


def test_page_size_16_evicts_whole_pages_in_lru_order() -> None:
    cache = _cache(page_size=16, num_pages=8)
    _put(cache, list(range(32)))  # pages 1, 2
    _put(cache, list(range(100, 116)))  # page 3
    assert cache.evict(1) == 32
    assert cache.allocator.free_page_ids()[:2].tolist() == [1, 2]
    assert _slots(cache, list(range(100, 116))) == list(range(48, 64))


def test_locked_nodes_are_never_evicted() -> None:
    cache = _cache()
    locked = _put(cache, [1, 2, 3]).last_node
    _put(cache, [1, 2, 4])
    _put(cache, [5])
    cache.inc_lock_ref(locked)
    assert (cache.evictable_size(), cache.protected_size()) == (2, 3)
    assert cache.evict(100) == 2
    assert _slots(cache, [1, 2, 3]) == [1, 2, 3]
    assert (cache.evictable_size(), cache.protected_size()) == (0, 3)
    cache.dec_lock_ref(locked)
    assert (cache.evictable_size(), cache.protected_size()) == (3, 0)
    assert cache.evict(100) == 3


def test_two_locks_on_one_node_need_two_unlocks() -> None:
    cache = _cache()
    node = _put(cache, [1, 2]).last_node
    cache.inc_lock_ref(node)
    cache.inc_lock_ref(node)
    cache.dec_lock_ref(node)
    assert cache.protected_size() == 2
    cache.dec_lock_ref(node)
    assert cache.evictable_size() == 2


def test_unlocking_below_zero_raises_naming_the_node_and_changes_nothing() -> None:
    cache = _cache()
    head = _put(cache, [1, 2]).last_node
    leaf = _put(cache, [1, 2, 3]).last_node
    cache.inc_lock_ref(head)
    with pytest.raises(LockRefError, match=rf'node {leaf.node_id} \(tokens \[2, 3\)'):
        cache.dec_lock_ref(leaf)
    assert head.lock_ref == 1
    assert (cache.evictable_size(), cache.protected_size()) == (1, 2)


def test_locking_an_evicted_node_raises() -> None:
    cache = _cache()
    node = _put(cache, [1, 2]).last_node
    cache.evict(2)
    with pytest.raises(LockRefError, match='evicted'):
        cache.inc_lock_ref(node)


def test_split_of_a_locked_node_keeps_its_locks_and_the_holders_node() -> None:
    cache = _cache()
    locked = _put(cache, [1, 2, 3, 4]).last_node
    cache.inc_lock_ref(locked)
    _put(cache, [1, 2, 9, 9])  # splits the locked node after two tokens
    assert len(locked) == 2
    assert locked.parent.lock_ref == 1
    assert (cache.evictable_size(), cache.protected_size()) == (2, 4)
    assert cache.path_values(locked).tolist() == [1, 2, 3, 4]
    cache.dec_lock_ref(locked)
    assert (cache.evictable_size(), cache.protected_size()) == (6, 0)
