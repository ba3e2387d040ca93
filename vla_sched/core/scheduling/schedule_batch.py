"""A batch of requests and the steps that turn it into a ``ForwardBatch``.

``ScheduleBatch`` mirrors SGLang's: ``prepare_for_extend`` (KV slots for each request's
extend range; with ``decoding`` rows, SGLang's mixed chunk: running requests decode one
token each in the same pass, as one-token extends after the prefill rows),
``prepare_for_decode`` (one slot per request), ``filter_batch`` (drop finished or excluded
rows), ``merge_batch`` (fresh prefills join the decode batch), ``check_decode_mem`` and
``retract_decode`` (free requests when the next decode step does not fit). Requests are
kept in a plain list; tensors are built only for the ``ForwardBatch`` of each step.

Differences from SGLang, on purpose:
    * Request rows and prefix locks are taken by the prefill adder when it admits a
      request (``KVMemory.admit``), not in ``prepare_for_extend``; the adder only admits
      what it has rows for, so the effect is the same.
    * A decode input whose token is not on the host yet (overlap loop) is sent as
      ``FUTURE_TOKEN_ID`` (-1), which the runner replaces by the token it last sampled for
      the request's row (SGLang's FutureMap).
    * ``retract_decode`` leaves the request that does not fit even alone in memory and
      returns it; the scheduler finishes it (out of memory) through its one finish path.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from vla_sched.core.forward_batch import FUTURE_TOKEN_ID, ForwardBatch, ForwardMode

if TYPE_CHECKING:
    from vla_sched.core.memory.kv_memory import KVMemory
    from vla_sched.core.scheduling.request import Req


@dataclass(frozen=True, slots=True)
class RetractResult:
    """What ``retract_decode`` did.

    Attributes:
        retracted: released requests, reset for a re-prefill, to go back to waiting.
        to_abort: the last request, which does not fit even alone (still holds memory).
    """

    retracted: list[Req]
    to_abort: list[Req]


class ScheduleBatch:
    """Requests run together in one step.

    Args:
        reqs: the rows, in batch order.
        forward_mode: ``EXTEND`` (prefill) or ``DECODE``.
        chunked_req: the row being prefilled in chunks, if it is in this batch.
    """

    def __init__(
        self,
        reqs: list[Req] | None = None,
        *,
        forward_mode: ForwardMode = ForwardMode.DECODE,
        chunked_req: Req | None = None,
    ) -> None:
        self.reqs: list[Req] = list(reqs or [])
        self.forward_mode = forward_mode
        self.chunked_req = chunked_req
        self.batch_is_full = False
        self.forward_batch: ForwardBatch | None = None
        self.row_generations: tuple[int, ...] = ()
        self.num_decoding_rows = 0  # last rows of a mixed pass: running requests decoding

    def __len__(self) -> int:
        return len(self.reqs)

    def is_empty(self) -> bool:
        return not self.reqs

    @property
    def is_extend(self) -> bool:
        return self.forward_mode is ForwardMode.EXTEND

    # ---- building steps --------------------------------------------------------------

    def prepare_for_extend(
        self, memory: KVMemory, *, decoding: Sequence[Req] = ()
    ) -> ForwardBatch:
        """Allocate KV for every row's extend range and describe the step.

        ``decoding``: running requests that decode one token each in this pass (a mixed
        pass); they become the batch's last rows. The caller checked that their KV fits.

        Raises:
            RuntimeError: a row's extend range does not start where its KV ends, or a
                decoding row's KV lags its known tokens by more than one.
        """
        self.forward_mode = ForwardMode.EXTEND
        for req in self.reqs:
            if req.extend_start != req.kv.kv_allocated_len:
                raise RuntimeError(
                    f'{req.describe()}: extend range starts at {req.extend_start} but its KV '
                    f'ends at {req.kv.kv_allocated_len}'
                )
        extend_lens = [r.extend_end - r.extend_start for r in self.reqs]
        prefix_lens = [r.extend_start for r in self.reqs]
        input_ids = [t for r in self.reqs for t in r.fill_ids(r.extend_start, r.extend_end)]
        sample = [r.extend_end == r.num_fill_tokens for r in self.reqs]
        for req in self.reqs:
            req.is_retracted = False
        positions = [r.kv.kv_allocated_len for r in decoding]
        input_ids += [_decode_input_id(r, pos) for r, pos in zip(decoding, positions, strict=True)]
        self.reqs = self.reqs + list(decoding)
        self.num_decoding_rows = len(decoding)
        extend_lens += [1] * len(decoding)
        slots = memory.allocate_extend([r.kv for r in self.reqs], extend_lens)
        sample += [True] * len(decoding)
        prefill_only = bool(self.reqs) and self.reqs[0].prefill_only
        if any(r.prefill_only != prefill_only for r in self.reqs):
            raise RuntimeError('a pass mixes prefill-only requests with token prefills')
        return self._build(
            prefix_lens + positions,
            extend_lens,
            input_ids,
            slots,
            tuple(sample),
            prefill_only=prefill_only,
        )

    def prepare_for_decode(self, memory: KVMemory, *, num_steps: int = 1) -> ForwardBatch:
        """Allocate ``num_steps`` KV slots per row and describe the decode step (a burst of
        ``num_steps`` steps when more than one; see ``forward_batch``).

        Raises:
            RuntimeError: a row's KV lags its known tokens by more than one.
        """
        self.forward_mode = ForwardMode.DECODE
        positions = [r.kv.kv_allocated_len for r in self.reqs]
        input_ids = []
        for req, pos in zip(self.reqs, positions, strict=True):
            input_ids.append(_decode_input_id(req, pos))
            input_ids += [FUTURE_TOKEN_ID] * (num_steps - 1)
        steps = [num_steps] * len(self.reqs)
        slots = memory.allocate_extend([r.kv for r in self.reqs], steps)
        return self._build(positions, steps, input_ids, slots, tuple(True for _ in self.reqs))

    def _build(
        self,
        prefix_lens: list[int],
        extend_lens: list[int],
        input_ids: list[int],
        slots: torch.Tensor,
        sample: tuple[bool, ...],
        *,
        prefill_only: bool = False,
    ) -> ForwardBatch:
        prefix = torch.tensor(prefix_lens, dtype=torch.int64)
        extend = torch.tensor(extend_lens, dtype=torch.int64)
        batch = ForwardBatch(
            forward_mode=self.forward_mode,
            rids=tuple(r.rid for r in self.reqs),
            req_pool_indices=torch.tensor(
                [r.kv.req_pool_idx for r in self.reqs], dtype=torch.int64
            ),
            prefix_lens=prefix,
            extend_lens=extend,
            seq_lens=prefix + extend,
            input_ids=torch.tensor(input_ids, dtype=torch.int64),
            out_cache_loc=slots,
            sample=sample,
            sampling=tuple(r.sampling for r in self.reqs),
            images=tuple(r.images for r in self.reqs),
            prefill_only=prefill_only,
            proprio=_proprio_of(self.reqs),
            noise=_noise_of(self.reqs),
            denoise_passes=_denoise_passes_of(self.reqs, prefix_lens, extend_lens),
            guidance=_guidance_of(self.reqs),
        )
        batch.check()
        self.forward_batch = batch
        self.row_generations = tuple(r.retraction_count for r in self.reqs)
        return batch

    # ---- reshaping -------------------------------------------------------------------

    def filter_batch(
        self, *, keep_indices: list[int] | None = None, exclude: tuple[Req, ...] = ()
    ) -> None:
        """Keep unfinished rows not in ``exclude`` (and in ``keep_indices`` if given)."""
        indices = range(len(self.reqs)) if keep_indices is None else sorted(keep_indices)
        excluded = {id(r) for r in exclude}
        self.reqs = [
            self.reqs[i]
            for i in indices
            if not self.reqs[i].finished and id(self.reqs[i]) not in excluded
        ]
        self.forward_batch = None
        self.row_generations = ()
        self.num_decoding_rows = 0

    def merge_batch(self, other: ScheduleBatch) -> None:
        """Append ``other``'s rows (fresh prefills joining the decode batch)."""
        self.reqs.extend(other.reqs)
        self.forward_batch = None
        self.row_generations = ()
        self.num_decoding_rows = 0

    def copy(self) -> ScheduleBatch:
        """A snapshot for processing this step's results later (overlap loop)."""
        snap = ScheduleBatch(
            self.reqs, forward_mode=self.forward_mode, chunked_req=self.chunked_req
        )
        snap.forward_batch = self.forward_batch
        snap.row_generations = self.row_generations
        snap.num_decoding_rows = self.num_decoding_rows
        return snap

    # ---- decode memory ---------------------------------------------------------------

    def check_decode_mem(
        self, memory: KVMemory, reqs: list[Req] | None = None, *, num_steps: int = 1
    ) -> bool:
        """Whether the next ``num_steps`` decode steps of ``reqs`` (default: all rows) fit,
        evicting the tree's unlocked pages first when free pages run short (SGLang evicts
        the full need, not the deficit)."""
        reqs = self.reqs if reqs is None else reqs
        need = memory.tokens_needed([r.kv for r in reqs], [num_steps] * len(reqs))
        if memory.num_free_tokens() < need:
            memory.evict(need)
        return memory.num_free_tokens() >= need

    def retract_decode(
        self,
        memory: KVMemory,
        *,
        retraction_policy: str,
        priority_sign: int,
        retract_decode_steps: int,
    ) -> RetractResult:
        """Release requests until the next decode step fits.

        Victims come from the end of the keep-order: ``length`` keeps most outputs first
        (ties: shorter prompt first), so the request with the fewest outputs and, among
        those, the longest prompt goes first; ``priority`` puts priority before that. At
        least one request is retracted, never the last; if the last does not fit alone it
        is returned in ``to_abort``. After each release the tree evicts
        ``remaining * retract_decode_steps`` tokens if fewer are free.
        """
        order = list(range(len(self.reqs)))
        order.sort(
            key=lambda i: _keep_key(self.reqs[i], retraction_policy, priority_sign), reverse=True
        )
        retracted: list[Req] = []
        first_iter = True
        while first_iter or not self.check_decode_mem(memory, [self.reqs[i] for i in order]):
            if len(order) == 1:
                break
            first_iter = False
            req = self.reqs[order.pop()]
            memory.retract(req.kv)
            headroom = len(order) * retract_decode_steps
            if memory.num_free_tokens() < headroom:
                memory.evict(headroom)
            req.reset_for_retract()
            retracted.append(req)
        to_abort = []
        if order and not self.check_decode_mem(memory, [self.reqs[i] for i in order]):
            to_abort.append(self.reqs[order.pop()])
        self.filter_batch(keep_indices=order)
        return RetractResult(retracted=retracted, to_abort=to_abort)


