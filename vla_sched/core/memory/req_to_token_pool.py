"""Request-to-token pool: one row of KV slot indices per live request.

``req_to_token[row, pos]`` is the KV slot of token ``pos`` of the request that owns
``row``; a model runner reads ``req_to_token[row, :seq_len]`` to find a request's KV.
Rows are handed out from a FIFO free list and remember their owner's id, so a double free
or a free by the wrong request names both.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import numpy as np
import torch

from vla_sched.core.memory.kv_errors import DoubleFreeError, OutOfReqSlotsError


class ReqToTokenPool:
    """Rows of KV slot indices, one per live request.

    Args:
        num_req_slots: number of rows (requests that can hold KV at once).
        max_context_len: number of columns (longest sequence in tokens).
    """

    def __init__(self, *, num_req_slots: int, max_context_len: int) -> None:
        if num_req_slots < 1 or max_context_len < 1:
            raise ValueError(
                f'num_req_slots and max_context_len must be >= 1, '
                f'got {num_req_slots} and {max_context_len}'
            )
        self.num_req_slots = num_req_slots
        self.max_context_len = max_context_len
        self.req_to_token = torch.zeros((num_req_slots, max_context_len), dtype=torch.int32)
        # The same memory as numpy: indexing it costs a fraction of a microsecond per op
        # where a small torch op costs several.
        self._table = self.req_to_token.numpy()
        self._free_slots: deque[int] = deque(range(num_req_slots))
        self._owners: list[str | None] = [None] * num_req_slots

    @property
    def num_free_slots(self) -> int:
        return len(self._free_slots)

    def can_allocate(self, num_reqs: int = 1) -> bool:
        return num_reqs <= len(self._free_slots)

    def allocate(self, rid: str) -> int:
        """Give request ``rid`` a free row and return its index.

        Raises:
            OutOfReqSlotsError: every row is owned (names ``rid``).
        """
        if not self._free_slots:
            raise OutOfReqSlotsError(
                f'no free request slot for request {rid!r}: all {self.num_req_slots} '
                f'slots are owned'
            )
        row = self._free_slots.popleft()
        self._owners[row] = rid
        return row

    def free(self, row: int, rid: str) -> None:
        """Return ``row`` to the free list; ``rid`` must be its owner.

        Raises:
            DoubleFreeError: the row is already free.
            ValueError: the row is out of range or owned by another request.
        """
        if not 0 <= row < self.num_req_slots:
            raise ValueError(
                f'request {rid!r} frees request slot {row}, outside [0, {self.num_req_slots})'
            )
        owner = self._owners[row]
        if owner is None:
            raise DoubleFreeError(f'request {rid!r} frees request slot {row}, which is free')
        if owner != rid:
            raise ValueError(f'request {rid!r} frees request slot {row}, owned by {owner!r}')
        self._owners[row] = None
        self._free_slots.append(row)

    def owner(self, row: int) -> str | None:
        """The id of the request owning ``row``, or None if the row is free."""
        return self._owners[row]

    def write(self, row: int, start: int, slots: torch.Tensor) -> None:
        """Store ``slots`` as the KV slots of positions ``[start, start + len(slots))``."""
        end = start + int(slots.numel())
        if end > self.max_context_len:
            raise ValueError(
                f'request slot {row} ({self._owners[row]!r}) would hold {end} tokens, '
                f'more than max_context_len={self.max_context_len}'
            )
        self.req_to_token[row, start:end] = slots.to(torch.int32)

    def read(self, row: int, start: int, end: int) -> torch.Tensor:
        """The KV slots of positions ``[start, end)`` of ``row`` as int64."""
        return torch.from_numpy(self._table[row, start:end].astype(np.int64))

    def slots_at(self, rows: Sequence[int], positions: Sequence[int]) -> list[int]:
        """The KV slot of position ``positions[i]`` of ``rows[i]`` for each ``i``."""
        return self._table[rows, positions].tolist()

    def write_runs(
        self,
        rows: Sequence[int],
        starts: Sequence[int],
        lens: Sequence[int],
        slots: np.ndarray,
    ) -> None:
        """Store ``slots`` (back to back) at positions ``[starts[i], starts[i] + lens[i])`` of
        ``rows[i]`` for each ``i``; the caller has checked the lengths against the rows."""
        if not slots.size:
            return
        if slots.size == len(rows) and max(lens) == 1:  # one token per row: a decode step
            self._table[rows, starts] = slots
            return
        lens_np = np.asarray(lens, dtype=np.int64)
        first = np.cumsum(lens_np) - lens_np
        shift = np.repeat(np.asarray(starts, dtype=np.int64) - first, lens_np)
        self._table[np.repeat(rows, lens_np), np.arange(slots.size) + shift] = slots

    def free_slot_list(self) -> list[int]:
        """A copy of the free list in reuse order (for integrity checks)."""
        return list(self._free_slots)
