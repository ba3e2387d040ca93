"""Paged allocator of KV token slots.

The KV buffers hold ``(num_pages + 1) * page_size`` token slots; slot ``s`` lies in page
``s // page_size`` at offset ``s % page_size``. Page 0 is never handed out, so a runner
may send padding writes to its slots. Pages ``1..num_pages`` live on a free stack (LIFO:
the pages freed last are reused first) and in a per-page ``is_free`` flag that catches a
page freed twice. Every operation is a handful of tensor ops over the batch: no Python
loop runs per token or per page.

Extend allocation, per request (``P`` = page size)::

    positions  0 ........ prefix_len ........ seq_len
               |  cached   | rest of the last |  new whole pages  | partial new page |
                           |  prefix page     |
    pages used: ceil(seq_len / P) - ceil(prefix_len / P) new ones
"""

from __future__ import annotations

import torch

from vla_sched.engine.kv_errors import DoubleFreeError, OutOfPagesError


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
        self._free_stack = torch.arange(num_pages, 0, -1, dtype=torch.int64)
        self._num_free = num_pages
        self._page_is_free = torch.ones(num_pages + 1, dtype=torch.bool)
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
        if num_pages < 0:
            raise ValueError(f'cannot allocate {num_pages} pages')
        if num_pages > self._num_free:
            raise OutOfPagesError(
                f'need {num_pages} pages, only {self._num_free} of {self.num_pages} are free'
            )
        top = self._num_free
        pages = self._free_stack[top - num_pages : top].flip(0).clone()
        self._num_free = top - num_pages
        self._page_is_free[pages] = False
        return pages

    def free_pages(self, pages: torch.Tensor) -> None:
        """Return whole pages to the free stack.

        Raises:
            ValueError: a page id is outside ``1..num_pages`` (names it).
            DoubleFreeError: a page is already free or listed twice (names it).
        """
        pages = pages.to(torch.int64).reshape(-1)
        if pages.numel() == 0:
            return
        bad = (pages < 1) | (pages > self.num_pages)
        if bool(bad.any()):
            page = int(pages[bad][0])
            raise ValueError(f'page {page} is outside the allocatable range 1..{self.num_pages}')
        already_free = self._page_is_free[pages]
        if bool(already_free.any()):
            raise DoubleFreeError(f'page {int(pages[already_free][0])} is freed but already free')
        if torch.unique(pages).numel() != pages.numel():
            sorted_pages = torch.sort(pages).values
            dup = sorted_pages[1:][sorted_pages[1:] == sorted_pages[:-1]]
            raise DoubleFreeError(f'page {int(dup[0])} is freed twice in one call')
        top = self._num_free
        self._free_stack[top : top + pages.numel()] = pages.flip(0)
        self._num_free = top + pages.numel()
        self._page_is_free[pages] = True

    def free(self, slots: torch.Tensor) -> None:
        """Free the pages that hold ``slots`` (each page once, however many slots hit it)."""
        if slots.numel() == 0:
            return
        self.free_pages(torch.unique(slots.to(torch.int64) // self.page_size))

    def num_pages_needed(self, prefix_lens: torch.Tensor, seq_lens: torch.Tensor) -> int:
        """New pages that extending each request from ``prefix_lens`` to ``seq_lens`` takes."""
        p = self.page_size
        return int(((seq_lens + p - 1) // p - (prefix_lens + p - 1) // p).sum())

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
        p = self.page_size
        extend_lens = seq_lens - prefix_lens
        if bool((extend_lens < 0).any()) or bool((prefix_lens < 0).any()):
            raise ValueError(
                f'bad lengths: prefix_lens={prefix_lens.tolist()}, seq_lens={seq_lens.tolist()}'
            )
        partial = (prefix_lens % p != 0) & (extend_lens > 0)
        if bool(partial.any()):
            mismatch = partial & (last_slots % p != (prefix_lens - 1) % p)
            if bool(mismatch.any()):
                i = int(mismatch.nonzero()[0])
                raise ValueError(
                    f'request {i}: last slot {int(last_slots[i])} does not sit at offset '
                    f'{int((prefix_lens[i] - 1) % p)} of a page (prefix_len '
                    f'{int(prefix_lens[i])}, page size {p})'
                )
        prefix_pages = (prefix_lens + p - 1) // p
        new_pages_per_req = (seq_lens + p - 1) // p - prefix_pages
        pages = self.allocate_pages(int(new_pages_per_req.sum()))
        return _slots_for_extend(
            prefix_lens, extend_lens, prefix_pages, new_pages_per_req, last_slots, pages, p
        )

    def allocate_decode(self, *, seq_lens: torch.Tensor, last_slots: torch.Tensor) -> torch.Tensor:
        """One slot per request for position ``seq_lens[i]`` (the next token)."""
        return self.allocate_extend(
            prefix_lens=seq_lens, seq_lens=seq_lens + 1, last_slots=last_slots
        )

    def free_page_ids(self) -> torch.Tensor:
        """A copy of the free stack, next to be reused first."""
        return self._free_stack[: self._num_free].flip(0).clone()

    def page_is_free(self) -> torch.Tensor:
        """A copy of the per-page free flags (index 0 is the reserved page)."""
        return self._page_is_free.clone()


def _slots_for_extend(
    prefix_lens: torch.Tensor,
    extend_lens: torch.Tensor,
    prefix_pages: torch.Tensor,
    new_pages_per_req: torch.Tensor,
    last_slots: torch.Tensor,
    pages: torch.Tensor,
    page_size: int,
) -> torch.Tensor:
    num_tokens = int(extend_lens.sum())
    if num_tokens == 0:
        return torch.empty(0, dtype=torch.int64)
    req_of_token = torch.repeat_interleave(torch.arange(extend_lens.numel()), extend_lens)
    token_start = torch.cumsum(extend_lens, 0) - extend_lens
    pos = torch.arange(num_tokens) - token_start[req_of_token] + prefix_lens[req_of_token]
    first_new_pos = prefix_pages[req_of_token] * page_size
    in_prefix_page = pos < first_new_pos
    page = (last_slots // page_size)[req_of_token]
    if pages.numel() > 0:
        page_base = torch.cumsum(new_pages_per_req, 0) - new_pages_per_req
        new_idx = page_base[req_of_token] + (pos - first_new_pos).clamp(min=0) // page_size
        page = torch.where(in_prefix_page, page, pages[new_idx.clamp(max=pages.numel() - 1)])
    return page * page_size + pos % page_size
