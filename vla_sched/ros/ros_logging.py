"""The package's Python loggers, forwarded to a ROS node's logger at that logger's level.

Parts of the package below ``ros`` (the engine client and its receiving thread, an engine
run as a thread) log through Python's ``logging`` (``vla_sched.*``), which knows nothing of
``--ros-args --log-level``. ``forward_python_logs`` gives the ``vla_sched`` Python logger
the effective level of the node's logger (as rcl set it from the command line) and a handler
that logs each record through the node's logger, so that one ``--log-level`` (``log_level``
of the launch files) reaches both, and their lines go where the node's go (console,
``/rosout``, the log file) in one format.
"""

from __future__ import annotations

import logging

from rclpy.impl.rcutils_logger import RcutilsLogger
from rclpy.logging import LoggingSeverity

PACKAGE_LOGGER = 'vla_sched'
# Python's levels to rcutils' severities, each Python level to the severity at or below it.
_SEVERITIES = (
    (logging.CRITICAL, LoggingSeverity.FATAL),
    (logging.ERROR, LoggingSeverity.ERROR),
    (logging.WARNING, LoggingSeverity.WARN),
    (logging.INFO, LoggingSeverity.INFO),
    (logging.NOTSET, LoggingSeverity.DEBUG),
)
_LEVELS = {
    LoggingSeverity.FATAL: logging.CRITICAL,
    LoggingSeverity.ERROR: logging.ERROR,
    LoggingSeverity.WARN: logging.WARNING,
    LoggingSeverity.INFO: logging.INFO,
    LoggingSeverity.DEBUG: logging.DEBUG,
}


def severity_of(levelno: int) -> LoggingSeverity:
    """The rcutils severity of a Python log level (the highest at or below it)."""
    return next(severity for level, severity in _SEVERITIES if levelno >= level)


def python_level(severity: LoggingSeverity | int) -> int:
    """The Python log level of an rcutils severity (UNSET reads as INFO, rcl's default)."""
    return _LEVELS.get(LoggingSeverity(severity), logging.INFO)


class RosLogHandler(logging.Handler):
    """Logs each record through ``ros_logger``, prefixed with the Python logger's name."""

    def __init__(self, ros_logger: RcutilsLogger) -> None:
        super().__init__()
        self._ros_logger = ros_logger

    def emit(self, record: logging.LogRecord) -> None:
        # One call site per severity: rclpy keeps a context per call site and refuses
        # another severity from the same one.
        try:
            text = f'{record.name}: {self.format(record)}'
            severity = severity_of(record.levelno)
            if severity == LoggingSeverity.DEBUG:
                self._ros_logger.debug(text)
            elif severity == LoggingSeverity.INFO:
                self._ros_logger.info(text)
            elif severity == LoggingSeverity.WARN:
                self._ros_logger.warning(text)
            elif severity == LoggingSeverity.ERROR:
                self._ros_logger.error(text)
            else:
                self._ros_logger.fatal(text)
        except Exception:
            self.handleError(record)


def forward_python_logs(ros_logger: RcutilsLogger) -> RosLogHandler:
    """Forward the ``vla_sched`` Python loggers to ``ros_logger`` at its effective level;
    the handler is returned for ``stop_forwarding``."""
    handler = RosLogHandler(ros_logger)
    package = logging.getLogger(PACKAGE_LOGGER)
    package.setLevel(python_level(ros_logger.get_effective_level()))
    package.addHandler(handler)
    package.propagate = False  # once, through the node's logger
    return handler


def stop_forwarding(handler: RosLogHandler) -> None:
    """Undo ``forward_python_logs`` (the node's logger is about to go)."""
    package = logging.getLogger(PACKAGE_LOGGER)
    package.removeHandler(handler)
    package.propagate = True
    package.setLevel(logging.NOTSET)
