"""Heartbeats both ways: when to send the next one, and whether the peer is still alive."""

from __future__ import annotations

from vla_sched.ipc.messages import Heartbeat


class HeartbeatTracker:
    """Sends this side's heartbeats at ``period_s`` and ages the peer's.

    Times are monotonic seconds passed in by the caller, so the tracker is testable without
    sleeping. The peer is alive while its last heartbeat (or any message) is younger than
    ``timeout_s``; before the first one it is not alive.
    """

    def __init__(self, *, sender: str, period_s: float, timeout_s: float) -> None:
        if not 0 < period_s < timeout_s:
            raise ValueError(f'need 0 < period ({period_s}) < timeout ({timeout_s})')
        self.sender = sender
        self.period_s = period_s
        self.timeout_s = timeout_s
        self._seq = 0
        self._next_send_s = float('-inf')
        self._last_seen_s: float | None = None

    def due(self, now_s: float) -> Heartbeat | None:
        """The heartbeat to send now, or None if the last one is recent enough."""
        if now_s < self._next_send_s:
            return None
        self._seq += 1
        self._next_send_s = now_s + self.period_s
        return Heartbeat(sender=self.sender, seq=self._seq, sent_ns=int(now_s * 1e9))

    def seen(self, now_s: float) -> None:
        """Record that the peer showed signs of life at ``now_s``."""
        self._last_seen_s = now_s

    def age_s(self, now_s: float) -> float:
        """Seconds since the peer was last seen (inf if never)."""
        return float('inf') if self._last_seen_s is None else now_s - self._last_seen_s

    def alive(self, now_s: float) -> bool:
        return self.age_s(now_s) < self.timeout_s

    def reset(self) -> None:
        """Forget the peer (a new peer is starting)."""
        self._last_seen_s = None
        self._next_send_s = float('-inf')
