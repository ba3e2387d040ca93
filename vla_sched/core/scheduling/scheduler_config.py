"""Settings of the scheduler: SGLang's knobs under their names, plus the robot rules.

Every SGLang default is a named module constant, so a reader can check it against
SGLang's ``server_args.py`` / ``environ.py`` at a glance. Configs are frozen and validated
in ``__post_init__`` without I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# SGLang defaults (server args and environment variables of the same meaning).
DEFAULT_INIT_NEW_TOKEN_RATIO = 0.7  # SGLANG_INIT_NEW_TOKEN_RATIO
DEFAULT_MIN_NEW_TOKEN_RATIO_FACTOR = 0.14  # SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR
DEFAULT_NEW_TOKEN_RATIO_DECAY_STEPS = 600  # SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS
DEFAULT_RETRACT_DECODE_STEPS = 20  # SGLANG_RETRACT_DECODE_STEPS
DEFAULT_CLIP_MAX_NEW_TOKENS_ESTIMATION = 4096  # SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION
DEFAULT_MAX_PREFILL_TOKENS = 16384  # --max-prefill-tokens
DEFAULT_CHUNKED_PREFILL_SIZE = 8192  # --chunked-prefill-size on an H200-class GPU
DEFAULT_PREEMPTION_THRESHOLD = 10  # --priority-scheduling-preemption-threshold
DEFAULT_LPM_FCFS_FALLBACK_QUEUE_LEN = 128  # lpm acts as fcfs above this many waiting
DEFAULT_IN_BATCH_PREFIX_CHECK_THRESHOLD = 32  # IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD
DEFAULT_IN_BATCH_PREFIX_DEPRIORITIZE_THRESHOLD = 32  # ..._DEPRIORITIZE_THRESHOLD
DEFAULT_PREFILL_DELAYER_MAX_DELAY_PASSES = 30  # --prefill-delayer-max-delay-passes
DEFAULT_PREFILL_DELAYER_MAX_DELAY_MS = 5000  # --prefill-delayer-max-delay-ms (None => 5000)

SCHEDULE_POLICIES = ('fcfs', 'lpm', 'dfs-weight', 'lof')
PRIORITY_POLICIES = ('fcfs', 'lof')  # the policies priority scheduling works with
RETRACTION_POLICIES = ('length', 'priority')
LATE_POLICIES = ('drop', 'deliver_late')


@dataclass(frozen=True, slots=True)
class PrefillDelayerConfig:
    """When the prefill delayer holds new prefills back (see ``prefill_delayer``).

    Attributes:
        enabled: ``--enable-prefill-delayer`` (off by default, as in SGLang).
        max_delay_passes: at most ``max_delay_passes - 1`` passes in a row are delayed.
        max_delay_ms: and never for longer than this.
        token_usage_low_watermark: below this KV usage a prefill is always allowed
            (SGLang's force-allow); None: off.
        token_usage_high_watermark: above this KV usage (low headroom) new prefills wait
            for running decodes to finish; None: off.
        near_done_decode_tokens: new prefills wait while some running request has at
            most this many tokens left to decode; None: off (the default).
    """

    enabled: bool = False
    max_delay_passes: int = DEFAULT_PREFILL_DELAYER_MAX_DELAY_PASSES
    max_delay_ms: float = DEFAULT_PREFILL_DELAYER_MAX_DELAY_MS
    token_usage_low_watermark: float | None = None
    token_usage_high_watermark: float | None = 0.9
    near_done_decode_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.max_delay_passes < 1:
            raise ValueError(f'max_delay_passes must be >= 1, got {self.max_delay_passes}')
        if not self.max_delay_ms >= 0:
            raise ValueError(f'max_delay_ms must be >= 0, got {self.max_delay_ms}')
        for name in ('token_usage_low_watermark', 'token_usage_high_watermark'):
            value = getattr(self, name)
            if value is not None and not 0.0 <= value <= 1.0:
                raise ValueError(f'{name} must be in [0, 1] or None, got {value}')
        if self.near_done_decode_tokens is not None and self.near_done_decode_tokens < 0:
            raise ValueError(
                f'near_done_decode_tokens must be >= 0 or None, got {self.near_done_decode_tokens}'
            )

    @property
    def max_delay_ns(self) -> int:
        return int(self.max_delay_ms * 1_000_000)


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """How the scheduler picks each step's batch.

    Attributes:
        schedule_policy: ``fcfs``, ``lpm``, ``dfs-weight`` or ``lof``.
        schedule_conservativeness: multiplies the initial new-token ratio.
        max_running_requests: request cap of a batch; None: the memory's request slots.
        max_queued_requests: waiting-queue limit; None: unlimited.
        max_prefill_tokens: prefill tokens per pass (the first request may exceed it when
            chunking is off).
        chunked_prefill_size: chunk token budget per pass (a multiple of the page size);
            None: chunking off.
        prefill_max_requests: requests per prefill batch; None: no cap.
        prefill_decode_interval: after a prefill step, this many passes decode only (when
            something is decoding), so consecutive chunks cannot stall running robots
            for more than one chunk at a time (SGLang's ``--prefill-decode-interval``).
        enable_priority_scheduling: sort and preempt by priority (fcfs and lof only).
        schedule_low_priority_values_first: smaller numbers are more important.
        priority_scheduling_preemption_threshold: a waiting request preempts a running one
            only if its priority is better by strictly more than this.
        disable_priority_preemption: sort by priority but never preempt.
        abort_on_priority_when_disabled: a request carrying a priority while priority
            scheduling is off is aborted (SGLang's default is False; robots get True, see
            ``scheduler`` for why).
        robot_priorities: ``(robot_id, priority)`` pairs applied to a robot's requests
            that carry no priority (priority scheduling only).
        retraction_policy: ``length`` (fewest outputs first) or ``priority``.
        init_new_token_ratio, min_new_token_ratio_factor, new_token_ratio_decay_steps,
        retract_decode_steps, clip_max_new_tokens_estimation: SGLang's budget constants.
        lpm_fcfs_fallback_queue_len, in_batch_prefix_check_threshold,
        in_batch_prefix_deprioritize_threshold: lpm's constants (-1 disables the check).
        waiting_timeout_ms, running_timeout_ms: abort after this long waiting / since the
            first admission; None: off.
        late_policy: what happens to a step past its deadline: ``drop`` (aborted, counted)
            or ``deliver_late`` (runs on, marked late, counted).
        drop_unmeetable_steps: with ``drop``, a waiting step that cannot finish before its
            deadline (now + the median service time of recent steps) is dropped before it
            takes compute from steps that can (see ``expiry``).
        size_passes_by_deadline: a prefill pass takes a step only while the pass, predicted
            from the measured cost per token, ends within the deadlines of its steps and of
            the running steps that wait for it; a step that cannot make its own even alone is
            refused under ``drop`` (see ``pass_sizing``).
        enable_overlap: process step N-1's results while step N runs.
        num_continuous_decode_steps: decode steps one pass may run as a burst (SGLang's
            ``--num-continuous-decode-steps``), in the normal loop only, when no request
            waits for prefill, no running request is past its deadline or asked to finish,
            and the pool holds every step's KV; at most each request's remaining tokens.
        enable_mixed_chunk: a prefill pass also decodes one token of every running request
            (SGLang's ``--enable-mixed-chunk``), when the pool holds those tokens; no
            decode-only pass is then due after it (``prefill_decode_interval``).
        disable_consecutive_prefill_overlap: process a prefill's results before launching
            the next prefill (better time to first token).
        retract_window_ms: length of the sliding window of the retract counter.
        latency_window_size: samples kept per latency window (TTFT, ITL, arrival to
            finish, admission to finish).
        prefill_delayer: see ``PrefillDelayerConfig``.
    """

    schedule_policy: str = 'fcfs'
    schedule_conservativeness: float = 1.0
    max_running_requests: int | None = None
    max_queued_requests: int | None = None
    max_prefill_tokens: int = DEFAULT_MAX_PREFILL_TOKENS
    chunked_prefill_size: int | None = DEFAULT_CHUNKED_PREFILL_SIZE
    prefill_max_requests: int | None = None
    prefill_decode_interval: int = 0
    enable_priority_scheduling: bool = False
    schedule_low_priority_values_first: bool = False
    priority_scheduling_preemption_threshold: int = DEFAULT_PREEMPTION_THRESHOLD
    disable_priority_preemption: bool = False
    abort_on_priority_when_disabled: bool = True
    robot_priorities: tuple[tuple[str, int], ...] = ()
    retraction_policy: str = 'length'
    init_new_token_ratio: float = DEFAULT_INIT_NEW_TOKEN_RATIO
    min_new_token_ratio_factor: float = DEFAULT_MIN_NEW_TOKEN_RATIO_FACTOR
    new_token_ratio_decay_steps: int = DEFAULT_NEW_TOKEN_RATIO_DECAY_STEPS
    retract_decode_steps: int = DEFAULT_RETRACT_DECODE_STEPS
    clip_max_new_tokens_estimation: int = DEFAULT_CLIP_MAX_NEW_TOKENS_ESTIMATION
    lpm_fcfs_fallback_queue_len: int = DEFAULT_LPM_FCFS_FALLBACK_QUEUE_LEN
    in_batch_prefix_check_threshold: int = DEFAULT_IN_BATCH_PREFIX_CHECK_THRESHOLD
    in_batch_prefix_deprioritize_threshold: int = DEFAULT_IN_BATCH_PREFIX_DEPRIORITIZE_THRESHOLD
    waiting_timeout_ms: float | None = None
    running_timeout_ms: float | None = None
    late_policy: str = 'drop'
    drop_unmeetable_steps: bool = False
    size_passes_by_deadline: bool = False
    enable_overlap: bool = True
    num_continuous_decode_steps: int = 1
    enable_mixed_chunk: bool = False
    disable_consecutive_prefill_overlap: bool = False
    retract_window_ms: float = 10_000.0
    latency_window_size: int = 1024
    prefill_delayer: PrefillDelayerConfig = field(default_factory=PrefillDelayerConfig)

    def __post_init__(self) -> None:
        self._check_choices()
        self._check_sizes()
        if self.enable_priority_scheduling and self.schedule_policy not in PRIORITY_POLICIES:
            raise ValueError(
                f'priority scheduling works with fcfs or lof only, not {self.schedule_policy!r}'
            )
        if self.robot_priorities and not self.enable_priority_scheduling:
            raise ValueError('robot_priorities need enable_priority_scheduling')
        robots = [robot for robot, _ in self.robot_priorities]
        if len(set(robots)) != len(robots):
            raise ValueError(f'robot_priorities names a robot twice: {robots}')
        if not 0.0 < self.init_new_token_ratio <= 1.0:
            raise ValueError(
                f'init_new_token_ratio must be in (0, 1], got {self.init_new_token_ratio}'
            )
        if not 0.0 <= self.min_new_token_ratio_factor <= 1.0:
            raise ValueError(
                f'min_new_token_ratio_factor must be in [0, 1], '
                f'got {self.min_new_token_ratio_factor}'
            )
        if not self.schedule_conservativeness > 0.0:
            raise ValueError(
                f'schedule_conservativeness must be > 0, got {self.schedule_conservativeness}'
            )

    def _check_choices(self) -> None:
        choices = {
            'schedule_policy': SCHEDULE_POLICIES,
            'retraction_policy': RETRACTION_POLICIES,
            'late_policy': LATE_POLICIES,
        }
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f'{name} must be one of {allowed}, got {getattr(self, name)!r}')

    def _check_sizes(self) -> None:
        positive = (
            'max_running_requests',
            'max_queued_requests',
            'max_prefill_tokens',
            'chunked_prefill_size',
            'prefill_max_requests',
            'new_token_ratio_decay_steps',
            'clip_max_new_tokens_estimation',
            'latency_window_size',
            'num_continuous_decode_steps',
        )
        for name in positive:
            value = getattr(self, name)
            if value is None and name not in ('max_prefill_tokens',):
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f'{name} must be a positive int, got {value!r}')
        for name in (
            'retract_decode_steps',
            'priority_scheduling_preemption_threshold',
            'prefill_decode_interval',
        ):
            if getattr(self, name) < 0:
                raise ValueError(f'{name} must be >= 0, got {getattr(self, name)}')
        for name in ('waiting_timeout_ms', 'running_timeout_ms', 'retract_window_ms'):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f'{name} must be > 0 or None, got {value}')

    @property
    def priority_sign(self) -> int:
        """+1 when small numbers are more important, else -1 (SGLang's ``sign``)."""
        return 1 if self.schedule_low_priority_values_first else -1

    @property
    def enable_priority_preemption(self) -> bool:
        return self.enable_priority_scheduling and not self.disable_priority_preemption

    def robot_priority(self, robot_id: str | None) -> int | None:
        """The configured priority of ``robot_id``, or None."""
        for robot, priority in self.robot_priorities:
            if robot == robot_id:
                return priority
        return None


def ms_to_ns(ms: float | None) -> int | None:
    return None if ms is None else int(ms * 1_000_000)
