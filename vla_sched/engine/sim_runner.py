"""A deterministic simulated model runner (tests, the scheduler simulator).

It keeps a simulated KV cache: each slot holds a number derived from the key value of
its token (text id, or an image position keyed by the image's content hash) and its
position. The next token of a request is a hash of the sum over the slots its
``req_to_token`` row names, mapped into the allowed token range. So a request's outputs
are a pure function of its token sequence, *if and only if* the scheduler hands the
runner the right KV slots: a stale, shared-by-mistake or overwritten slot changes the
tokens. ``reference_tokens`` computes the same outputs without any KV, for comparison.

A ``CostModel`` gives each step a duration; with a ``SimClock`` the runner behaves like a
GPU queue: a step starts when the previous one ends (or at launch), ``launch`` returns at
once and ``result()`` advances the clock to the step's end, which is what the overlap
loop hides.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from vla_sched.engine.forward_batch import (
    ForwardBatch,
    ForwardMode,
    ForwardOutput,
    ImageInput,
    SamplingParams,
)
from vla_sched.engine.memory.radix_key import build_key_tokens, image_key_values
from vla_sched.engine.scheduling.schedule_batch import FUTURE_TOKEN_ID

_MOD = 2_147_483_647  # 2**31 - 1 (prime): squares stay below 2**62


def kv_contribution(values: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Simulated KV of tokens with key ``values`` at ``positions`` (int64, in [0, 2**31))."""
    x = (values.remainder(_MOD) + positions * 48271) % _MOD
    x = (x * x + 12345) % _MOD
    return (x * 16807 + positions) % _MOD


def token_from_digest(digest: int, sampling: SamplingParams) -> int:
    """The sampled token of a sequence whose simulated KV sums to ``digest``."""
    mixed = (digest * 0x9E3779B97F4A7C15 + sampling.seed * 0xBF58476D1CE4E5B9) % (1 << 61)
    span = sampling.allowed_token_end - sampling.allowed_token_start
    return sampling.allowed_token_start + (mixed >> 7) % span


def reference_tokens(
    prompt_ids: Sequence[int],
    images: Sequence[ImageInput],
    sampling: SamplingParams,
    num_tokens: int,
) -> list[int]:
    """The ``num_tokens`` outputs the simulated runner produces for this prompt."""
    key = build_key_tokens(list(prompt_ids), images)
    digest = int(kv_contribution(key, torch.arange(key.numel())).sum())
    outputs = []
    for _ in range(num_tokens):
        token = token_from_digest(digest, sampling)
        outputs.append(token)
        pos = torch.tensor([key.numel() + len(outputs) - 1])
        digest += int(kv_contribution(torch.tensor([token]), pos).sum())
    return outputs


@dataclass(frozen=True, slots=True)
class CostModel:
    """Duration of a simulated step in nanoseconds.

    prefill: ``prefill_base_ns + prefill_ns_per_token * new tokens``;
    decode: ``decode_base_ns + decode_ns_per_req * batch size + decode_ns_per_kv_token *
    tokens read``.
    """

    prefill_base_ns: int = 2_000_000
    prefill_ns_per_token: int = 40_000
    decode_base_ns: int = 6_000_000
    decode_ns_per_req: int = 100_000
    decode_ns_per_kv_token: int = 50

    def step_ns(self, batch: ForwardBatch) -> int:
        if batch.forward_mode is ForwardMode.EXTEND:
            return self.prefill_base_ns + self.prefill_ns_per_token * batch.num_tokens
        kv_tokens = int(batch.seq_lens.sum())
        return (
            self.decode_base_ns
            + self.decode_ns_per_req * batch.batch_size
            + self.decode_ns_per_kv_token * kv_tokens
        )


