"""Admission of waiting requests into one prefill batch under SGLang's token budgets.

With ``P`` the page size, ``r`` the new-token ratio, ``clip`` the max-new-tokens clip and
``A + E`` the free plus evictable tokens of the pool (read live, so a prefix locked during
the pass stops counting as evictable)::

    rem_total_tokens = A + E - (sum_running min(max_new - generated, clip) * r
                                + sum_admitted (ceil_P(extend) + max_new + P))
    cur_rem_tokens   = A + E - sum_admitted (ceil_P(extend) + P)
    rem_input_tokens = max_prefill_tokens - sum_admitted ceil_P(extend)
    rem_chunk_tokens = chunked_prefill_size - sum_admitted ceil_P(extend)

A candidate needing ``extend + min(max_new, clip) + P >= rem_total_tokens`` is refused
(``NO_TOKEN``: the batch is full). One too long for the chunk budget is cut at a page
boundary and becomes the (single) chunked request, charged without decode headroom; a
prefill-only request is never cut and waits for a pass with room instead. After each
admission the budget state says whether the next candidate is tried.

Differences from SGLang, on purpose:
    * Admission also takes the request's row and prefix lock (``KVMemory.admit``).
    * A chunked continuation is capped by the KV actually free (``A + E``); when not even
      one page is free it is handed back for retraction instead of failing to allocate.
    * Chunks are cut at page boundaries also when resumed (SGLang aligns only the first).
    * ``ignore_eos`` admission with the radix cache off does not exist here.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING

from vla_sched.core.memory.pages import round_down_to_page, round_up_to_page
from vla_sched.core.scheduling.schedule_batch import priority_value

if TYPE_CHECKING:
    from vla_sched.core.memory.kv_memory import KVMemory
    from vla_sched.core.scheduling.request import Req
    from vla_sched.core.scheduling.schedule_batch import ScheduleBatch


class AddReqResult(enum.Enum):
    CONTINUE = 'continue'  # try the next candidate
    NO_TOKEN = 'no_token'  # out of KV budget: the batch is full
    OTHER = 'other'  # another budget (input, chunk, request cap) is spent


class ChunkResult(enum.Enum):
    FINAL = 'final'  # the continuation reaches the end of the prompt
    MIDDLE = 'middle'  # more chunks follow
    NO_MEMORY = 'no_memory'  # not one page is free: retract it


class PrefillAdder:
    """One prefill pass's budgets and the requests admitted so far.

    Args:
        memory: KV memory (free/evictable sizes, tree locks, admission).
        running_reqs: requests in the decode batch.
        new_token_ratio: current new-token ratio.
        max_prefill_tokens: input token budget of the pass.
        chunk_size: chunk token budget; None: chunking off.
        clip_max_new_tokens: clip of ``max_new_tokens`` in the estimates.
        prefill_max_requests: request cap of the batch; None: none.
        preemption_threshold: strict priority margin for preempting a running request.
        priority_sign: +1 when small priorities are more important, else -1.
        retract_decode_steps: eviction headroom per remaining request after a preemption.
        mixed_with_decode_tokens: tokens of running requests that decode in the same pass
            (a mixed pass); they come out of the input and chunk budgets.
    """

    def __init__(
        self,
        *,
        memory: KVMemory,
        running_reqs: list[Req],
        new_token_ratio: float,
        max_prefill_tokens: int,
        chunk_size: int | None,
        clip_max_new_tokens: int,
        prefill_max_requests: int | None = None,
        preemption_threshold: int = 10,
        priority_sign: int = -1,
        retract_decode_steps: int = 20,
        mixed_with_decode_tokens: int = 0,
    ) -> None:
        self.memory = memory
        self.page_size = memory.page_size
        self.new_token_ratio = new_token_ratio
        self.clip = clip_max_new_tokens
        self.prefill_max_requests = prefill_max_requests
        self.preemption_threshold = preemption_threshold
        self.priority_sign = priority_sign
        self.retract_decode_steps = retract_decode_steps
        self.rem_input_tokens = max_prefill_tokens - mixed_with_decode_tokens
        self.rem_chunk_tokens = (
            None if chunk_size is None else chunk_size - mixed_with_decode_tokens
        )
        self.rem_total_token_offset = sum(self._decode_estimate(r) for r in running_reqs)
        self.cur_rem_token_offset = 0
        self.can_run_list: list[Req] = []
        self.preempt_list: list[Req] = []
        self.new_chunked_req: Req | None = None

    # ---- budgets ---------------------------------------------------------------------

    @property
    def rem_total_tokens(self) -> float:
        return self.memory.available_size() - self.rem_total_token_offset

    @property
    def cur_rem_tokens(self) -> float:
        return self.memory.available_size() - self.cur_rem_token_offset

    def budget_state(self) -> AddReqResult:
        if self.rem_total_tokens <= 0 or self.cur_rem_tokens <= 0:
            return AddReqResult.NO_TOKEN
        if self.rem_input_tokens <= 0 or (
            self.rem_chunk_tokens is not None and self.rem_chunk_tokens <= 0
        ):
            return AddReqResult.OTHER
        return AddReqResult.CONTINUE

    def _decode_estimate(self, req: Req) -> float:
        return min(req.num_remaining_tokens, self.clip) * self.new_token_ratio

    def _ceil_page(self, n: int) -> int:
        return round_up_to_page(n, self.page_size)

    def _floor_page(self, n: int) -> int:
        return round_down_to_page(n, self.page_size)

    def _charge(self, extend_len: int, max_new: int) -> None:
        self.rem_total_token_offset += extend_len + max_new + self.page_size
        self.cur_rem_token_offset += extend_len + self.page_size
        self.rem_input_tokens -= extend_len
        if self.rem_chunk_tokens is not None:
            self.rem_chunk_tokens -= extend_len

    # ---- admission -------------------------------------------------------------------

    def add_chunked_req(self, req: Req) -> ChunkResult:
        """Resume the chunked request first in the pass; it always makes progress."""
        chunk = self.rem_chunk_tokens
        if chunk is None:
            raise RuntimeError(f'{req.describe()} is chunked but chunking is off')
        rem = min(chunk, int(self.rem_total_tokens))
        if rem <= 0:
            rem = chunk  # a continuation must progress to free its memory later
        start = req.kv.kv_allocated_len
        remaining = req.num_fill_tokens - start
        truncated = remaining > rem
        extend = min(remaining, rem)
        if truncated:
            extend = self._floor_page(start + extend) - start
        room = self._floor_page(self.memory.available_size())
        if extend > room:
            extend, truncated = self._floor_page(start + room) - start, True
        if extend <= 0:
            return ChunkResult.NO_MEMORY
        req.set_extend_range(start, start + extend)
        self.can_run_list.append(req)
        self._charge(extend, 0 if truncated else min(req.max_new_tokens, self.clip))
        return ChunkResult.MIDDLE if truncated else ChunkResult.FINAL

    def add_one_req(self, req: Req) -> AddReqResult:
        """Admit a matched waiting request whole or as the first chunk, if it fits."""
        if self.prefill_max_requests is not None and (
            len(self.can_run_list) >= self.prefill_max_requests
        ):
            return AddReqResult.OTHER
        max_new = min(req.num_remaining_tokens, self.clip)
        prefix_len = req.kv.prefix_len
        extend = req.num_fill_tokens - prefix_len
        if extend + max_new + self.page_size >= self.rem_total_tokens:
            return AddReqResult.NO_TOKEN
        no_chunking = self.rem_chunk_tokens is None
        if no_chunking and self.can_run_list and self._ceil_page(extend) >= self.rem_input_tokens:
            return AddReqResult.OTHER
        node = req.kv.last_node
        self.memory.tree.inc_lock_ref(node)  # the candidate's prefix stops being evictable
        try:
            if extend + max_new + self.page_size >= self.rem_total_tokens:
                return AddReqResult.NO_TOKEN
            fits_chunk = (
                self.rem_chunk_tokens is None or self._ceil_page(extend) <= self.rem_chunk_tokens
            )
            if not fits_chunk and req.whole_prompt:
                return AddReqResult.OTHER  # never cut: it waits for a pass with room
            if fits_chunk:
                req.set_extend_range(prefix_len, req.num_fill_tokens)
                self._admit(req)
                self._charge(self._ceil_page(extend), min(req.max_new_tokens, self.clip))
            else:
                end = self._floor_page(prefix_len + self._floor_page(self.rem_chunk_tokens))
                if end - prefix_len <= 0:
                    return AddReqResult.OTHER
                req.set_extend_range(prefix_len, end)
                self._admit(req)
                self.new_chunked_req = req
                self._charge(end - prefix_len, 0)
        finally:
            self.memory.tree.dec_lock_ref(node)
        return self.budget_state()

    def _admit(self, req: Req) -> None:
        self.memory.admit(req.kv)
        self.can_run_list.append(req)

    # ---- priority preemption ---------------------------------------------------------

    def preempt_to_schedule(self, req: Req, running_batch: ScheduleBatch) -> bool:
        """Release running requests less important than ``req`` by more than the threshold.

        Victims: least important first, most recently queued first among equals, until
        their reserved decode estimates cover ``req``'s need; the walk stops at the first
        running request that is not less important by more than the threshold.
        """
        sign = self.priority_sign
        taken = {id(r) for r in self.preempt_list}
        candidates = [r for r in running_batch.reqs if id(r) not in taken and not r.finished]
        candidates.sort(
            key=lambda r: (
                priority_value(r, sign) * -sign,
                -(r.times.wait_queue_entry_ns or 0),
            )
        )
        need = (
            req.num_fill_tokens
            - req.kv.prefix_len
            + min(req.max_new_tokens, self.clip)
            - self.rem_total_tokens
        )
        mine = priority_value(req, sign)
        victims: list[Req] = []
        for cand in candidates:
            if (mine - priority_value(cand, sign)) * -sign <= self.preemption_threshold:
                break
            victims.append(cand)
            need -= self._decode_estimate(cand)
            if need <= 0:
                break
        if not victims or need > 0:
            return False
        self._release_victims(victims, running_batch)
        return True

    def _release_victims(self, victims: list[Req], running_batch: ScheduleBatch) -> None:
        victim_ids = {id(v) for v in victims}
        keep = [i for i, r in enumerate(running_batch.reqs) if id(r) not in victim_ids]
        for victim in victims:
            self.rem_total_token_offset -= self._decode_estimate(victim)
            self.memory.retract(victim.kv)
            headroom = len(keep) * self.retract_decode_steps
            if self.memory.num_free_tokens() < headroom:
                self.memory.evict(headroom)
            victim.reset_for_retract()
        running_batch.filter_batch(keep_indices=keep)
        self.preempt_list.extend(victims)
