"""A robot's cameras taken as one observation: one image per camera, stamped as the primary's.

The primary camera (the first of the robot's ``camera_topics``) drives, as a robot's only
camera does: each of its images starts an observation, and a newer one replaces an observation
that was not sent. Every other camera's image is bound to the observation by its stamp alone:
when it is stamped within ``max_skew_s`` (``max_camera_skew_s``) of the primary's image: the
camera's newest image when the primary's arrives, or a closer one that arrives after it,
however late it arrives within the wait.

An observation is complete once every camera has an image bound; only then may it be sent. An
incomplete one waits for its cameras until ``max_wait_s`` (``max_camera_wait_s``) after the
primary's image arrived (on the node's clock), a bound of its own: how far apart images are
stamped says nothing of how late a camera's image may arrive (a larger image takes longer to
travel and to convert). After that its step is refused (``CAMERAS_INCOMPLETE``) with what
each missing camera sent. When a newer primary image replaces an incomplete observation, the
newer one keeps the older one's end of wait, so a silent camera gets its robot's steps
refused even when primary images come faster than the wait. With one camera every
observation is complete at once.

Nothing here knows about ROS: times are integer nanoseconds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

NS_PER_S = 1_000_000_000


@dataclass(frozen=True, slots=True)
class CameraFrame:
    """One converted camera image."""

    image: np.ndarray
    stamp_ns: int
    received_ns: int


@dataclass(slots=True)
class Observation:
    """The primary camera's image and, for each other camera, the image bound to it (None
    until one is); ``wait_until_ns`` ends the wait for the missing ones."""

    primary: CameraFrame
    others: list[CameraFrame | None]
    wait_until_ns: int

    @property
    def stamp_ns(self) -> int:
        return self.primary.stamp_ns

    @property
    def received_ns(self) -> int:
        return self.primary.received_ns

    @property
    def is_complete(self) -> bool:
        return all(frame is not None for frame in self.others)

    @property
    def images(self) -> tuple[np.ndarray, ...]:
        """Every camera's image, the primary first.

        Raises:
            RuntimeError: the observation is incomplete.
        """
        if not self.is_complete:
            raise RuntimeError('an incomplete observation has no image of every camera')
        return (self.primary.image, *(frame.image for frame in self.others))


class CameraSync:
    """One robot's cameras (see the module docstring).

    ``camera_names`` name the cameras in their order, the primary first (used in refusals);
    ``owner`` names the robot's settings (``robots.<id>``). ``max_wait_s`` defaults to
    ``max_skew_s``.
    """

    def __init__(
        self,
        camera_names: tuple[str, ...],
        *,
        max_skew_s: float,
        owner: str,
        max_wait_s: float | None = None,
    ) -> None:
        if not camera_names:
            raise ValueError(f'{owner}: a robot needs at least one camera')
        self.camera_names = camera_names
        self.max_skew_s = max_skew_s
        self.max_skew_ns = round(max_skew_s * NS_PER_S)
        self.max_wait_s = max_skew_s if max_wait_s is None else max_wait_s
        self.max_wait_ns = round(self.max_wait_s * NS_PER_S)
        self._owner = owner
        self.pending: Observation | None = None
        self._newest: list[CameraFrame | None] = [None] * (len(camera_names) - 1)

    @property
    def num_cameras(self) -> int:
        return len(self.camera_names)

    def offer(self, camera: int, frame: CameraFrame) -> bool:
        """Take ``frame`` from camera ``camera`` (0: the primary); True when it replaced an
        observation that was never sent."""
        if camera == 0:
            return self._start(frame)
        other = camera - 1
        self._newest[other] = frame
        obs = self.pending
        if obs is not None and self._is_closer(frame, obs.others[other], obs.stamp_ns):
            obs.others[other] = frame
        return False

    def is_ready(self, now_ns: int) -> bool:
        """Whether the pending observation can be taken now: complete, or its wait is over."""
        obs = self.pending
        return obs is not None and (obs.is_complete or now_ns >= obs.wait_until_ns)

    def ready_at_ns(self) -> int | None:
        """When an incomplete pending observation stops waiting for its cameras, or None."""
        obs = self.pending
        if obs is None or obs.is_complete:
            return None
        return obs.wait_until_ns

    def take(self) -> tuple[Observation, str | None]:
        """The pending observation (consumed) and, if it is incomplete, why.

        Raises:
            RuntimeError: there is no pending observation.
        """
        obs = self.pending
        if obs is None:
            raise RuntimeError(f'{self._owner}: no observation to take')
        self.pending = None
        return obs, None if obs.is_complete else self._missing(obs)

    def _start(self, primary: CameraFrame) -> bool:
        replaced = self.pending
        wait_until_ns = primary.received_ns + self.max_wait_ns
        if replaced is not None and not replaced.is_complete:
            wait_until_ns = min(wait_until_ns, replaced.wait_until_ns)
        others = [
            frame if self._is_closer(frame, None, primary.stamp_ns) else None
            for frame in self._newest
        ]
        self.pending = Observation(primary, others, wait_until_ns)
        return replaced is not None

    def _is_closer(
        self, frame: CameraFrame | None, bound: CameraFrame | None, stamp_ns: int
    ) -> bool:
        """Whether ``frame`` is within the skew of ``stamp_ns`` and closer than ``bound``."""
        if frame is None:
            return False
        skew_ns = abs(frame.stamp_ns - stamp_ns)
        if skew_ns > self.max_skew_ns:
            return False
        return bound is None or skew_ns < abs(bound.stamp_ns - stamp_ns)

    def _missing(self, obs: Observation) -> str:
        parts = []
        for other, frame in enumerate(obs.others):
            if frame is not None:
                continue
            name = self.camera_names[other + 1]
            newest = self._newest[other]
            if newest is None:
                parts.append(f'{name} (none received yet)')
                continue
            skew_ns = newest.stamp_ns - obs.stamp_ns
            side = 'after' if skew_ns > 0 else 'before'
            parts.append(f'{name} (its newest is stamped {abs(skew_ns) / NS_PER_S:.3f} s {side})')
        return (
            f'no image within {self._owner}.max_camera_skew_s = {self.max_skew_s:g} s of the '
            f"primary camera's stamp arrived in {self._owner}.max_camera_wait_s = "
            f'{self.max_wait_s:g} s from {", ".join(parts)}'
        )