class SimClock:
    """A settable integer-nanosecond clock; call it to read the time."""

    def __init__(self, start_ns: int = 0) -> None:
        self.now_ns = start_ns

    def __call__(self) -> int:
        return self.now_ns

    def advance(self, ns: int) -> None:
        self.now_ns += int(ns)

    def advance_to(self, t_ns: int) -> None:
        self.now_ns = max(self.now_ns, int(t_ns))


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One executed step: what ran and when (simulated device time)."""

    forward_mode: ForwardMode
    batch_size: int
    num_tokens: int
    start_ns: int
    end_ns: int


class SimResult:
    """A launched simulated step; ``result()`` waits (on the sim clock) for its end."""

    def __init__(self, output: ForwardOutput, end_ns: int, clock: SimClock | None) -> None:
        self._output = output
        self.end_ns = end_ns
        self._clock = clock

    def result(self) -> ForwardOutput:
        if self._clock is not None:
            self._clock.advance_to(self.end_ns)
        return self._output


class SimRunner:
    """Runs ``ForwardBatch`` steps on simulated KV (see the module docstring).

    Args:
        req_to_token: the memory's slot table ``[num_req_slots, max_context_len]``.
        num_kv_slots: KV slots (``KVMemory.allocator.num_slots``).
        cost_model: step durations; None: every step takes no time.
        clock: the simulated clock to queue steps on; None: results are ready at once.
        keep_batches: keep every launched batch in ``batches`` (tests).
    """

    def __init__(
        self,
        *,
        req_to_token: torch.Tensor,
        num_kv_slots: int,
        cost_model: CostModel | None = None,
        clock: SimClock | None = None,
        keep_batches: bool = False,
    ) -> None:
        self.req_to_token = req_to_token
        self.kv = torch.zeros(num_kv_slots, dtype=torch.int64)
        self.cost_model = cost_model
        self.clock = clock
        self._last_tokens = torch.zeros(req_to_token.shape[0], dtype=torch.int64)
        self._device_free_ns = 0
        self.steps: list[StepRecord] = []
        self.keep_batches = keep_batches
        self.batches: list[ForwardBatch] = []

    def launch(self, batch: ForwardBatch) -> SimResult:
        """Write the batch's KV, sample, and queue its duration on the clock.

        Raises:
            ValueError: the batch is inconsistent, or a row of ``req_to_token`` does not
                hold the batch's new slots.
        """
        batch.check()
        if self.keep_batches:
            self.batches.append(batch)
        input_ids = self._resolve_input_ids(batch)
        self._check_rows(batch)
        values = self._key_values(batch, input_ids)
        positions = torch.cat(
            [
                torch.arange(int(p), int(s))
                for p, s in zip(batch.prefix_lens, batch.seq_lens, strict=True)
            ]
        )
        self.kv[batch.out_cache_loc] = kv_contribution(values, positions)
        tokens = []
        for i in range(batch.batch_size):
            if not batch.sample[i]:
                tokens.append(-1)
                continue
            row = int(batch.req_pool_indices[i])
            slots = self.req_to_token[row, : int(batch.seq_lens[i])].to(torch.int64)
            token = token_from_digest(int(self.kv[slots].sum()), batch.sampling[i])
            self._last_tokens[row] = token
            tokens.append(token)
        return SimResult(ForwardOutput(tuple(tokens)), self._queue(batch), self.clock)

    def _resolve_input_ids(self, batch: ForwardBatch) -> torch.Tensor:
        ids = batch.input_ids
        future = ids == FUTURE_TOKEN_ID
        if not bool(future.any()):
            return ids
        rows = torch.repeat_interleave(batch.req_pool_indices, batch.extend_lens)
        return torch.where(future, self._last_tokens[rows], ids)

    def _check_rows(self, batch: ForwardBatch) -> None:
        start = 0
        for i in range(batch.batch_size):
            row, p, s = (
                int(batch.req_pool_indices[i]),
                int(batch.prefix_lens[i]),
                int(batch.seq_lens[i]),
            )
            expected = batch.out_cache_loc[start : start + s - p]
            if not torch.equal(self.req_to_token[row, p:s].to(torch.int64), expected):
                raise ValueError(
                    f'request {batch.rids[i]!r}: row {row} positions [{p}, {s}) do not hold '
                    f'the batch slots'
                )
            start += s - p

    @staticmethod
    def _key_values(batch: ForwardBatch, input_ids: torch.Tensor) -> torch.Tensor:
        values = input_ids.clone()
        start = 0
        for i in range(batch.batch_size):
            p, s = int(batch.prefix_lens[i]), int(batch.seq_lens[i])
            for image in batch.images[i]:
                lo, hi = max(p, image.token_offset), min(s, image.token_end)
                if lo < hi:
                    span = image_key_values(image.content_hash, image.num_tokens)
                    values[start + lo - p : start + hi - p] = span[
                        lo - image.token_offset : hi - image.token_offset
                    ]
            start += s - p
        return values

    def _queue(self, batch: ForwardBatch) -> int:
        if self.cost_model is None or self.clock is None:
            return self.clock() if self.clock is not None else 0
        start = max(self.clock(), self._device_free_ns)
        end = start + self.cost_model.step_ns(batch)
        self._device_free_ns = end
        self.steps.append(
            StepRecord(batch.forward_mode, batch.batch_size, batch.num_tokens, start, end)
        )
        return end
