"""SIGINT and SIGTERM as a shutdown request the node's loop polls, never as an exception.

A Ctrl-C in a terminal reaches every process of the group, and ``ros2 launch`` sends its own
SIGINT too, so the node may get two or more while it stops its engine, and one may come at
any moment of the way out. Each signal only sets the request; the loop ends, the engine is
stopped and the runtime folder removed, and no KeyboardInterrupt can cut that short.

A signal can also come while an executable starts, before its ``ShutdownRequest`` is entered
(importing rclpy and torch takes a second or more): ``catch_early_signals``, called first
thing by every executable in ``nodes/``, keeps such a signal, and the request, once entered,
is already requested, so the executable stops at once with exit status 0 instead of a
traceback.

Once a shutdown has been requested, leaving the ``with`` block does not bring the previous
handlers back: the process is on its way out, and Python's own SIGINT handler would turn a
late signal (one arriving after the block, while the interpreter finishes) into a
KeyboardInterrupt and the exit status -2. Further SIGINT and SIGTERM are ignored instead, so
the exit status is 0 however the signals arrive. Without a request (a configuration error, an
in-process caller), the previous handlers come back.
"""

from __future__ import annotations

import signal
from types import TracebackType

SHUTDOWN_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_early_signal = ''  # the first signal caught before a ShutdownRequest was entered


def catch_early_signals() -> None:
    """Keep SIGINT and SIGTERM from now until a ``ShutdownRequest`` is entered, which then
    starts requested (call it before the slow imports; main thread only)."""
    for signum in SHUTDOWN_SIGNALS:
        signal.signal(signum, _on_early_signal)


def _on_early_signal(signum: int, _frame) -> None:
    global _early_signal
    _early_signal = _early_signal or signal.Signals(signum).name


class ShutdownRequest:
    """While entered (in the main thread), SIGINT and SIGTERM set ``requested``; on exit the
    previous handlers come back, or, once a shutdown was requested, both signals are ignored
    (see the module docstring)."""

    def __init__(self) -> None:
        self.signal_name = ''
        self._previous: dict[int, object] = {}

    @property
    def requested(self) -> bool:
        return bool(self.signal_name)

    def __enter__(self) -> ShutdownRequest:
        for signum in SHUTDOWN_SIGNALS:
            self._previous[signum] = signal.signal(signum, self._on_signal)
        self.signal_name = self.signal_name or _early_signal
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, signal.SIG_IGN if self.requested else handler)
        self._previous.clear()

    def _on_signal(self, signum: int, _frame) -> None:
        self.signal_name = self.signal_name or signal.Signals(signum).name
