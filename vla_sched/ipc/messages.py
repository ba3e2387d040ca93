"""What the ROS frontend and the engine say to each other: plain frozen dataclasses.

No ROS types and no tensors: images and states are numpy arrays, times are integer
nanoseconds of one clock shared by both processes (``time.time_ns()`` on the same host, or
the ROS clock's nanoseconds when the frontend runs on simulated time). A transport encodes
them without pickle (see ``vla_sched.ipc.codec``).

Frontend -> engine: ``StepRequest``, ``CloseSession``, ``Heartbeat``.
Engine -> frontend: ``EngineInfo``, ``StepResult``, ``StepFailure``, ``EngineStats``,
``Heartbeat``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import numpy as np


class FailureReason(enum.Enum):
    """Why a step produced no actions (mirrors ``vla_sched/msg/StepRejected`` reasons)."""

    MALFORMED_IMAGE = 'malformed_image'
    INVALID_STATE = 'invalid_state'
    INVALID_INSTRUCTION = 'invalid_instruction'
    KV_POOL_FULL = 'kv_pool_full'
    DEADLINE_MISSED = 'deadline_missed'
    SUPERSEDED = 'superseded'
    ENGINE_UNAVAILABLE = 'engine_unavailable'
    INTERNAL_ERROR = 'internal_error'
    QUEUE_FULL = 'queue_full'
    CANCELLED = 'cancelled'
    STALE_STATE = 'stale_state'
    INACTIVE = 'inactive'
    CAMERAS_INCOMPLETE = 'cameras_incomplete'
    ENGINE_TIMEOUT = 'engine_timeout'  # no answer by the deadline plus a margin (node side)


@dataclass(frozen=True, slots=True, eq=False)
class StepRequest:
    """One control step of one robot: its newest observation and what to do with it.

    ``images`` holds one image per camera of the robot, the primary (third-person) camera
    first, then the others (wrist cameras) in the robot's configured order; the step's
    ``stamp_ns`` is the primary's. ``state`` is already in the checkpoint's state order (the
    frontend maps joint names).
    ``instruction_version`` increases whenever the robot's instruction changes; the engine
    swaps the robot's session prefix when it sees a new version.
    For a robot with real-time chunking, ``previous_actions`` holds the actions of its last
    chunk that are still to run at this step's actions' times (row ``k`` at the time of this
    step's action ``k``; float32 ``[n, action_dim]`` in robot units, ``n`` 0 for none) and
    ``inference_delay`` how many of this step's first actions will have run before its
    chunk arrives.
    """

    robot_id: str
    step_seq: int
    stamp_ns: int  # the observation's stamp
    deadline_ns: int  # the step is useless after this time
    received_ns: int  # when the frontend received the observation
    images: tuple[np.ndarray, ...]  # each uint8 [H, W, 3], RGB; the primary first
    state: np.ndarray  # float32 [num_state]
    instruction: str
    instruction_version: int
    priority: int = 0
    previous_actions: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.float32))
    inference_delay: int = 0


@dataclass(frozen=True, slots=True, eq=False)
class StepResult:
    """The action chunk of one step, already un-normalized: float32 [horizon, dof]."""

    robot_id: str
    step_seq: int
    stamp_ns: int
    actions: np.ndarray
    queue_ms: float
    prefill_ms: float
    decode_ms: float
    late: bool
    num_cached_prefix_tokens: int


@dataclass(frozen=True, slots=True)
class StepFailure:
    """A step that produced no actions, and why (``detail`` names the field or limit)."""

    robot_id: str
    step_seq: int
    stamp_ns: int
    reason: FailureReason
    detail: str


@dataclass(frozen=True, slots=True)
class CloseSession:
    """The robot is gone (or reconfigured): release its session and cached prefix."""

    robot_id: str


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """Sent both ways at a fixed period; a peer silent for too long is considered dead."""

    sender: str  # 'frontend' or 'engine'
    seq: int
    sent_ns: int


@dataclass(frozen=True, slots=True)
class RobotStats:
    """What only the engine knows about one robot (the frontend counts its steps' outcomes).

    Latencies are over the engine's recent window, from the step's arrival in the engine.
    """

    num_retracts: int = 0  # since the engine started
    num_cached_session_prefix_tokens: int = 0  # of its session prefix, in the radix cache now
    ttft_ms_p50: float = 0.0  # arrival to first action token
    itl_ms_p50: float = 0.0  # one action token to the next
    itl_ms_p99: float = 0.0


@dataclass(frozen=True, slots=True)
class EngineStats:
    """A snapshot of the scheduler's health, sent at the diagnostics period.

    The queue, batch, chunked request and KV use are read at ``sent_ns``; counters are
    cumulative since the engine started; latency percentiles are over a recent window.
    """

    sent_ns: int
    num_waiting: int
    num_running: int
    chunked_rid: str  # '' when no request is being prefilled in chunks
    num_retracts_total: int
    num_retracts_window: int
    num_delayed_prefills: int
    kv_use_percent: float
    cache_hit_rate: float  # cached prompt tokens / prompt tokens, over the engine's life
    arrival_to_finish_ms_p50: float  # a completed step, from its arrival in the engine
    arrival_to_finish_ms_p99: float
    itl_ms_p50: float
    itl_ms_p99: float
    aborts_by_reason: dict[str, int] = field(default_factory=dict)
    robots: dict[str, RobotStats] = field(default_factory=dict)
    # Frames from the frontend the engine refused (unreadable, or not a message for it).
    num_bad_frames_received: int = 0
    # Pass sizing by deadline: steps left for a later pass so that the others keep their
    # deadlines, and the measured prefill cost per token and decode step (NaN: not yet).
    num_deadline_waits: int = 0
    prefill_us_per_token: float = float('nan')
    decode_step_ms: float = float('nan')


@dataclass(frozen=True, slots=True)
class EngineInfo:
    """Sent by the engine once it is ready: what the loaded checkpoint expects and returns."""

    model_name: str
    num_state: int  # length of StepRequest.state (0: the checkpoint takes no state)
    action_horizon: int  # H
    action_dim: int  # D
    image_size: int  # the vision tower's input size; frames of any size are resized to it
    max_instruction_bytes: int  # longest accepted instruction, in UTF-8 bytes
    random_weights: bool  # true for the built-in tiny checkpoint: its actions are meaningless
    # What a robot's steps can share in the radix cache: 'instruction first' (the session
    # prefix: BOS and the instruction text) or 'image first' (OpenVLA: only BOS).
    prompt_layout: str = ''
    # Length of StepRequest.images: the cameras each step carries (1 for OpenVLA and LLaVA).
    num_images: int = 1
