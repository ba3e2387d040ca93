"""Helpers for the model tests: a paged slot table and ForwardBatch construction."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from vla_sched.core.forward_batch import ForwardBatch, ForwardMode, ImageInput, SamplingParams


class PagedSlots:
    """A slot table whose pages are handed out in a shuffled order (as a busy pool would).

    Row ``r`` of ``req_to_token`` lists the KV slots of request row ``r``; slots come in
    pages of ``page_size`` consecutive slots, the pages in random order.
    """

    def __init__(
        self,
        *,
        num_rows: int = 8,
        max_context_len: int = 256,
        page_size: int = 4,
        num_pages: int = 256,
        seed: int = 0,
    ) -> None:
        self.page_size = page_size
        self.num_slots = page_size * num_pages
        self.req_to_token = torch.zeros(num_rows, max_context_len, dtype=torch.int32)
        order = np.random.default_rng(seed).permutation(num_pages)
        self._free_pages = [int(p) for p in order]
        self._lens = [0] * num_rows
        self._row_pages: dict[int, list[int]] = {}

    def ensure(self, row: int, seq_len: int) -> None:
        """Give row ``row`` slots for positions ``0..seq_len-1``."""
        while self._lens[row] < seq_len:
            offset = self._lens[row] % self.page_size
            if offset == 0:
                self._row_pages.setdefault(row, []).append(self._free_pages.pop())
            page = self._row_pages[row][-1]
            self.req_to_token[row, self._lens[row]] = page * self.page_size + offset
            self._lens[row] += 1


@dataclass
class Step:
    """One request's part of a batch: its row, all its tokens, and the new range."""

    rid: str
    row: int
    token_ids: Sequence[int]
    prefix_len: int
    seq_len: int
    images: tuple[ImageInput, ...] = ()
    sample: bool = True
    sampling: SamplingParams = field(default_factory=lambda: SamplingParams(0, 520))


def make_batch(slots: PagedSlots, steps: Sequence[Step], *, decode: bool = False) -> ForwardBatch:
    """Allocate the steps' slots and describe them as a ForwardBatch."""
    input_ids, locations = [], []
    for step in steps:
        slots.ensure(step.row, step.seq_len)
        input_ids.extend(step.token_ids[step.prefix_len : step.seq_len])
        locations.append(slots.req_to_token[step.row, step.prefix_len : step.seq_len])
    prefix = torch.tensor([s.prefix_len for s in steps], dtype=torch.int64)
    seq = torch.tensor([s.seq_len for s in steps], dtype=torch.int64)
    return ForwardBatch(
        forward_mode=ForwardMode.DECODE if decode else ForwardMode.EXTEND,
        rids=tuple(s.rid for s in steps),
        req_pool_indices=torch.tensor([s.row for s in steps], dtype=torch.int64),
        prefix_lens=prefix,
        extend_lens=seq - prefix,
        seq_lens=seq,
        input_ids=torch.tensor(input_ids, dtype=torch.int64),
        out_cache_loc=torch.cat(locations).to(torch.int64),
        sample=tuple(s.sample for s in steps),
        sampling=tuple(s.sampling for s in steps),
        images=tuple(s.images for s in steps),
    )


def random_image(seed: int, size: int = 32) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(size, size, 3), dtype=np.uint8)
