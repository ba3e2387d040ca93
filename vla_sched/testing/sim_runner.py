"""A deterministic simulated model runner (tests, the scheduler simulator).

It keeps a simulated KV cache: each slot holds a number derived from the key value of
its token (text id, or an image position keyed by the image's content hash) and its
position. The next token of a request is a hash of the sum over the slots its
``req_to_token`` row names, mapped into the allowed token range. So a request's outputs
are a pure function of its token sequence, *if and only if* the scheduler hands the
runner the right KV slots: a stale, shared-by-mistake or overwritten slot changes the
tokens. ``reference_tokens`` computes the same outputs without any KV, for comparison.
A prefill-only batch gets each request's action chunk the same way
(``action_chunk_from_digest`` of the digest and the robot's state;
``reference_action_chunk`` without KV). A flow-matching request's rows denoise its noise
in ``denoise_steps`` passes, each moving it by a velocity derived from the digest of its
prefix's simulated KV and the pass index (``reference_flow_chunk`` without KV); the
state lives on the request's row, as a real runner keeps it.

A cost model gives each step a duration: ``CostModel`` (fixed and per-token costs) or
``HardwareCostModel`` (a model's FLOPs and bytes over a device's rates). With a
``SimClock`` the runner behaves like a GPU queue: a step starts when the previous one ends
(or at launch), ``launch`` returns at once and ``result()`` advances the clock to the
step's end, which is what the overlap loop hides.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from vla_sched.core.decode_burst import burst_steps
from vla_sched.core.forward_batch import (
    ForwardBatch,
    ForwardMode,
    ForwardOutput,
    ImageInput,
    SamplingParams,
)
from vla_sched.core.memory.radix_key import build_key_tokens, image_key_values
from vla_sched.core.scheduling.schedule_batch import FUTURE_TOKEN_ID

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


def action_chunk_from_digest(
    digest: int, proprio: np.ndarray | None, shape: tuple[int, int]
) -> np.ndarray:
    """The simulated action chunk (float32 ``shape``, in [-1, 1)) of a sequence whose
    simulated KV sums to ``digest``, for a robot in state ``proprio``."""
    seed = digest % (1 << 63)
    if proprio is not None:
        seed ^= int.from_bytes(np.ascontiguousarray(proprio, np.float32).tobytes()[:8], 'little')
    rng = np.random.default_rng(seed)
    return rng.uniform(-1.0, 1.0, size=shape).astype(np.float32)


def reference_action_chunk(
    prompt_ids: Sequence[int],
    images: Sequence[ImageInput],
    proprio: np.ndarray | None,
    shape: tuple[int, int],
) -> np.ndarray:
    """The action chunk the simulated runner returns for this prefill-only request."""
    key = build_key_tokens(list(prompt_ids), images)
    digest = int(kv_contribution(key, torch.arange(key.numel())).sum())
    return action_chunk_from_digest(digest, proprio, shape)


def flow_velocity(digest: int, pass_index: int, shape: tuple[int, ...]) -> np.ndarray:
    """The simulated velocity of denoising pass ``pass_index`` over a prefix whose simulated
    KV sums to ``digest``."""
    rng = np.random.default_rng((digest + 7919 * pass_index) % (1 << 63))
    return rng.uniform(-1.0, 1.0, size=shape).astype(np.float32)


def reference_flow_chunk(
    prompt_ids: Sequence[int],
    images: Sequence[ImageInput],
    noise: np.ndarray,
    denoise_steps: int,
) -> np.ndarray:
    """The chunk the simulated runner returns for this flow-matching request: Euler steps
    ``x <- x - v_k / denoise_steps`` from the noise."""
    key = build_key_tokens(list(prompt_ids), images)
    digest = int(kv_contribution(key, torch.arange(key.numel())).sum())
    x = np.asarray(noise, np.float32).copy()
    for k in range(denoise_steps):
        x = x - flow_velocity(digest, k, x.shape) / np.float32(denoise_steps)
    return x


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


@dataclass(frozen=True, slots=True)
class HardwareCostModel:
    """Duration of a simulated step from a model's FLOPs and bytes and a device's rates.

    A prefill (extend) pass costs ``prefill_fixed_ns`` plus the larger of its compute time
    and its memory time. Compute: ``decoder_flops_per_token`` for every new token and
    ``vision_flops_per_image`` for every image whose first token is in the pass (the vision
    towers run once per frame), at ``matmul_flops_per_s * compute_utilization``. Memory: the
    decoder's weights, the vision weights when the pass has an image, at
    ``memory_bytes_per_s * weight_bandwidth_utilization``, plus the KV it reads (cached
    prefix) and writes (new tokens) at ``memory_bytes_per_s * kv_bandwidth_utilization``.

    A decode pass costs ``decode_fixed_ns`` plus the larger of its memory time (the decoder's
    weights once, whatever the batch, plus every request's KV, ``seq_lens`` tokens each) and
    its compute time (one token per request).

    Attention score FLOPs are left out (about 1% of a 280-token prefill of a 7B decoder).
    The fixed costs stand for what a real runner adds per pass (launches, host work); the
    utilizations for its kernels' distance from the measured rates.
    """

    decoder_flops_per_token: float  # 2 x the decoder's parameters (embedding table left out)
    vision_flops_per_image: float  # 2 x the towers' and projector's parameters x patches
    decoder_weight_bytes: float  # read once per pass
    vision_weight_bytes: float  # read once per prefill pass that has an image
    kv_bytes_per_token: float  # K and V of every layer
    matmul_flops_per_s: float  # the device's measured matmul rate
    memory_bytes_per_s: float  # the device's measured memory rate
    compute_utilization: float = 1.0
    weight_bandwidth_utilization: float = 1.0
    kv_bandwidth_utilization: float = 1.0
    prefill_fixed_ns: float = 0.0
    decode_fixed_ns: float = 0.0

    def __post_init__(self) -> None:
        for name in (
            'matmul_flops_per_s',
            'memory_bytes_per_s',
            'compute_utilization',
            'weight_bandwidth_utilization',
            'kv_bandwidth_utilization',
        ):
            if not getattr(self, name) > 0:
                raise ValueError(f'{name} must be > 0, got {getattr(self, name)}')
        for name in (
            'decoder_flops_per_token',
            'vision_flops_per_image',
            'decoder_weight_bytes',
            'vision_weight_bytes',
            'kv_bytes_per_token',
            'prefill_fixed_ns',
            'decode_fixed_ns',
        ):
            if not getattr(self, name) >= 0:
                raise ValueError(f'{name} must be >= 0, got {getattr(self, name)}')

    def compute_ns(self, flops: float) -> float:
        return flops / (self.matmul_flops_per_s * self.compute_utilization) * 1e9

    def weight_read_ns(self, num_bytes: float) -> float:
        return num_bytes / (self.memory_bytes_per_s * self.weight_bandwidth_utilization) * 1e9

    def kv_ns(self, num_tokens: float) -> float:
        num_bytes = num_tokens * self.kv_bytes_per_token
        return num_bytes / (self.memory_bytes_per_s * self.kv_bandwidth_utilization) * 1e9

    def prefill_ns(
        self, num_new_tokens: int, num_images: int, num_prefix_tokens: int = 0
    ) -> float:
        """One prefill pass of ``num_new_tokens`` tokens holding ``num_images`` new images,
        over ``num_prefix_tokens`` cached tokens (summed over its requests)."""
        flops = (
            num_new_tokens * self.decoder_flops_per_token
            + num_images * self.vision_flops_per_image
        )
        weights = self.decoder_weight_bytes + (self.vision_weight_bytes if num_images else 0.0)
        memory = self.weight_read_ns(weights) + self.kv_ns(num_prefix_tokens + num_new_tokens)
        return self.prefill_fixed_ns + max(self.compute_ns(flops), memory)

    def decode_ns(self, batch_size: int, num_kv_tokens: int) -> float:
        """One decode pass of ``batch_size`` requests reading ``num_kv_tokens`` KV tokens."""
        memory = self.weight_read_ns(self.decoder_weight_bytes) + self.kv_ns(num_kv_tokens)
        compute = self.compute_ns(batch_size * self.decoder_flops_per_token)
        return self.decode_fixed_ns + max(memory, compute)

    def step_ns(self, batch: ForwardBatch) -> int:
        if batch.forward_mode is ForwardMode.EXTEND:
            return round(
                self.prefill_ns(
                    batch.num_tokens,
                    _num_new_images(batch),
                    num_prefix_tokens=int(batch.prefix_lens.sum()),
                )
            )
        return round(self.decode_ns(batch.batch_size, int(batch.seq_lens.sum())))


def _num_new_images(batch: ForwardBatch) -> int:
    """Images whose first token is prefilled by this batch."""
    count = 0
    for i in range(batch.batch_size):
        p, s = int(batch.prefix_lens[i]), int(batch.seq_lens[i])
        count += sum(1 for image in batch.images[i] if p <= image.token_offset < s)
    return count


class StepCost(Protocol):
    """What the runner asks of a cost model."""

    def step_ns(self, batch: ForwardBatch) -> int: ...


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
        cost_model: step durations (``CostModel``, ``HardwareCostModel``); None: every
            step takes no time.
        clock: the simulated clock to queue steps on; None: results are ready at once.
        keep_batches: keep every launched batch in ``batches`` (tests).
        action_chunk_shape: ``(horizon, action_dim)`` of a prefill-only batch's chunks.
        denoise_steps: denoising passes of a flow-matching request.
    """

    def __init__(
        self,
        *,
        req_to_token: torch.Tensor,
        num_kv_slots: int,
        cost_model: StepCost | None = None,
        clock: SimClock | None = None,
        keep_batches: bool = False,
        action_chunk_shape: tuple[int, int] = (8, 7),
        denoise_steps: int = 3,
    ) -> None:
        self.denoise_steps = denoise_steps
        self._flow_state: dict[int, tuple[int, np.ndarray]] = {}  # row -> (digest, x)
        self.req_to_token = req_to_token
        self.action_chunk_shape = action_chunk_shape
        self.kv = torch.zeros(num_kv_slots, dtype=torch.int64)
        self.cost_model = cost_model
        self.clock = clock
        self._last_tokens = torch.zeros(req_to_token.shape[0], dtype=torch.int64)
        self._device_free_ns = 0
        self.steps: list[StepRecord] = []
        self.keep_batches = keep_batches
        self.batches: list[ForwardBatch] = []

    def launch(self, batch: ForwardBatch) -> SimResult:
        """Write the batch's KV, sample, and queue its duration on the clock (a decode
        burst step by step, each step a pass of its own).

        Raises:
            ValueError: the batch is inconsistent, or a row of ``req_to_token`` does not
                hold the batch's new slots.
        """
        batch.check()
        if self.keep_batches:
            self.batches.append(batch)
        if batch.prefill_only:
            output = self._run_prefill_only(batch)
            return SimResult(output, self._queue(batch), self.clock)
        if batch.num_decode_steps <= 1:
            tokens = self._run_step(batch)
            chunks = self._denoise(batch)
            output = ForwardOutput(tokens, action_chunks=chunks)
            return SimResult(output, self._queue(batch), self.clock)
        steps = burst_steps(batch)
        tokens = []
        chunks: list = [None] * batch.batch_size
        for step in steps:
            tokens.append(self._run_step(step))
            for i, chunk in enumerate(self._denoise(step) or ()):
                if chunk is not None:
                    chunks[i] = chunk
        end_ns = 0
        for step in steps:
            end_ns = self._queue(step)
        rows = tuple(zip(*tokens, strict=True))
        output = ForwardOutput(
            next_token_ids=tokens[-1],
            burst_token_ids=rows,
            action_chunks=tuple(chunks) if batch.denoise_passes else None,
        )
        return SimResult(output, end_ns, self.clock)

    def _denoise(self, batch: ForwardBatch) -> tuple[np.ndarray | None, ...] | None:
        """Advance each flow-matching row by its pass (after ``_run_step`` wrote the KV): a
        prefix pass starts the row's state from its noise; the last pass gives its chunk."""
        if not batch.denoise_passes:
            return None
        chunks: list[np.ndarray | None] = []
        for i, k in enumerate(batch.denoise_passes):
            chunk = None
            row = int(batch.req_pool_indices[i])
            if k == -1:
                slots = self.req_to_token[row, : int(batch.seq_lens[i])].to(torch.int64)
                noise = np.asarray(batch.noise[i], np.float32)
                self._flow_state[row] = (int(self.kv[slots].sum()), noise.copy())
            elif k is not None:
                digest, x = self._flow_state[row]
                x = x - flow_velocity(digest, k, x.shape) / np.float32(self.denoise_steps)
                self._flow_state[row] = (digest, x)
                if k == self.denoise_steps - 1:
                    chunk = x
            chunks.append(chunk)
        return tuple(chunks)

    def _run_prefill_only(self, batch: ForwardBatch) -> ForwardOutput:
        """Write the pass's KV and give each request its action chunk (no token)."""
        self._run_step(batch)
        chunks = []
        for i in range(batch.batch_size):
            row = int(batch.req_pool_indices[i])
            slots = self.req_to_token[row, : int(batch.seq_lens[i])].to(torch.int64)
            proprio = batch.proprio[i] if batch.proprio else None
            digest = int(self.kv[slots].sum())
            chunks.append(action_chunk_from_digest(digest, proprio, self.action_chunk_shape))
        ids = (-1,) * batch.batch_size
        return ForwardOutput(next_token_ids=ids, action_chunks=tuple(chunks))

    def _run_step(self, batch: ForwardBatch) -> tuple[int, ...]:
        """Write one step's KV and sample its tokens (-1 where not sampling)."""
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
        return tuple(tokens)

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
