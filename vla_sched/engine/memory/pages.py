"""Token counts and KV pages: the one place where lengths are rounded to whole pages.

Each helper takes an int, or a numpy array or torch tensor of integer lengths (elementwise).
"""

from __future__ import annotations


def num_pages_for(num_tokens: int, page_size: int) -> int:
    """Pages needed to hold ``num_tokens`` tokens (a partly filled last page counts)."""
    return -(-num_tokens // page_size)


def round_up_to_page(num_tokens: int, page_size: int) -> int:
    """``num_tokens`` rounded up to a whole number of pages, in tokens."""
    return num_pages_for(num_tokens, page_size) * page_size


def round_down_to_page(num_tokens: int, page_size: int) -> int:
    """``num_tokens`` rounded down to a whole number of pages, in tokens."""
    return num_tokens // page_size * page_size
