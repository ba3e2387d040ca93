"""Paged allocator of KV token slots.

The KV buffers hold ``(num_pages + 1) * page_size`` token slots; slot ``s`` lies in page
``s // page_size`` at offset ``s % page_size``. Page 0 is never handed out, so a runner
may send padding writes to its slots. Pages ``1..num_pages`` live on a free stack (LIFO:
the pages freed last are reused first) and in a per-page ``is_free`` flag that catches a
page freed twice. Arguments and results are CPU torch tensors; the state and the index
arithmetic use numpy, which costs a fraction of a microsecond per op where a small torch op
costs several. ``extend_slots``, the scheduler's per-step path, takes plain ints: a decode
step of a few requests is cheapest as one Python step per request and page, a long extend
(more than ``_SMALL_EXTEND`` new slots) as a handful of array ops with no Python loop per
token or page.

Extend allocation, per request (``P`` = page size)::

    positions  0 ........ prefix_len ........ seq_len
               |  cached   | rest of the last |  new whole pages  | partial new page |
                           |  prefix page     |
    pages used: ceil(seq_len / P) - ceil(prefix_len / P) new ones
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from vla_sched.core.memory.kv_errors import DoubleFreeError, OutOfPagesError
from vla_sched.core.memory.pages import num_new_pages, num_pages_for

_SMALL_FREE = 64  # below this many pages a Python set finds duplicates faster than np.unique
_SMALL_EXTEND = 256  # up to this many new slots a loop per request beats the array ops


class PagedTokenAllocator:
    """Hands out KV pages and the token slots inside them.

    Args:
        num_pages: pages available for allocation (page ids ``1..num_pages``).
        page_size: tokens per page.
    """

    def __init__(self, *, num_pages: int, page_size: int) -> None:
        if num_pages < 1 or page_size < 1:
            raise ValueError(
                f'num_pages and page_size must be >= 1, got {num_pages} and {page_size}'
            )
        self.num_pages = num_pages
        self.page_size = page_size
        # Stack top is the end; reversed so the first allocation returns pages 1, 2, ...
        self._free_stack = np.arange(num_pages, 0, -1, dtype=np.int64)
        self._num_free = num_pages
        self._page_is_free = np.ones(num_pages + 1, dtype=np.bool_)
        self._page_is_free[0] = False

    @property
    def num_slots(self) -> int:
        """Slots the KV buffers need (page 0 included)."""
        return (self.num_pages + 1) * self.page_size

    @property
    def num_free_pages(self) -> int:
        return self._num_free

    def available_size(self) -> int:
        """Free token slots (whole free pages times the page size)."""
        return self._num_free * self.page_size

    def can_allocate(self, num_pages: int) -> bool:
        return num_pages <= self._num_free

    def allocate_pages(self, num_pages: int) -> torch.Tensor:
        """Take ``num_pages`` free pages; returns their ids as int64 ``[num_pages]``.

        Raises:
            OutOfPagesError: fewer than ``num_pages`` pages are free.
        """
        return torch.from_numpy(self._take(num_pages))

    def free_pages(self, pages: torch.Tensor) -> None:
        """Return whole pages to the free stack.

        Raises:
            ValueError: a page id is outside ``1..num_pages`` (names it).
            DoubleFreeError: a page is already free or listed twice (names it).
        """
        self._give_back(_as_numpy(pages))

    def free(self, slots: torch.Tensor) -> None:
        """Free the pages that hold ``slots`` (each page once, however many slots hit it)."""
        if slots.numel():
            self._give_back(np.unique(_as_numpy(slots) // self.page_size))

    def num_pages_needed(
        self, prefix_lens: torch.Tensor | Sequence[int], seq_lens: torch.Tensor | Sequence[int]
    ) -> int:
        """New pages that extending each request from ``prefix_lens`` to ``seq_lens`` takes."""
        return num_new_pages(_as_ints(prefix_lens), _as_ints(seq_lens), self.page_size)

    def allocate_extend(
        self,
        *,
        prefix_lens: torch.Tensor,
        seq_lens: torch.Tensor,
        last_slots: torch.Tensor,
    ) -> torch.Tensor:
        """Slots for positions ``[prefix_lens[i], seq_lens[i])`` of each request ``i``.

        A request whose prefix ends inside a page first continues that page (after
        ``last_slots[i]``, the slot of its token ``prefix_lens[i] - 1``), then takes new
        pages.

        Args:
            prefix_lens: int64 ``[B]``, tokens each request already has slots for.
            seq_lens: int64 ``[B]``, tokens it will have slots for.
            last_slots: int64 ``[B]``, slot of token ``prefix_lens[i] - 1`` (any value
                where ``prefix_lens[i] % page_size == 0``).

        Returns:
            int64 ``[sum(seq_lens - prefix_lens)]``, the new slots back to back.

        Raises:
            OutOfPagesError: too few free pages; nothing is allocated.
            ValueError: lengths or ``last_slots`` disagree.
        """
        slots = self.extend_slots(_as_ints(prefix_lens), _as_ints(seq_lens), _as_ints(last_slots))
        return torch.from_numpy(slots)

    def extend_slots(
        self, prefix_lens: Sequence[int], seq_lens: Sequence[int], last_slots: Sequence[int]
    ) -> np.ndarray:
        """``allocate_extend`` on plain ints (one per request); returns int64 numpy slots.

        The scheduler's per-step path: a batch of a few requests costs a few microseconds
        of Python here, where building and reading tensors would cost tens.

        Raises:
            OutOfPagesError: too few free pages; nothing is allocated.
            ValueError: lengths or ``last_slots`` disagree.
        """
        p = self.page_size
        if not len(prefix_lens) == len(seq_lens) == len(last_slots):
            raise ValueError(
                f'need one prefix length, sequence length and last slot per request, got '
                f'{len(prefix_lens)}, {len(seq_lens)} and {len(last_slots)}'
            )
        for i, (start, end, last) in enumerate(
            zip(prefix_lens, seq_lens, last_slots, strict=True)
        ):
            if start < 0 or end < start:
                raise ValueError(
                    f'bad lengths: prefix_lens={list(prefix_lens)}, seq_lens={list(seq_lens)}'
                )
            if end > start and start % p and last % p != (start - 1) % p:
                raise ValueError(
                    f'request {i}: last slot {last} does not sit at offset '
                    f'{(start - 1) % p} of a page (prefix_len {start}, page size {p})'
                )
        pages = self._take(num_new_pages(prefix_lens, seq_lens, p))
        if sum(seq_lens) - sum(prefix_lens) <= _SMALL_EXTEND:
            return _slots_by_request(prefix_lens, seq_lens, last_slots, pages.tolist(), p)
        prefix = np.asarray(prefix_lens, dtype=np.int64)
        seq = np.asarray(seq_lens, dtype=np.int64)
        prefix_pages = num_pages_for(prefix, p)
        return _slots_for_extend(
            prefix,
            seq - prefix,
            prefix_pages,
            num_pages_for(seq, p) - prefix_pages,
            np.asarray(last_slots, dtype=np.int64),
            pages,
            p,
        )

    def allocate_decode(self, *, seq_lens: torch.Tensor, last_slots: torch.Tensor) -> torch.Tensor:
        """One slot per request for position ``seq_lens[i]`` (the next token)."""
        return self.allocate_extend(
            prefix_lens=seq_lens, seq_lens=seq_lens + 1, last_slots=last_slots
        )

    def free_page_ids(self) -> torch.Tensor:
        """A copy of the free stack, next to be reused first."""
        return torch.from_numpy(self._free_stack[: self._num_free][::-1].copy())

    def page_is_free(self) -> torch.Tensor:
        """A copy of the per-page free flags (index 0 is the reserved page)."""
        return torch.from_numpy(self._page_is_free.copy())

    def _take(self, num_pages: int) -> np.ndarray:
        if num_pages < 0:
            raise ValueError(f'cannot allocate {num_pages} pages')
        if num_pages > self._num_free:
            raise OutOfPagesError(
                f'need {num_pages} pages, only {self._num_free} of {self.num_pages} are free'
            )
        top = self._num_free
        pages = self._free_stack[top - num_pages : top][::-1].copy()
        self._num_free = top - num_pages
        self._page_is_free[pages] = False
        return pages

    def _give_back(self, pages: np.ndarray) -> None:
        n = pages.size
        if n == 0:
            return
        if pages.min() < 1 or pages.max() > self.num_pages:
            bad = pages[(pages < 1) | (pages > self.num_pages)][0]
            raise ValueError(
                f'page {int(bad)} is outside the allocatable range 1..{self.num_pages}'
            )
        already_free = self._page_is_free[pages]
        if already_free.any():
            raise DoubleFreeError(f'page {int(pages[already_free][0])} is freed but already free')
        distinct = len(set(pages.tolist())) if n <= _SMALL_FREE else np.unique(pages).size
        if distinct != n:
            values, counts = np.unique(pages, return_counts=True)
            raise DoubleFreeError(f'page {int(values[counts > 1][0])} is freed twice in one call')
        top = self._num_free
        self._free_stack[top : top + n] = pages[::-1]
        self._num_free = top + n
        self._page_is_free[pages] = True


def _as_numpy(values: torch.Tensor) -> np.ndarray:
    return values.detach().to(torch.int64).reshape(-1).numpy()


def _as_ints(values: torch.Tensor | Sequence[int]) -> list[int]:
    if isinstance(values, torch.Tensor):
        return values.detach().to(torch.int64).reshape(-1).tolist()
    return [int(v) for v in values]


def _slots_by_request(
    prefix_lens: Sequence[int],
    seq_lens: Sequence[int],
    last_slots: Sequence[int],
    pages: list[int],
    page_size: int,
) -> np.ndarray:
    """``_slots_for_extend`` for a few tokens: one Python step per request and page."""
    slots: list[int] = []
    next_page = 0
    for start, end, last in zip(prefix_lens, seq_lens, last_slots, strict=True):
        if end - start == 1:  # one token (a decode step): the next slot, or a new page
            if start % page_size:
                slots.append(last + 1)
            else:
                slots.append(pages[next_page] * page_size)
                next_page += 1
            continue
        pos = start
        if pos % page_size and end > pos:  # finish the prefix's partial last page
            run = min(end - pos, page_size - pos % page_size)
            slots.extend(range(last + 1, last + 1 + run))
            pos += run
        while pos < end:
            base = pages[next_page] * page_size
            next_page += 1
            run = min(end - pos, page_size)
            slots.extend(range(base, base + run))
            pos += run
    return np.array(slots, dtype=np.int64)


def _slots_for_extend(
    prefix_lens: np.ndarray,
    extend_lens: np.ndarray,
    prefix_pages: np.ndarray,
    new_pages_per_req: np.ndarray,
    last_slots: np.ndarray,
    pages: np.ndarray,
    page_size: int,
) -> np.ndarray:
    num_tokens = int(extend_lens.sum())
    if num_tokens == 0:
        return np.empty(0, dtype=np.int64)
    req_of_token = np.repeat(np.arange(extend_lens.size), extend_lens)
    token_start = np.cumsum(extend_lens) - extend_lens
    pos = np.arange(num_tokens) - token_start[req_of_token] + prefix_lens[req_of_token]
    first_new_pos = prefix_pages[req_of_token] * page_size
    page = (last_slots // page_size)[req_of_token]
    if pages.size:
        in_prefix_page = pos < first_new_pos
        page_base = np.cumsum(new_pages_per_req) - new_pages_per_req
        new_idx = page_base[req_of_token] + np.maximum(pos - first_new_pos, 0) // page_size
        page = np.where(in_prefix_page, page, pages[np.minimum(new_idx, pages.size - 1)])
    return page * page_size + pos % page_size
