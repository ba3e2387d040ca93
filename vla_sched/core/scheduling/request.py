"""The scheduler's request: one robot control step (or any generation request).

A ``Req`` holds its tokens (prompt + outputs), what it may generate, who it belongs to
(robot, session, priority, deadline), where it is in its life (extend range, chunk
counter, retraction, finish) and when things happened. Its KV memory state is a
``ReqKV`` held by composition (``req.kv``), owned by ``KVMemory``.

A prefill-only request (``prefill_only``, SGLang's name; OpenVLA-OFT's steps) generates no
token: one pass over its whole prompt gives its action chunk (``action_chunk``). It is
never cut into chunks, reuses no cached prefix and leaves none behind (its pass attends
both ways, so its KV depends on every token of the sequence), never decodes, and belongs
to no session.

A flow-matching request (``denoise_steps > 0``; pi0's steps) has such a whole-prompt prefix
pass too (its prefix attends both ways), then ``denoise_steps`` denoising passes that run
like decode steps: each pass appends one marker token (the runner's output id, never a
real token), so ``max_new_tokens`` is ``denoise_steps + 1`` (the prefix pass's marker
first), and decode bursts, mixed passes, retraction and the robot rules apply as to token
decoding. The runner keeps the denoising state on the request's row and returns the action
chunk with the last pass. A retracted flow request starts over from its prefix (its state
went with its row). Like a prefill-only request, it shares and caches no KV.

Positions of a request's tokens during one extend pass::

    0 ............ extend_start ............ extend_end ......... num_fill_tokens
    | KV in the pool (cached |  computed this pass  |  later chunks / not yet
    | prefix or own chunks)  |                      |
"""

from __future__ import annotations

import enum
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from vla_sched.core.forward_batch import FlowGuidance, ImageInput, SamplingParams
from vla_sched.core.memory.req_kv import ReqKV


class FinishKind(enum.Enum):
    """How a request ended."""

    LENGTH = 'length'  # produced max_new_tokens (a prefill-only request: its action chunk)
    ABORT = 'abort'  # ended early, see AbortReason


class AbortReason(enum.Enum):
    """Why a request was aborted (the keys of the aborts-by-reason counter)."""

    CLIENT = 'client'  # abort(rid)
    QUEUE_FULL = 'queue_full'
    PREEMPTED_BY_PRIORITY = 'preempted_by_priority'  # pushed out of a full queue
    OUT_OF_MEMORY = 'out_of_memory'
    SUPERSEDED = 'superseded'
    DEADLINE_MISSED = 'deadline_missed'
    WAITING_TIMEOUT = 'waiting_timeout'
    RUNNING_TIMEOUT = 'running_timeout'
    PROMPT_TOO_LONG = 'prompt_too_long'
    MAX_NEW_TOKENS_UNFIT = 'max_new_tokens_unfit'
    UNKNOWN_SESSION = 'unknown_session'
    SESSION_MISMATCH = 'session_mismatch'
    SESSION_CLOSED = 'session_closed'
    PRIORITY_DISABLED = 'priority_disabled'
    DUPLICATE_RID = 'duplicate_rid'


@dataclass(frozen=True, slots=True)
class FinishReason:
    """Why and how a request ended; ``message`` names the request and the limit."""

    kind: FinishKind
    abort: AbortReason | None = None
    message: str = ''

    @classmethod
    def length(cls) -> FinishReason:
        return cls(FinishKind.LENGTH)

    @classmethod
    def aborted(cls, reason: AbortReason, message: str) -> FinishReason:
        return cls(FinishKind.ABORT, reason, message)

    @property
    def is_abort(self) -> bool:
        return self.kind is FinishKind.ABORT


@dataclass(slots=True)
class ReqTimes:
    """Integer-nanosecond stamps of the scheduler's clock (None until it happens).

    Attributes:
        received_ns: when the frontend received the step's observation, set by the caller
            before ``add_request``; the scheduler neither reads nor writes it.
        arrival_ns: first ``add_request``.
        wait_queue_entry_ns: last entry into the waiting queue (re-set on retract).
        admitted_ns: first admission into a prefill batch (prefill start).
        first_token_ns: first output token processed (prefill end).
        last_token_ns: latest output token processed.
        finished_ns: finish or abort.
        token_ns: when each output token was processed (a retracted request's re-prefill
            token included), for inter-token latency.
    """

    received_ns: int | None = None
    arrival_ns: int | None = None
    wait_queue_entry_ns: int | None = None
    admitted_ns: int | None = None
    first_token_ns: int | None = None
    last_token_ns: int | None = None
    finished_ns: int | None = None
    token_ns: list[int] = field(default_factory=list)


