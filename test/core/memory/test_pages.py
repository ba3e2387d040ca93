"""Page rounding: whole pages per length, and the new pages a batch of extends takes."""

from __future__ import annotations

import pytest

from vla_sched.core.memory.pages import (
    num_new_pages,
    num_pages_for,
    round_down_to_page,
    round_up_to_page,
)


def test_a_partly_filled_page_counts_when_rounding_up_only() -> None:
    assert [num_pages_for(n, 4) for n in (0, 1, 4, 5)] == [0, 1, 1, 2]
    assert round_up_to_page(5, 4) == 8
    assert round_down_to_page(5, 4) == 4


def test_new_pages_count_only_pages_the_prefix_did_not_reach() -> None:
    # 0 -> 4: one page; 3 -> 4 finishes a page; 4 -> 5 and 5 -> 9 each start one; 6 -> 6 none
    assert num_new_pages([0, 3, 4, 5, 6], [4, 4, 5, 9, 6], 4) == 1 + 0 + 1 + 1 + 0
    assert num_new_pages([], [], 16) == 0
    assert num_new_pages([7], [7 + 33], 1) == 33


def test_new_pages_need_one_sequence_length_per_prefix_length() -> None:
    with pytest.raises(ValueError, match='2 prefix lengths for 1 sequences'):
        num_new_pages([0, 0], [1], 4)
