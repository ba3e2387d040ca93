"""The plain-data seam between the scheduler and a model runner.

The scheduler describes one step as a ``ForwardBatch`` (which requests, how many new tokens
each, which KV slots they go to, which images they need); a runner executes it and returns
a ``ResultHandle`` whose ``result()`` gives the sampled tokens. Nothing here holds a ROS
message or a CUDA tensor: index tensors are CPU torch tensors, images are numpy arrays, so a
batch can be logged, replayed and run by a simulated runner in tests.

Index ranges of request ``i`` in a batch (positions in its token sequence)::

    0 ............ prefix_lens[i] ............ seq_lens[i]
    |  KV already in the pool  |  new tokens this step   |
                               <-- extend_lens[i] ------>

``input_ids`` and ``out_cache_loc`` hold the new tokens of all requests back to back, in
batch order. For a decode step every ``extend_lens[i]`` is 1. An input id of -1
(``FUTURE_TOKEN_ID``) stands for the token the runner last sampled for that request's row:
the overlap loop launches decode step k+1 before the host has seen step k's tokens.

A decode burst is ``k`` decode steps in one batch (SGLang's continuous decode steps): every
``extend_lens[i]`` is ``k``, each request's first input id is known and the other ``k - 1``
are ``FUTURE_TOKEN_ID`` (each the token sampled by the step before), and the runner returns
each request's ``k`` tokens (``ForwardOutput.burst_token_ids``).

A prefill-only batch (``prefill_only``; OpenVLA-OFT's steps) is one extend pass over each
request's whole sequence with no cached prefix, attending both ways over it; the runner
returns each request's action chunk (``ForwardOutput.action_chunks``), samples no token,
and the scheduler keeps none of the pass's KV. ``proprio`` holds each request's robot state
for a model that takes it.

A flow-matching request (pi0) runs its prefix as one extend row attending both ways, then
one decode row per denoising pass (bursts of ``k`` passes as for tokens). Its rows carry its
initial noise (``noise``); the runner keeps the denoising state on the request's row,
returns a marker id per pass, and the request's chunk with its last pass
(``ForwardOutput.action_chunks``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

FUTURE_TOKEN_ID = -1  # decode input: "the token the runner last sampled for this row"


class ForwardMode(enum.Enum):
    """What kind of step a batch is."""

    EXTEND = 'extend'  # prefill of new tokens on top of a cached prefix (chunked or whole)
    DECODE = 'decode'  # one new token per request
    IDLE = 'idle'  # nothing to run


@dataclass(frozen=True, slots=True, eq=False)
class FlowGuidance:
    """Real-time chunking's guidance of one flow-matching request (arXiv 2506.07339): the
    denoising passes pull the chunk towards ``target`` where ``weights`` say.

    Attributes:
        target: float32 ``[chunk, action width]``: the previous chunk's actions still to run,
            aligned to this chunk's timesteps, in the model's normalized space, zero-padded.
        weights: float32 ``[chunk]``: the soft mask (1 on the frozen actions, decaying to 0
            by the execution horizon).
        max_weight: the guidance weight's cap (the paper's beta).
    """

    target: np.ndarray
    weights: np.ndarray
    max_weight: float

    def __post_init__(self) -> None:
        if self.target.ndim != 2 or self.weights.shape != (self.target.shape[0],):
            raise ValueError(
                f'guidance target [chunk, width] and weights [chunk] disagree: '
                f'{self.target.shape}, {self.weights.shape}'
            )
        if not self.max_weight >= 0.0:
            raise ValueError(f'max_weight must be >= 0, got {self.max_weight}')


@dataclass(frozen=True, slots=True)
class ImageInput:
    """One image of a request and where its placeholder tokens sit in the prompt.

    ``token_offset`` and ``num_tokens`` locate the placeholder span in the request's
    token sequence. ``content_hash`` identifies the pixels (the radix cache keys the span
    by it); a runner may cache the vision features by it.
    """

    content_hash: int
    token_offset: int
    num_tokens: int
    pixels: np.ndarray  # uint8 [H, W, 3], RGB

    @property
    def token_end(self) -> int:
        return self.token_offset + self.num_tokens


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How a request's next tokens are chosen.

    Tokens are drawn only from ``[allowed_token_start, allowed_token_end)`` (the action
    token range for a VLA); ``temperature == 0`` means greedy.
    """

    allowed_token_start: int
    allowed_token_end: int
    temperature: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.allowed_token_start < self.allowed_token_end:
            raise ValueError(
                f'empty or negative allowed token range '
                f'[{self.allowed_token_start}, {self.allowed_token_end})'
            )
        if not self.temperature >= 0.0:
            raise ValueError(f'temperature must be >= 0, got {self.temperature}')


