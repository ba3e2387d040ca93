"""PagedTokenAllocator: page order, partial-page continuation, frees and bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vla_sched.core.memory.kv_errors import DoubleFreeError, OutOfPagesError
from vla_sched.core.memory.token_allocator import PagedTokenAllocator

pytestmark = pytest.mark.slow  # seconds or more: not in the fast tier


def _t(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


def test_first_allocation_takes_pages_in_order_and_never_page_zero() -> None:
    alloc = PagedTokenAllocator(num_pages=4, page_size=4)
    assert alloc.num_slots == 20
    assert alloc.allocate_pages(4).tolist() == [1, 2, 3, 4]
    assert alloc.num_free_pages == 0
    assert alloc.available_size() == 0


def test_extend_from_empty_prefix_uses_whole_pages() -> None:
    alloc = PagedTokenAllocator(num_pages=8, page_size=4)
    slots = alloc.allocate_extend(prefix_lens=_t([0]), seq_lens=_t([6]), last_slots=_t([0]))
    assert slots.tolist() == [4, 5, 6, 7, 8, 9]
    assert alloc.num_free_pages == 6


def test_extend_continues_partial_last_page_before_taking_new_pages() -> None:
    alloc = PagedTokenAllocator(num_pages=8, page_size=4)
    first = alloc.allocate_extend(prefix_lens=_t([0]), seq_lens=_t([6]), last_slots=_t([0]))
    more = alloc.allocate_extend(
        prefix_lens=_t([6]), seq_lens=_t([11]), last_slots=first[-1:].clone()
    )
    # slots 10, 11 finish page 2; then page 3 (slots 12..14)
    assert more.tolist() == [10, 11, 12, 13, 14]
    assert alloc.num_free_pages == 5


def test_batch_extend_consumes_exactly_the_new_pages_of_each_request() -> None:
    alloc = PagedTokenAllocator(num_pages=16, page_size=4)
    prefix_lens, seq_lens = _t([0, 5, 8]), _t([3, 9, 8])
    # request 1 ends its prefix at offset 0 of page 5 (slot 20); request 2 extends by 0
    last = _t([0, 20, 0])
    assert alloc.num_pages_needed(prefix_lens, seq_lens) == 1 + 1 + 0
    slots = alloc.allocate_extend(prefix_lens=prefix_lens, seq_lens=seq_lens, last_slots=last)
    assert slots.tolist() == [4, 5, 6, 21, 22, 23, 8]
    assert alloc.num_free_pages == 14


def test_decode_takes_a_new_page_only_at_a_page_boundary() -> None:
    alloc = PagedTokenAllocator(num_pages=4, page_size=2)
    inside = alloc.allocate_decode(seq_lens=_t([1]), last_slots=_t([6]))
    assert inside.tolist() == [7]
    assert alloc.num_free_pages == 4
    boundary = alloc.allocate_decode(seq_lens=_t([2]), last_slots=_t([7]))
    assert boundary.tolist() == [2]
    assert alloc.num_free_pages == 3


def test_page_size_one_hands_out_one_slot_per_page() -> None:
    alloc = PagedTokenAllocator(num_pages=5, page_size=1)
    slots = alloc.allocate_extend(
        prefix_lens=_t([0, 2]), seq_lens=_t([2, 3]), last_slots=_t([0, 9])
    )
    assert slots.tolist() == [1, 2, 3]


def test_freed_pages_are_reused_first_in_their_order() -> None:
    alloc = PagedTokenAllocator(num_pages=6, page_size=4)
    alloc.allocate_pages(6)
    alloc.free_pages(_t([5, 2]))
    alloc.free(_t([12, 13, 14]))  # three slots of page 3: page 3 freed once
    assert alloc.free_page_ids().tolist() == [3, 5, 2]
    assert alloc.allocate_pages(2).tolist() == [3, 5]


def test_freeing_a_free_page_raises_and_names_it() -> None:
    alloc = PagedTokenAllocator(num_pages=4, page_size=1)
    alloc.allocate_pages(2)
    with pytest.raises(DoubleFreeError, match='page 3 is freed but already free'):
        alloc.free_pages(_t([1, 3]))
    assert alloc.num_free_pages == 2  # nothing freed


def test_freeing_a_page_twice_in_one_call_raises() -> None:
    alloc = PagedTokenAllocator(num_pages=4, page_size=1)
    alloc.allocate_pages(3)
    with pytest.raises(DoubleFreeError, match='page 2 is freed twice'):
        alloc.free_pages(_t([2, 1, 2]))


def test_freeing_the_reserved_page_raises() -> None:
    alloc = PagedTokenAllocator(num_pages=4, page_size=1)
    with pytest.raises(ValueError, match='page 0 is outside'):
        alloc.free_pages(_t([0]))


def test_allocation_beyond_free_pages_raises_and_allocates_nothing() -> None:
    alloc = PagedTokenAllocator(num_pages=3, page_size=4)
    with pytest.raises(OutOfPagesError, match='need 4 pages, only 3'):
        alloc.allocate_extend(prefix_lens=_t([0]), seq_lens=_t([13]), last_slots=_t([0]))
    assert alloc.num_free_pages == 3


def test_last_slot_at_wrong_page_offset_is_rejected() -> None:
    alloc = PagedTokenAllocator(num_pages=3, page_size=4)
    with pytest.raises(ValueError, match='does not sit at offset 1'):
        alloc.allocate_extend(prefix_lens=_t([2]), seq_lens=_t([3]), last_slots=_t([6]))


def _expected_slots(
    prefix_lens: list[int], seq_lens: list[int], last_slots: list[int], pages: list[int], p: int
) -> list[int]:
    """The layout, token by token: finish the prefix's partial page, then fresh pages."""
    slots, pages = [], list(pages)
    for start, end, last in zip(prefix_lens, seq_lens, last_slots, strict=True):
        page = last // p if start % p else None
        for pos in range(start, end):
            if pos % p == 0:
                page = pages.pop(0)
            slots.append(page * p + pos % p)
    return slots


