"""A prefill pass sized so its steps, and the steps waiting for it, keep their deadlines.

Not in SGLang, whose passes are sized by tokens alone: one step much longer than the others
(a long instruction) would make the shared pass long enough that every robot in it, and every
running one waiting for it, is late. With ``size_passes_by_deadline`` each prefill pass has a
time budget from the measured cost per token (``pass_cost.PassCostModel``):

- a step's slack is its deadline minus now minus what it still needs after this pass (its
  remaining decode steps at the measured decode step cost; none for a prefill-only step);
- candidates are offered earliest slack first (the queue's policy order among equals), so a
  long step with time to spare does not go ahead of short steps that have none;
- a candidate joins the pass when the pass with its tokens is predicted to end within the
  slack of every step already in it, of the running steps that wait for it, and its own;
- one that does not, but would make its deadline in a pass of its own, waits (``WAIT``): it
  keeps its place in the queue and leads a later pass, which others join only as far as that
  pass keeps their deadlines, so a step too long to share is served alone;
- one that would miss its own deadline even alone (``TOO_LONG``) is refused as a deadline
  miss under ``late_policy='drop'`` while other steps wait or run (so a stale estimate cannot
  starve a robot: alone it is always tried); under ``deliver_late`` it waits until nothing
  else does, then is served alone.

Nothing is sized before the cost model has samples; steps without a deadline have no slack
limit.
"""

from __future__ import annotations

import enum
import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vla_sched.core.scheduling.pass_cost import PassCostModel
    from vla_sched.core.scheduling.request import Req


class PassVerdict(enum.Enum):
    JOIN = 'join'  # fits this pass
    WAIT = 'wait'  # fits a pass of its own, not this one: a later pass
    TOO_LONG = 'too_long'  # misses its own deadline even alone


class DeadlinePassBudget:
    """One prefill pass's time budget (see the module docstring).

    Args:
        cost: the measured pass costs.
        now_ns: when the pass is built.
        base_tokens: tokens already in the pass (a resumed chunk, mixed decode rows).
        waiting: steps whose next token waits for this pass (running, chunked).
    """

    def __init__(
        self, *, cost: PassCostModel, now_ns: int, base_tokens: int, waiting: list[Req]
    ) -> None:
        self.line = cost.prefill_line()
        self.decode_step_ns = cost.decode_step_ns() or 0.0
        self.now_ns = now_ns
        self.base_tokens = base_tokens
        self.tokens = base_tokens
        self.slack_ns = min((self.slack_of(r) for r in waiting), default=math.inf)
        self.num_joined = 0

    @property
    def active(self) -> bool:
        return self.line is not None

    def slack_of(self, req: Req) -> float:
        """Time ``req`` may wait for and spend in this pass and still make its deadline."""
        if req.deadline_ns is None:
            return math.inf
        after = max(req.num_remaining_tokens - 1, 0) * self.decode_step_ns
        return req.deadline_ns - self.now_ns - after

    def pass_ns(self, num_tokens: int) -> float:
        base, per_token = self.line
        return base + per_token * num_tokens

    def verdict(self, req: Req, extend: int) -> PassVerdict:
        """Whether ``req``, adding ``extend`` tokens, joins this pass."""
        if self.line is None:
            return PassVerdict.JOIN
        own = self.slack_of(req)
        if self.pass_ns(self.tokens + extend) <= min(self.slack_ns, own):
            return PassVerdict.JOIN
        if self.pass_ns(self.base_tokens + extend) > own:
            return PassVerdict.TOO_LONG
        return PassVerdict.WAIT

    def join(self, req: Req, extend: int) -> None:
        self.tokens += extend
        self.slack_ns = min(self.slack_ns, self.slack_of(req))
        self.num_joined += 1

    def too_long_text(self, req: Req, extend: int) -> str:
        return (
            f'{req.describe()} cannot meet its deadline: a pass of its {extend} tokens takes '
            f'{self.pass_ns(self.base_tokens + extend) / 1e6:.1f} ms (measured cost per token), '
            f'{max(self.slack_of(req), 0) / 1e6:.1f} ms left'
        )