def _decode_input_id(req: Req, pos: int) -> int:
    """The input id of ``req``'s decode at ``pos``: its newest known token, or
    ``FUTURE_TOKEN_ID`` when that token is still on the runner (overlap loop)."""
    if pos < req.num_fill_tokens - 1 or pos > req.num_fill_tokens:
        raise RuntimeError(
            f'{req.describe()}: decode at position {pos} with {req.num_fill_tokens} known tokens'
        )
    return req.fill_ids(pos, pos + 1)[0] if pos < req.num_fill_tokens else FUTURE_TOKEN_ID


def _proprio_of(reqs: Sequence[Req]) -> tuple:
    """Each row's robot state, or ``()`` when no row has one."""
    if all(r.proprio is None for r in reqs):
        return ()
    return tuple(r.proprio for r in reqs)


def _noise_of(reqs: Sequence[Req]) -> tuple:
    """Each row's flow-matching initial noise, or ``()`` when no row denoises."""
    if all(r.noise is None for r in reqs):
        return ()
    return tuple(r.noise for r in reqs)


def _guidance_of(reqs: Sequence[Req]) -> tuple:
    """Each row's real-time-chunking guidance, or ``()`` when no row is guided."""
    if all(r.guidance is None for r in reqs):
        return ()
    return tuple(r.guidance for r in reqs)


