"""Camera images converted off the node's executor thread, newest image per robot first.

Decoding a compressed image (or repacking a raw one) can take long; done in a subscription
callback it would hold the executor that publishes chunks, /diagnostics and the engine
heartbeat for every robot. ``ImageIntake`` runs the conversions on a few worker threads:

- each robot has at most one image waiting; a newer one replaces it (``submit`` says so, so
  the caller counts the older as superseded), which bounds the memory held per robot;
- each robot has at most one image in conversion, so its results come back in arrival order;
- waiting robots are served in the order their images arrived, so a robot whose images are
  slow to convert delays the others by at most one conversion per worker;
- a conversion that raises becomes an error result; the workers never stop on one.

``run_conversion`` runs one conversion the same way on the caller's thread, for an image too
small to be worth a thread (``holds`` says whether its robot still has one here, which must
come back first).

Results are collected with ``take`` on the caller's thread; ``on_ready`` is called (from a
worker) after each result, e.g. to wake an executor. Nothing here knows about ROS.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from vla_sched.ros.conversions import ConversionError

DEFAULT_NUM_WORKERS = 2


@dataclass(frozen=True, slots=True)
class Converted:
    """One image's conversion: ``image`` when it succeeded, else ``error`` says why."""

    robot_id: str
    stamp_ns: int
    received_ns: int
    image: np.ndarray | None
    error: str


@dataclass(frozen=True, slots=True)
class _Job:
    robot_id: str
    stamp_ns: int
    received_ns: int
    convert: Callable[[], np.ndarray]


class ImageIntake:
    """Worker threads converting the newest image of each robot (see the module docstring)."""

    def __init__(
        self,
        *,
        on_ready: Callable[[], Any] = lambda: None,
        num_workers: int = DEFAULT_NUM_WORKERS,
        name: str = 'image_intake',
    ) -> None:
        if num_workers < 1:
            raise ValueError(f'num_workers must be at least 1, got {num_workers}')
        self._on_ready = on_ready
        self._lock = threading.Condition()
        self._waiting: dict[str, _Job] = {}  # insertion order is arrival order
        self._converting: set[str] = set()
        self._results: list[Converted] = []
        self._closed = False
        self._workers = [
            threading.Thread(target=self._work, name=f'{name}_{i}', daemon=True)
            for i in range(num_workers)
        ]
        for worker in self._workers:
            worker.start()

    def submit(
        self,
        robot_id: str,
        convert: Callable[[], np.ndarray],
        *,
        stamp_ns: int,
        received_ns: int,
    ) -> bool:
        """Queue ``convert`` (which returns the RGB image or raises ``ConversionError``) for
        ``robot_id``; True if it replaced that robot's image still waiting.

        Raises:
            RuntimeError: after ``close``.
        """
        job = _Job(robot_id, stamp_ns, received_ns, convert)
        with self._lock:
            if self._closed:
                raise RuntimeError('image intake is closed')
            replaced = self._waiting.pop(robot_id, None) is not None
            self._waiting[robot_id] = job  # a replacement queues behind the others
            self._lock.notify()
        return replaced

    def take(self) -> list[Converted]:
        """The results finished since the last call, in the order they finished."""
        with self._lock:
            results, self._results = self._results, []
        return results

    def holds(self, robot_id: str) -> bool:
        """Whether an image of ``robot_id`` is waiting or in conversion."""
        with self._lock:
            return robot_id in self._waiting or robot_id in self._converting

    @property
    def num_waiting(self) -> int:
        with self._lock:
            return len(self._waiting)

    def close(self, timeout_s: float = 5.0) -> None:
        """Drop the waiting images and stop the workers (a conversion running ends first)."""
        with self._lock:
            self._closed = True
            self._waiting.clear()
            self._lock.notify_all()
        for worker in self._workers:
            worker.join(timeout_s)

    def _next_job(self) -> _Job | None:
        with self._lock:
            while True:
                if self._closed:
                    return None
                for robot_id in self._waiting:
                    if robot_id not in self._converting:
                        self._converting.add(robot_id)
                        return self._waiting.pop(robot_id)
                self._lock.wait()

    def _work(self) -> None:
        while (job := self._next_job()) is not None:
            result = _run(job)
            with self._lock:
                self._converting.discard(job.robot_id)
                self._results.append(result)
                self._lock.notify_all()  # this robot's next image may now be taken
            self._on_ready()


def _run(job: _Job) -> Converted:
    return run_conversion(
        job.robot_id, job.convert, stamp_ns=job.stamp_ns, received_ns=job.received_ns
    )


def run_conversion(
    robot_id: str, convert: Callable[[], np.ndarray], *, stamp_ns: int, received_ns: int
) -> Converted:
    """Run ``convert`` now: its image, or the error that any exception it raises becomes."""
    image, error = None, ''
    try:
        image = convert()
    except ConversionError as exc:
        error = str(exc)
    except Exception as exc:
        error = f'image conversion failed: {type(exc).__name__}: {exc}'
    return Converted(robot_id, stamp_ns, received_ns, image, error)
