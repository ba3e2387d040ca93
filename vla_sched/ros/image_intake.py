"""Camera images converted off the node's executor thread, newest image per robot first.

Decoding a compressed image (or repacking a raw one) can take long; done in a subscription
callback it would hold the executor that publishes chunks, /diagnostics and the engine
heartbeat for every robot. ``ImageIntake`` runs the conversions on a few worker threads:

- each camera of a robot has at most one image waiting; a newer one replaces it in its place
  in the queue (``submit`` says so, so the caller counts the older as superseded), which
  bounds the memory held per camera;
- each camera has at most one image in conversion, so its results come back in arrival order;
- cameras are served round-robin: a camera joins the back of the queue when an image of it
  starts waiting and keeps its place while newer images replace that one, so a camera whose
  images come often is never pushed behind a slow camera's next image, and a camera whose
  images are slow to convert delays each other camera by at most one conversion per worker
  (which ``limits.max_decode_s`` bounds: ``conversions``);
- a conversion that raises becomes an error result; the workers never stop on one.

``run_conversion`` runs one conversion the same way on the caller's thread, for an image too
small to be worth a thread (``holds`` says whether its camera still has one here, which must
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
    camera: int = 0  # the camera's place in its robot's camera_topics


@dataclass(frozen=True, slots=True)
class _Job:
    robot_id: str
    camera: int
    stamp_ns: int
    received_ns: int
    convert: Callable[[], np.ndarray]

    @property
    def source(self) -> tuple[str, int]:
        return self.robot_id, self.camera


class ImageIntake:
    """Worker threads converting the newest image of each robot's cameras (see the module
    docstring)."""

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
        # Keyed by (robot id, camera); insertion order is arrival order.
        self._waiting: dict[tuple[str, int], _Job] = {}
        self._converting: set[tuple[str, int]] = set()
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
        camera: int = 0,
    ) -> bool:
        """Queue ``convert`` (which returns the RGB image or raises ``ConversionError``) for
        camera ``camera`` of ``robot_id``; True if it replaced that camera's image still
        waiting.

        Raises:
            RuntimeError: after ``close``.
        """
        job = _Job(robot_id, camera, stamp_ns, received_ns, convert)
        with self._lock:
            if self._closed:
                raise RuntimeError('image intake is closed')
            replaced = job.source in self._waiting
            self._waiting[job.source] = job  # a replacement keeps the replaced one's place
            self._lock.notify()
        return replaced

    def take(self) -> list[Converted]:
        """The results finished since the last call, in the order they finished."""
        with self._lock:
            results, self._results = self._results, []
        return results

    def holds(self, robot_id: str, camera: int = 0) -> bool:
        """Whether an image of camera ``camera`` of ``robot_id`` is waiting or in conversion."""
        source = robot_id, camera
        with self._lock:
            return source in self._waiting or source in self._converting

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
                for source in self._waiting:
                    if source not in self._converting:
                        self._converting.add(source)
                        return self._waiting.pop(source)
                self._lock.wait()

    def _work(self) -> None:
        while (job := self._next_job()) is not None:
            result = _run(job)
            with self._lock:
                self._converting.discard(job.source)
                self._results.append(result)
                self._lock.notify_all()  # this camera's next image may now be taken
            self._on_ready()


def _run(job: _Job) -> Converted:
    return run_conversion(
        job.robot_id,
        job.convert,
        stamp_ns=job.stamp_ns,
        received_ns=job.received_ns,
        camera=job.camera,
    )


def run_conversion(
    robot_id: str,
    convert: Callable[[], np.ndarray],
    *,
    stamp_ns: int,
    received_ns: int,
    camera: int = 0,
) -> Converted:
    """Run ``convert`` now: its image, or the error that any exception it raises becomes."""
    image, error = None, ''
    try:
        image = convert()
    except ConversionError as exc:
        error = str(exc)
    except Exception as exc:
        error = f'image conversion failed: {type(exc).__name__}: {exc}'
    return Converted(robot_id, stamp_ns, received_ns, image, error, camera)