def _denoise_passes_of(
    reqs: Sequence[Req], prefix_lens: list[int], extend_lens: list[int]
) -> tuple:
    """Each row's denoising pass index (-1: its prefix pass; None: a token row), or ``()``
    when no row denoises. A flow-matching request's marker of pass ``k`` sits at position
    ``prompt_len + k``, so a decode row at position ``p`` runs pass ``p - prompt_len``."""
    if not any(r.denoise_steps for r in reqs):
        return ()
    out: list[int | None] = []
    for req, start, length in zip(reqs, prefix_lens, extend_lens, strict=True):
        prompt_len = len(req.origin_input_ids)
        if not req.denoise_steps:
            out.append(None)
        elif start + length <= prompt_len:
            out.append(-1)
        else:
            out.append(start - prompt_len)
    return tuple(out)


def priority_value(req: Req, priority_sign: int) -> int:
    """``req.priority``, or the least important value when it has none."""
    if req.priority is not None:
        return req.priority
    return sys.maxsize if priority_sign > 0 else -sys.maxsize - 1


def _keep_key(req: Req, retraction_policy: str, priority_sign: int) -> tuple[int, ...]:
    length_key = (len(req.output_ids), -len(req.origin_input_ids))
    if retraction_policy == 'priority':
        return (priority_value(req, priority_sign) * -priority_sign, *length_key)
    return length_key
