"""SIGINT and SIGTERM as a shutdown request the node's loop polls, never as an exception.

A Ctrl-C in a terminal reaches every process of the group, and ``ros2 launch`` sends its own
SIGINT too, so the node may get two or more while it stops its engine, and one may come at
any moment of the way out. Each signal only sets the request; the loop ends, the engine is
stopped and the runtime folder removed, and no KeyboardInterrupt can cut that short.

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
