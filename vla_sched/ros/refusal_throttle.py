"""At most one StepRejected per robot and reason per step's time for refused input messages.

A robot's inputs can be refused one message at a time (a bad joint_states, image or
instruction), and a sender that repeats one at 1 kHz would otherwise get a StepRejected for
each. ``RefusalThrottle`` lets one through per robot and reason per interval (the node uses
the robot's period: one per step it could have had) and holds the others; the next one let
through says how many were held. Every refusal is still counted in the robot's slot, so
/diagnostics shows them all (``refused: <reason>`` and the refusals in its window). Steps
are refused at most once each by their nature and do not go through here.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable


class RefusalThrottle:
    """See the module docstring; keys are e.g. ``(robot_id, reason)``, times integer ns."""

    def __init__(self) -> None:
        self._next_ns: dict[Hashable, int] = {}
        self._held: Counter[Hashable] = Counter()

    def admit(self, key: Hashable, now_ns: int, interval_ns: int) -> int | None:
        """None: hold this refusal (counted as held); else let it through, returning the
        number held for ``key`` since the last one let through."""
        next_ns = self._next_ns.get(key)
        if next_ns is not None and now_ns < next_ns:
            self._held[key] += 1
            return None
        self._next_ns[key] = now_ns + interval_ns
        return self._held.pop(key, 0)