@dataclass(eq=False, slots=True)
class Req:
    """One request (see the module docstring for the position ranges).

    Attributes:
        rid: request id, unique among live requests.
        origin_input_ids: prompt token ids (image placeholder tokens included).
        sampling: how tokens are drawn.
        max_new_tokens: tokens to generate (a robot step's H*D action tokens); 0 for a
            prefill-only request.
        images: images of the prompt; their content hashes key the radix cache.
        robot_id: the robot this step belongs to; None: no robot rules apply.
        step_seq: the robot's step number (a larger one supersedes a waiting smaller one).
        session_id: robot whose open session this request continues; None: no session.
        priority: None when not given; set from the robot or the default at queue entry.
        deadline_ns: the step is useless after this time; None: no deadline.
        stamp_ns: the observation's stamp (reported back, not used to schedule).
        extra_key: radix-cache namespace (model, adapter, embodiment).
        prefill_only: one pass over the whole prompt gives the output (see the module
            docstring); needs ``max_new_tokens == 0`` and no session.
        proprio: the robot's state (float32) for a model that takes it, else None.
        denoise_steps: a flow-matching request's denoising passes after its prefix pass (see
            the module docstring); 0 for any other request.
        noise: a flow-matching request's initial noise (float32 ``[chunk, action width]``),
            where its denoising starts (t = 1).
        guidance: a flow-matching request's real-time-chunking guidance, or None.
        action_chunk: a prefill-only or flow-matching request's output, set when its last
            pass is processed.
    """

    rid: str
    origin_input_ids: tuple[int, ...]
    sampling: SamplingParams
    max_new_tokens: int
    images: tuple[ImageInput, ...] = ()
    robot_id: str | None = None
    step_seq: int = 0
    session_id: str | None = None
    priority: int | None = None
    deadline_ns: int | None = None
    stamp_ns: int | None = None
    extra_key: Hashable = None
    prefill_only: bool = False
    proprio: np.ndarray | None = None
    denoise_steps: int = 0
    noise: np.ndarray | None = None
    guidance: FlowGuidance | None = None
    action_chunk: np.ndarray | None = field(init=False, default=None)
    kv: ReqKV = field(init=False)
    output_ids: list[int] = field(init=False, default_factory=list)
    extend_start: int = field(init=False, default=0)
    extend_end: int = field(init=False, default=0)
    inflight_middle_chunks: int = field(init=False, default=0)
    is_retracted: bool = field(init=False, default=False)
    retracted_stain: bool = field(init=False, default=False)
    retraction_count: int = field(init=False, default=0)
    to_finish: FinishReason | None = field(init=False, default=None)
    finished_reason: FinishReason | None = field(init=False, default=None)
    late: bool = field(init=False, default=False)
    deadline_counted: bool = field(init=False, default=False)
    num_cached_tokens: int = field(init=False, default=0)
    num_matched_prefix_tokens: int = field(init=False, default=0)
    times: ReqTimes = field(init=False, default_factory=ReqTimes)

    def __post_init__(self) -> None:
        self.origin_input_ids = tuple(map(int, self.origin_input_ids))
        self.images = tuple(self.images)
        if not self.origin_input_ids:
            raise ValueError(f'request {self.rid!r} has an empty prompt')
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int):
            raise ValueError(f'request {self.rid!r}: max_new_tokens must be an int')
        if self.prefill_only:
            if self.max_new_tokens != 0 or self.session_id is not None:
                raise ValueError(
                    f'request {self.rid!r} is prefill-only: it generates no token '
                    f'(max_new_tokens 0, got {self.max_new_tokens}) and continues no session'
                )
        elif self.denoise_steps:
            if self.max_new_tokens != self.denoise_steps + 1 or self.session_id is not None:
                raise ValueError(
                    f'request {self.rid!r} denoises in {self.denoise_steps} passes after its '
                    f'prefix pass: max_new_tokens must be {self.denoise_steps + 1} (one marker '
                    f'per pass, got {self.max_new_tokens}) and it continues no session'
                )
            if self.noise is None:
                raise ValueError(f'request {self.rid!r} denoises but has no initial noise')
        elif self.max_new_tokens < 1:
            raise ValueError(
                f'request {self.rid!r}: max_new_tokens must be >= 1, got {self.max_new_tokens}'
            )
        try:
            self.kv = ReqKV.from_prompt(
                self.rid, self.origin_input_ids, images=self.images, extra_key=self.extra_key
            )
        except ValueError as exc:
            raise ValueError(f'request {self.rid!r}: {exc}') from None

    # ---- tokens ----------------------------------------------------------------------

    @property
    def whole_prompt(self) -> bool:
        """Whether the prompt attends both ways (a prefill-only or flow-matching request):
        it runs whole in one pass, is never cut into chunks, and its KV is shared with no
        other sequence (matched against nothing, never cached)."""
        return self.prefill_only or self.denoise_steps > 0

    @property
    def prefix_indices(self) -> torch.Tensor:
        """KV slots of the reusable prefix (``req.kv.prefix_indices``)."""
        return self.kv.prefix_indices

    @property
    def num_fill_tokens(self) -> int:
        """Prompt plus outputs known to the host."""
        return len(self.origin_input_ids) + len(self.output_ids)

    def fill_ids(self, start: int = 0, end: int | None = None) -> list[int]:
        """Token ids of positions ``[start, end)`` of prompt + outputs."""
        end = self.num_fill_tokens if end is None else end
        num_prompt = len(self.origin_input_ids)
        if start >= num_prompt:  # outputs only (a decode step's input)
            return self.output_ids[start - num_prompt : max(end - num_prompt, 0)]
        head = list(self.origin_input_ids[start : min(end, num_prompt)])
        tail = self.output_ids[max(start - num_prompt, 0) : max(end - num_prompt, 0)]
        return head + tail

    def append_output(self, token_ids: Sequence[int]) -> None:
        """Append sampled tokens to the outputs and to the radix key."""
        ids = [int(t) for t in token_ids]
        self.output_ids += ids
        self.kv.append_tokens(ids)

    @property
    def num_remaining_tokens(self) -> int:
        """Tokens still to generate."""
        return max(self.max_new_tokens - len(self.output_ids), 0)

    # ---- life cycle ------------------------------------------------------------------

    @property
    def finished(self) -> bool:
        return self.finished_reason is not None

    def update_finish_state(self) -> bool:
        """SGLang's order: already finished, a requested finish, then the length limit."""
        if self.finished_reason is not None:
            return True
        if self.to_finish is not None:
            self.finished_reason = self.to_finish
        elif self.prefill_only:
            if self.action_chunk is not None:
                self.finished_reason = FinishReason.length()
        elif len(self.output_ids) >= self.max_new_tokens:
            if self.denoise_steps and self.action_chunk is None:
                raise RuntimeError(
                    f'{self.describe()} ran its {self.denoise_steps} denoising passes but the '
                    'runner returned no action chunk'
                )
            self.finished_reason = FinishReason.length()
        return self.finished_reason is not None

    def set_extend_range(self, start: int, end: int) -> None:
        if not 0 <= start < end <= self.num_fill_tokens:
            raise ValueError(
                f'request {self.rid!r}: extend range [{start}, {end}) is empty or outside '
                f'its {self.num_fill_tokens} tokens'
            )
        self.extend_start, self.extend_end = start, end

    def reset_for_retract(self) -> None:
        """Back to waiting after its KV was released; outputs are kept for the re-prefill."""
        if self.kv.holds_memory:
            raise RuntimeError(f'request {self.rid!r} is reset for retract while holding memory')
        self.retraction_count += 1
        self.is_retracted = True
        if self.denoise_steps:  # its denoising state went with its row: start over
            self.output_ids = []
            self.kv = ReqKV.from_prompt(
                self.rid, self.origin_input_ids, images=self.images, extra_key=self.extra_key
            )
        self.retracted_stain = True
        self.extend_start = self.extend_end = 0
        self.inflight_middle_chunks = 0
        self.num_matched_prefix_tokens = 0

    def describe(self) -> str:
        robot = f' of robot {self.robot_id!r} step {self.step_seq}' if self.robot_id else ''
        return f'request {self.rid!r}{robot}'
