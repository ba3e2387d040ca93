"""What one end of the engine link refused: counted, and logged at a bounded rate.

Both ends refuse what they cannot use (a frame the codec rejects, a message of a type meant
for the other end) and keep serving. ``BadFrames`` holds the count that /diagnostics shows
and logs the first refusal at once, then at most one line per ``log_period_s`` that says how
many more came since, so a peer sending garbage cannot flood the log.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

MAX_REASON_CHARS = 200


class BadFrames:
    """Refusals of frames from ``source`` (e.g. 'the node'), counted since construction."""

    def __init__(
        self,
        source: str,
        *,
        logger: logging.Logger,
        log_period_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.source = source
        self.num_refused = 0
        self._logger = logger
        self._log_period_s = log_period_s
        self._clock = clock
        self._num_unlogged = 0
        self._next_log_s = float('-inf')

    def refuse(self, reason: str) -> None:
        """Count one refused frame; log it unless a line was logged within the period."""
        self.num_refused += 1
        now_s = self._clock()
        if now_s < self._next_log_s:
            self._num_unlogged += 1
            return
        if len(reason) > MAX_REASON_CHARS:
            reason = reason[: MAX_REASON_CHARS - 3] + '...'
        since = f'; {self._num_unlogged} more since the last line' if self._num_unlogged else ''
        self._logger.warning(
            'refused a bad frame from %s: %s (%d in all%s)',
            self.source,
            reason,
            self.num_refused,
            since,
        )
        self._num_unlogged = 0
        self._next_log_s = now_s + self._log_period_s
