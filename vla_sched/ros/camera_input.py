"""Camera images into their robots' slots: stamp checked, converted, newest image first.

Each of a robot's cameras (``RobotConfig.camera_topics``) goes through here on its own, named
by its place among the robot's cameras (0: the primary); the robot's slot puts their images
together into observations (``camera_sync``).

Every image's stamp is checked first (``robot_slot.stamp_problem``). A raw image of at most
``INLINE_MAX_BYTES`` is then converted at once on the executor's thread: its conversion is
its checks and one copy of at most that many bytes (well under a millisecond), cheaper than
handing it to a thread and waking the executor again for the result. A compressed image (a
decode whose cost its bytes do not bound) or a larger raw one is converted by an
``ImageIntake`` worker, so a slow or hostile image never holds the executor that serves the
other robots; a guard condition brings the results back to the executor. An image of a camera
whose earlier image is still with the workers goes to them too, so a camera's images reach
its slot in arrival order.

Once the engine said its input size (``model_image_size``), an image with more pixels is
reduced to it here (``model_input``; a JPEG is decoded at the scale that needs), so the
engine gets the pixels it uses and no more; such an image is always converted by a worker. A
decode that runs past ``max_decode_s`` (``limits.max_decode_s``) is abandoned.

Either way a converted image goes to its robot's slot (``RobotSlot.offer_image``) and
``on_new`` is called, and an image that cannot be used is answered through ``refuse``
(``MALFORMED_IMAGE``, with what its stamp or its conversion said: a decode abandoned at the
bound says so).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from rclpy.node import Node

from vla_sched.ipc.messages import FailureReason
from vla_sched.ros.camera_sync import CameraFrame
from vla_sched.ros.conversions import (
    DEFAULT_MAX_DECODE_S,
    compressed_to_rgb,
    image_to_rgb,
    stamp_to_ns,
)
from vla_sched.ros.image_intake import Converted, ImageIntake, run_conversion
from vla_sched.ros.model_input import reduce_to_model_input
from vla_sched.ros.robot_slot import RobotSlot, stamp_problem

INLINE_MAX_BYTES = 1 << 20  # a 640x480 rgb8 frame (921,600 bytes) is converted inline
NS_PER_S = 1_000_000_000


class Refuse(Protocol):
    def __call__(
        self, slot: RobotSlot, reason: FailureReason, detail: str, stamp_ns: int, now: int
    ) -> Any: ...


class CameraInput:
    """The node's camera images (see the module docstring)."""

    def __init__(
        self,
        node: Node,
        slots: Mapping[str, RobotSlot],
        *,
        max_pixels: int,
        max_future_stamp_s: float,
        now_ns: Callable[[], int],
        refuse: Refuse,
        on_new: Callable[[], Any],
        max_decode_s: float = DEFAULT_MAX_DECODE_S,
        model_image_size: Callable[[str], int | None] = lambda robot_id: None,
    ) -> None:
        self._slots = slots
        self._max_pixels = max_pixels
        self._max_decode_s = max_decode_s
        self._model_image_size = model_image_size
        self._max_future_ns = round(max_future_stamp_s * NS_PER_S)
        self._now_ns = now_ns
        self._refuse = refuse
        self._on_new = on_new
        self._converted_ready = node.create_guard_condition(self._take_converted)
        self.intake = ImageIntake(on_ready=self._wake_for_converted)

    def on_image(self, slot: RobotSlot, msg, *, compressed: bool, camera: int = 0) -> None:
        """The subscription callback of camera ``camera`` of ``slot`` (executor thread)."""
        now = self._now_ns()
        stamp = stamp_to_ns(msg.header.stamp)
        problem = stamp_problem(stamp, now, max_future_ns=self._max_future_ns)
        if problem is not None:
            self._refuse(slot, FailureReason.MALFORMED_IMAGE, problem, stamp, now)
            return
        size = self._model_image_size(slot.robot_id)
        job = functools.partial(
            convert_for_model,
            msg,
            compressed=compressed,
            max_pixels=self._max_pixels,
            max_decode_s=self._max_decode_s,
            size=size,
        )
        inline = (
            not compressed
            and len(msg.data) <= INLINE_MAX_BYTES
            and (size is None or int(msg.height) * int(msg.width) <= size * size)
        )
        times = dict(stamp_ns=stamp, received_ns=now, camera=camera)
        if inline and not self.intake.holds(slot.robot_id, camera):
            self._offer(slot, run_conversion(slot.robot_id, job, **times))
            self._on_new()
        elif self.intake.submit(slot.robot_id, job, **times) and camera == 0:
            slot.supersede_unconverted()

    def close(self) -> None:
        """Stop the conversion workers (a conversion running ends first)."""
        self.intake.close()

    def _wake_for_converted(self) -> None:
        """Called from an intake worker: wake the executor to take the result."""
        with contextlib.suppress(Exception):  # the node is being destroyed
            self._converted_ready.trigger()

    def _take_converted(self) -> None:
        """The workers' results into their slots, refused ones answered (executor thread)."""
        for converted in self.intake.take():
            self._offer(self._slots[converted.robot_id], converted)
        self._on_new()

    def _offer(self, slot: RobotSlot, converted: Converted) -> None:
        if converted.image is None:
            now = self._now_ns()
            self._refuse(
                slot, FailureReason.MALFORMED_IMAGE, converted.error, converted.stamp_ns, now
            )
            return
        slot.offer_image(
            CameraFrame(
                image=converted.image,
                stamp_ns=converted.stamp_ns,
                received_ns=converted.received_ns,
            ),
            converted.camera,
        )


def convert_for_model(
    msg, *, compressed: bool, max_pixels: int, max_decode_s: float, size: int | None
):
    """The RGB image of ``msg`` reduced to ``size`` x ``size`` when larger (``model_input``);
    a compressed one decoded within ``max_decode_s``, a JPEG at the scale ``size`` needs.

    Raises:
        ConversionError: what the conversion refused.
    """
    if compressed:
        rgb = compressed_to_rgb(
            msg, max_pixels=max_pixels, max_decode_s=max_decode_s, draft_size=size
        )
    else:
        rgb = image_to_rgb(msg, max_pixels=max_pixels)
    return reduce_to_model_input(rgb, size)