@dataclass(frozen=True, slots=True, eq=False)
class ForwardBatch:
    """One model step for a batch of requests (see the module docstring for the ranges).

    ``sample[i]`` says whether request ``i`` needs a next token from this step: false for
    a chunk that does not reach the end of its prompt.
    """

    forward_mode: ForwardMode
    rids: tuple[str, ...]
    req_pool_indices: torch.Tensor  # int64 [B], rows of ReqToTokenPool.req_to_token
    prefix_lens: torch.Tensor  # int64 [B]
    extend_lens: torch.Tensor  # int64 [B]
    seq_lens: torch.Tensor  # int64 [B], prefix_lens + extend_lens
    input_ids: torch.Tensor  # int64 [sum(extend_lens)]
    out_cache_loc: torch.Tensor  # int64 [sum(extend_lens)], KV slots of the new tokens
    sample: tuple[bool, ...]
    sampling: tuple[SamplingParams, ...]
    images: tuple[tuple[ImageInput, ...], ...]  # per request: images of its prompt
    prefill_only: bool = False  # one whole-sequence pass per request, action chunks out
    proprio: tuple[np.ndarray | None, ...] = ()  # per request: float32 state, or () for none
    noise: tuple[np.ndarray | None, ...] = ()  # per request: flow-matching initial noise, or ()
    # Per request when a row denoises: -1 for a flow-matching request's prefix pass, its
    # (first) denoising pass index for a decode row, None for a token row; () for none.
    denoise_passes: tuple[int | None, ...] = ()
    guidance: tuple[FlowGuidance | None, ...] = ()  # per request: RTC guidance, or () for none

    @property
    def batch_size(self) -> int:
        return len(self.rids)

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.numel())

    def check(self) -> None:
        """Raise ValueError unless the fields agree with each other.

        The lengths are compared as Python lists: a batch of a few requests costs a few
        microseconds, where elementwise tensor ops would cost several each.
        """
        b = self.batch_size
        for name in ('req_pool_indices', 'prefix_lens', 'extend_lens', 'seq_lens'):
            t = getattr(self, name)
            if t.dtype != torch.int64 or t.shape != (b,):
                raise ValueError(f'{name} must be int64 [{b}], got {t.dtype} {tuple(t.shape)}')
        if len(self.sample) != b or len(self.sampling) != b or len(self.images) != b:
            raise ValueError('sample, sampling and images need one entry per request')
        if self.proprio and len(self.proprio) != b:
            raise ValueError('proprio needs one entry per request (or none at all)')
        if self.noise and len(self.noise) != b:
            raise ValueError('noise needs one entry per request (or none at all)')
        if self.guidance and len(self.guidance) != b:
            raise ValueError('guidance needs one entry per request (or none at all)')
        if self.denoise_passes and len(self.denoise_passes) != b:
            raise ValueError('denoise_passes needs one entry per request (or none at all)')
        extend = self.extend_lens.tolist()
        summed = [p + e for p, e in zip(self.prefix_lens.tolist(), extend, strict=True)]
        if summed != self.seq_lens.tolist():
            raise ValueError('seq_lens != prefix_lens + extend_lens')
        n = sum(extend)
        if self.input_ids.shape != (n,) or self.out_cache_loc.shape != (n,):
            raise ValueError(f'input_ids and out_cache_loc must hold {n} tokens')
        if self.forward_mode is ForwardMode.DECODE and b:
            steps = extend[0]
            if steps < 1 or extend.count(steps) != b:
                raise ValueError('a decode batch extends every request by the same k >= 1 tokens')
            if steps > 1 and _knows_later_ids(self.input_ids.tolist(), steps):
                raise ValueError('a decode burst knows only its first input id per request')
        if self.prefill_only and b:
            if self.forward_mode is not ForwardMode.EXTEND:
                raise ValueError('a prefill-only batch is an extend pass')
            if any(self.prefix_lens.tolist()) or not all(self.sample):
                raise ValueError(
                    'a prefill-only batch computes every request whole: no cached prefix, '
                    'every row an output'
                )

    @property
    def num_decode_steps(self) -> int:
        """Decode steps this batch runs (1, or ``k`` for a burst); 0 for an empty batch.

        Read from the token count (every request of a checked decode batch extends by the
        same ``k``), not from a tensor element: the result processor asks once per row.
        """
        b = len(self.rids)
        if not b:
            return 0
        if self.forward_mode is not ForwardMode.DECODE:
            return 1
        return self.input_ids.numel() // b


def _knows_later_ids(input_ids: list[int], steps: int) -> bool:
    """Whether an input id other than each request's first of ``steps`` is known."""
    return any(t != FUTURE_TOKEN_ID for i, t in enumerate(input_ids) if i % steps)


@dataclass(frozen=True, slots=True)
class ForwardOutput:
    """What a runner returns for one batch.

    ``next_token_ids[i]`` is the sampled token of request ``i``, or -1 where
    ``batch.sample[i]`` was false. For a decode burst of ``k`` steps, ``burst_token_ids[i]``
    holds request ``i``'s ``k`` tokens in order and ``next_token_ids[i]`` the last of them.
    For a prefill-only batch ``next_token_ids`` are all -1 and ``action_chunks[i]`` holds
    request ``i``'s actions (float32 ``[horizon, action_dim]``). In a batch with
    flow-matching rows, ``action_chunks[i]`` is request ``i``'s chunk when this batch ran its
    last denoising pass, else None.
    """

    next_token_ids: tuple[int, ...]
    burst_token_ids: tuple[tuple[int, ...], ...] | None = None
    action_chunks: tuple[np.ndarray, ...] | None = None

    def tokens_of(self, i: int) -> tuple[int, ...]:
        """Request ``i``'s tokens of this step, in order."""
        if self.burst_token_ids is not None:
            return self.burst_token_ids[i]
        return (self.next_token_ids[i],)


class ResultHandle(Protocol):
    """A launched step; ``result()`` blocks until its tokens are known."""

    def result(self) -> ForwardOutput: ...


class BatchRunner(Protocol):
    """What the scheduler needs from a model runner."""

    def launch(self, batch: ForwardBatch) -> ResultHandle:
        """Start the step (asynchronously where the device allows) and return its handle."""
        ...
