"""What a pass costs, learned from the passes that ran: the measured cost per token.

A prefill (extend) pass of ``n`` tokens is taken to cost ``base + per_token * n``: a least
squares line through the last ``window`` passes (their tokens, and the time from the later
of the pass's launch and the previous pass's end to its results), both terms kept at zero or
above. While every pass in the window had the same size the line has no slope to fit, and a
pass is estimated at the mean cost per token times its tokens. A decode step's cost is the
median over the window. Nothing is predicted before ``min_samples`` passes of the kind ran.

Not in SGLang (whose passes are sized by tokens only): the prefill pass uses these estimates
to keep the steps in a pass, and those waiting for it, within their deadlines
(``pass_sizing``).
"""

from __future__ import annotations

from collections import deque

import numpy as np

DEFAULT_WINDOW = 64
DEFAULT_MIN_SAMPLES = 4


class PassCostModel:
    """Measured pass costs (nanoseconds) and the predictions made from them.

    Args:
        window: passes of each kind kept.
        min_samples: passes of a kind before it is predicted.
    """

    def __init__(self, *, window: int = DEFAULT_WINDOW, min_samples: int = DEFAULT_MIN_SAMPLES):
        if window < 2 or not 1 <= min_samples <= window:
            raise ValueError(f'need window >= 2 and 1 <= min_samples <= window: {window}, '
                             f'{min_samples}')  # fmt: skip
        self.min_samples = min_samples
        self._prefill: deque[tuple[int, int]] = deque(maxlen=window)  # (tokens, ns)
        self._decode_step: deque[int] = deque(maxlen=window)  # ns per decode step
        self._line: tuple[float, float] | None = None  # (base, per_token), None: refit

    def record_prefill(self, num_tokens: int, ns: int) -> None:
        if num_tokens > 0 and ns > 0:
            self._prefill.append((num_tokens, ns))
            self._line = None

    def record_decode(self, num_steps: int, ns: int) -> None:
        if num_steps > 0 and ns > 0:
            self._decode_step.append(ns // num_steps)

    def prefill_line(self) -> tuple[float, float] | None:
        """``(base_ns, ns_per_token)`` of a prefill pass, or None while unknown."""
        if len(self._prefill) < self.min_samples:
            return None
        if self._line is None:
            tokens = np.array([t for t, _ in self._prefill], dtype=np.float64)
            ns = np.array([c for _, c in self._prefill], dtype=np.float64)
            if np.ptp(tokens) == 0:
                self._line = (0.0, float(ns.sum() / tokens.sum()))
            else:
                slope, base = np.polyfit(tokens, ns, 1)
                if base < 0 or slope < 0:  # a line through the origin, or the mean
                    slope = max(float((tokens @ ns) / (tokens @ tokens)), 0.0)
                    base = 0.0 if slope > 0 else float(ns.mean())
                self._line = (float(base), float(slope))
        return self._line

    def prefill_ns(self, num_tokens: int) -> float | None:
        """A prefill pass of ``num_tokens`` tokens, or None while unknown."""
        line = self.prefill_line()
        return None if line is None else line[0] + line[1] * num_tokens

    def decode_step_ns(self) -> float | None:
        """One decode step (the median), or None while unknown."""
        if len(self._decode_step) < self.min_samples:
            return None
        return float(np.median(np.fromiter(self._decode_step, dtype=np.float64)))
