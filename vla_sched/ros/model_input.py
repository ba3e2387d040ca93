"""Camera images reduced to the model's input size in the node, before they are sent.

The engine resizes every frame to its vision tower's square input (``EngineInfo.image_size``,
bicubic with antialiasing, rounded to uint8) before normalising it; a frame already of that
size is not resized again. Reducing a larger frame here with the same filter (Pillow's
antialiased bicubic, the filter torch's ``antialias=True`` reproduces) sends the engine
``size * size`` pixels instead of the camera's, and the model's input pixels stay within
``TOLERANCE_LEVELS`` of what the engine's own resize gives (measured: at most 1 level of 255,
0.05 to 0.2 on average, 2 levels for a JPEG decoded at a reduced DCT scale).

A frame of at most ``size * size`` pixels is left as it is (the engine upsamples it as
before), and so is every frame of a robot whose frames the engine center-crops
(``engine_crops``): the crop samples the full-resolution frame bilinearly without
antialiasing, so a reduced frame would give a visibly different crop.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from PIL import Image

# What reducing in the node may change of the model's input pixels, in levels of 255: the
# largest difference and the mean difference over the image.
TOLERANCE_LEVELS = (2.0, 0.5)


def reduce_to_model_input(rgb: np.ndarray, size: int | None) -> np.ndarray:
    """``rgb`` (uint8 ``[H, W, 3]``) resized to ``size`` x ``size`` when it has more pixels
    than that, as the engine would resize it; otherwise (or with ``size`` None) unchanged."""
    if size is None or rgb.shape[0] * rgb.shape[1] <= size * size:
        return rgb
    reduced = Image.fromarray(rgb).resize((size, size), Image.Resampling.BICUBIC)
    return np.array(reduced, dtype=np.uint8)  # writable, as the other conversions give


def engine_crops(engine_config, robot_id: str) -> bool:
    """Whether the engine center-crops ``robot_id``'s frames: an OpenVLA-OFT preset with
    ``oft_center_crop``, or the robot's own ``center_crop``."""
    oft_crop = bool(getattr(engine_config, 'oft_preset', '')) and bool(
        getattr(engine_config, 'oft_center_crop', False)
    )
    return oft_crop or bool(engine_config.robot_center_crop(robot_id))


def model_image_sizes(
    engine_info: Callable[[], Any], engine_config: Any
) -> Callable[[str], int | None]:
    """For each robot, the size its frames are reduced to: the ready engine's
    ``EngineInfo.image_size`` (``engine_info()``, None before it is ready), or None while
    there is none and for a robot whose frames the engine center-crops."""

    def size_for(robot_id: str) -> int | None:
        info = engine_info()
        if info is None or info.image_size < 1 or engine_crops(engine_config, robot_id):
            return None
        return int(info.image_size)

    return size_for