@settings(max_examples=200, deadline=None)
@given(
    page_size=st.sampled_from([1, 3, 16]),
    rows=st.lists(st.tuples(st.integers(0, 40), st.integers(0, 120)), min_size=1, max_size=8),
)
def test_short_and_long_extends_lay_out_slots_token_by_token(
    page_size: int, rows: list[tuple[int, int]]
) -> None:
    # Up to 8 rows of up to 120 new tokens: batches on both sides of the size where the
    # allocator switches from a loop per request to array arithmetic.
    alloc = PagedTokenAllocator(num_pages=1000, page_size=page_size)
    alloc.allocate_pages(7)  # a used region, so the last slots below sit in real pages
    prefix_lens = [start for start, _ in rows]
    seq_lens = [start + extend for start, extend in rows]
    last_slots = [3 * page_size + (start - 1) % page_size for start in prefix_lens]
    num_pages = alloc.num_pages_needed(prefix_lens, seq_lens)
    upcoming = alloc.free_page_ids()[:num_pages].tolist()
    slots = alloc.extend_slots(prefix_lens, seq_lens, last_slots)
    assert slots.dtype == np.int64
    assert slots.tolist() == _expected_slots(
        prefix_lens, seq_lens, last_slots, upcoming, page_size
    )
    assert alloc.num_free_pages == 1000 - 7 - num_pages


def test_long_extend_continues_the_partial_page_like_a_short_one() -> None:
    alloc = PagedTokenAllocator(num_pages=64, page_size=16)
    alloc.allocate_pages(2)
    slots = alloc.allocate_extend(
        prefix_lens=_t([5, 0]), seq_lens=_t([305, 3]), last_slots=_t([36, 0])
    )
    assert slots.numel() == 303
    assert slots[:11].tolist() == list(range(37, 48))  # rest of page 2 after slot 36
    assert slots[11:27].tolist() == list(range(48, 64))  # then page 3, the next free one
    assert slots[300:].tolist() == [22 * 16, 22 * 16 + 1, 22 * 16 + 2]  # pages 3..21, 22
    assert alloc.num_free_pages == 64 - 2 - 20


def test_extend_slots_needs_one_length_and_last_slot_per_request() -> None:
    alloc = PagedTokenAllocator(num_pages=4, page_size=4)
    with pytest.raises(ValueError, match='one prefix length, sequence length and last slot'):
        alloc.extend_slots([0, 0], [1], [0, 0])
    with pytest.raises(ValueError, match='bad lengths'):
        alloc.extend_slots([2], [1], [1])
    assert alloc.num_free_pages == 4
