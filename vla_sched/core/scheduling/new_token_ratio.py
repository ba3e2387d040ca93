"""SGLang's new-token ratio: how much of their remaining output running requests reserve.

The prefill budget reserves ``min(max_new - generated, clip) * current`` future tokens per
running request. The ratio starts at ``init``, falls by ``decay`` per decode step that did
not retract (down to ``floor``), jumps to an estimate after a retraction, and is reset to
``init`` when the scheduler is fully idle::

    init  = min(init_new_token_ratio * conservativeness, 1)    # 0.7
    floor = min(init * min_new_token_ratio_factor, 1)           # 0.098
    decay = (init - floor) / new_token_ratio_decay_steps        # ~0.001 per step
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vla_sched.core.scheduling.request import Req
    from vla_sched.core.scheduling.scheduler_config import SchedulerConfig


class NewTokenRatioTracker:
    """The ratio and its three moves: decay, estimate after retract, reset.

    Args:
        config: supplies the initial value, floor factor, decay steps and retract steps.
    """

    def __init__(self, config: SchedulerConfig) -> None:
        self.init = min(config.init_new_token_ratio * config.schedule_conservativeness, 1.0)
        self.floor = min(self.init * config.min_new_token_ratio_factor, 1.0)
        self.decay = (self.init - self.floor) / config.new_token_ratio_decay_steps
        self.retract_decode_steps = config.retract_decode_steps
        self.current = self.init

    def decay_step(self) -> None:
        """One decode step ran without retracting."""
        self.current = max(self.current - self.decay, self.floor)

    def reset(self) -> None:
        """The scheduler went fully idle."""
        self.current = self.init

    def estimate_after_retract(self, remaining: Sequence[Req]) -> float:
        """``min(1, (sum generated + retract_steps * n) / (sum max_new + 1))``."""
        generated = sum(len(r.output_ids) for r in remaining)
        total = sum(r.max_new_tokens for r in remaining)
        return min(1.0, (generated + self.retract_decode_steps * len(remaining)) / (total + 1))

    def set_after_retract(self, remaining: Sequence[Req]) -> float:
        self.current = self.estimate_after_retract(remaining)
        return self.current
