"""Token counts and KV pages: the one place where lengths are rounded to whole pages.

Each helper but ``num_new_pages`` takes an int, or a numpy array or torch tensor of integer
lengths (elementwise).
"""

from __future__ import annotations

from collections.abc import Sequence


def num_pages_for(num_tokens: int, page_size: int) -> int:
    """Pages needed to hold ``num_tokens`` tokens (a partly filled last page counts)."""
    return -(-num_tokens // page_size)


def round_up_to_page(num_tokens: int, page_size: int) -> int:
    """``num_tokens`` rounded up to a whole number of pages, in tokens."""
    return num_pages_for(num_tokens, page_size) * page_size


def round_down_to_page(num_tokens: int, page_size: int) -> int:
    """``num_tokens`` rounded down to a whole number of pages, in tokens."""
    return num_tokens // page_size * page_size


def num_new_pages(prefix_lens: Sequence[int], seq_lens: Sequence[int], page_size: int) -> int:
    """Pages that growing each sequence from ``prefix_lens[i]`` to ``seq_lens[i]`` tokens
    adds, summed (plain ints: a batch of a few requests costs a few microseconds)."""
    if len(prefix_lens) != len(seq_lens):
        raise ValueError(f'{len(prefix_lens)} prefix lengths for {len(seq_lens)} sequences')
    # ceil(end / P) - ceil(start / P), as two sums of floor divisions (the fastest form)
    return sum([(-start) // page_size for start in prefix_lens]) - sum(
        [(-end) // page_size for end in seq_lens]
    )
