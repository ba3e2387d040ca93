"""Hold new prefills back for a few passes so running robots finish their decode smoothly.

SGLang's ``PrefillDelayer`` keeps data-parallel ranks prefilling in lockstep; with one
GPU its triggers (a request-slot shortage, a short queue) rarely matter. What a robot
needs is different: a new image's prefill stalls every robot that is mid-decode, so its
inter-token latency jumps. This delayer keeps SGLang's shape and parameters (a decision
once per pass, ``max_delay_passes`` = 30 with at most ``max_delay_passes - 1`` delayed
passes in a row, a ``max_delay_ms`` = 5000 safety cap, a token-usage low watermark below
which prefills always proceed, a chunked continuation always proceeds) and swaps the
triggers for two robot ones:

* low KV headroom: usage ``1 - (free + evictable) / total`` above
  ``token_usage_high_watermark``; admitting now would push running decodes into retract;
* a running decode close to done: some running request has at most
  ``near_done_decode_tokens`` tokens left, so it finishes its step without a prefill
  stalling its last tokens. Off by default: in the scheduler simulation
  (``bench/sim_policies.py``) it raised deadline misses, because delayed prefills pile
  up and then stall everyone at once. ``SchedulerConfig.prefill_decode_interval`` is the
  lever that bounds the inter-token-latency jump.

With nothing running there is nobody to protect, so a prefill is always allowed.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence

    from vla_sched.core.scheduling.request import Req
    from vla_sched.core.scheduling.scheduler_config import PrefillDelayerConfig


class DelayDecision(enum.Enum):
    """Outcome of one pass's negotiation (SGLang's reason labels)."""

    DISABLED = 'disabled'
    NO_WAIT = 'no_wait'  # no trigger, never waited
    WAIT_SUCCESS = 'wait_success'  # triggers cleared after waiting
    TOKEN_WATERMARK = 'token_watermark'  # usage below the low watermark
    IDLE = 'idle'  # nothing running
    WAIT_TIMEOUT = 'wait_timeout'  # delayed the maximum passes or time
    DELAY = 'delay'

    @property
    def allows_prefill(self) -> bool:
        return self is not DelayDecision.DELAY


class PrefillDelayer:
    """Decides, once per prefill pass, whether new requests may be prefilled.

    Args:
        config: triggers and bounds.
    """

    def __init__(self, config: PrefillDelayerConfig) -> None:
        self.config = config
        self.delayed_count = 0
        self.delay_start_ns: int | None = None

    def decide(self, *, now_ns: int, running: Sequence[Req], token_usage: float) -> DelayDecision:
        """Whether this pass may admit new requests (a delay is counted here)."""
        cfg = self.config
        if not cfg.enabled:
            return DelayDecision.DISABLED
        if not running:
            return self._allow(DelayDecision.IDLE)
        low = cfg.token_usage_low_watermark
        if low is not None and token_usage < low:
            return self._allow(DelayDecision.TOKEN_WATERMARK)
        if not self._triggered(running, token_usage):
            waited = self.delayed_count > 0
            return self._allow(DelayDecision.WAIT_SUCCESS if waited else DelayDecision.NO_WAIT)
        if self.delay_start_ns is None:
            self.delay_start_ns = now_ns
        timed_out = now_ns - self.delay_start_ns >= cfg.max_delay_ns
        if self.delayed_count >= cfg.max_delay_passes - 1 or timed_out:
            return self._allow(DelayDecision.WAIT_TIMEOUT)
        self.delayed_count += 1
        return DelayDecision.DELAY

    def _triggered(self, running: Sequence[Req], token_usage: float) -> bool:
        cfg = self.config
        high = cfg.token_usage_high_watermark
        if high is not None and token_usage > high:
            return True
        near = cfg.near_done_decode_tokens
        return near is not None and min(r.num_remaining_tokens for r in running) <= near

    def _allow(self, decision: DelayDecision) -> DelayDecision:
        self.delayed_count = 0
        self.delay_start_ns = None
        return decision
