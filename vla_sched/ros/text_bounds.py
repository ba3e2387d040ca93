"""Bound free text before it goes on the wire: StepRejected.detail and /diagnostics values.

A detail can name whatever a robot sent (10,000 unknown joint names make one of about
90 kB); what the node publishes keeps the start and says how long the whole text was.
"""

from __future__ import annotations

MAX_DETAIL_CHARS = 1000  # StepRejected.detail and a robot's last error
MAX_VALUE_CHARS = 300  # one /diagnostics value
MAX_MESSAGE_CAUSE_CHARS = 120  # the cause quoted in a /diagnostics summary


def bounded(text: str, max_chars: int) -> str:
    """``text`` if it has at most ``max_chars`` characters, else its start followed by a
    marker with the full length; the result never has more than ``max_chars`` characters."""
    if max_chars < 1:
        raise ValueError(f'max_chars must be >= 1, got {max_chars}')
    if len(text) <= max_chars:
        return text
    marker = f' ... [cut: {len(text)} chars in all]'
    if len(marker) >= max_chars:
        return text[:max_chars]
    return text[: max_chars - len(marker)] + marker
