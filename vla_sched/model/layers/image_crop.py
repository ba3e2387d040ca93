"""OpenVLA's LIBERO center crop: the central share of an image's area, resized back to a square.

OpenVLA's LIBERO fine-tunes (and OpenVLA-OFT's) were trained on random crops of 90% of the
image area resized back to 224x224, and their evaluation center-crops every image the same
way (``center_crop_image`` in openvla-oft's ``experiments/robot/openvla_utils.py``). This is
that crop in numpy, step for step as TensorFlow computes it, in float32:

1. ``tf.image.convert_image_dtype`` uint8 -> float32: ``pixel * (1/255)``.
2. ``tf.image.crop_and_resize`` with the centred box ``[o, o, o + s, o + s]``, ``s =
   sqrt(area_fraction)``, ``o = (1 - s) / 2``: output row ``i`` samples the image at ``y =
   y1 * (H - 1) + i * (y2 - y1) * (H - 1) / (size - 1)`` (likewise the columns), bilinearly
   between the pixels at ``floor(y)`` and ``ceil(y)``; a point outside the image is 0.
3. ``tf.clip_by_value`` to [0, 1].
4. ``tf.image.convert_image_dtype(..., uint8, saturate=True)``: ``x * 255.5`` clamped to
   [0, 255] and truncated (not rounded).
"""

from __future__ import annotations

import numpy as np

LIBERO_CROP_AREA_FRACTION = 0.9
CROP_SIZE = 224


def center_crop_image(
    image: np.ndarray,
    *,
    area_fraction: float = LIBERO_CROP_AREA_FRACTION,
    size: int = CROP_SIZE,
) -> np.ndarray:
    """The central ``area_fraction`` of ``image``'s area, resized to ``size`` x ``size``.

    Args:
        image: (H, W, C) uint8 pixels.
        area_fraction: the share of the area kept, in (0, 1]; the box's side is its square
            root of the height and of the width.
        size: side of the output in pixels.

    Returns:
        (size, size, C) uint8 pixels.

    Raises:
        ValueError: for an image that is not (H, W, C) uint8 with H, W, C >= 1, or an
            ``area_fraction`` or ``size`` out of range.
    """
    if not isinstance(image, np.ndarray) or image.dtype != np.uint8 or image.ndim != 3:
        raise ValueError(f'center crop needs (H, W, C) uint8 pixels, got {_describe(image)}')
    if min(image.shape) < 1:
        raise ValueError(f'center crop needs a non-empty image, got shape {image.shape}')
    if not isinstance(area_fraction, int | float) or isinstance(area_fraction, bool):
        raise ValueError(f'area_fraction must be a number, got {area_fraction!r}')
    if not 0.0 < area_fraction <= 1.0:
        raise ValueError(f'area_fraction must be in (0, 1], got {area_fraction!r}')
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f'size must be a positive integer, got {size!r}')
    side = np.minimum(np.sqrt(np.float32(area_fraction)), np.float32(1))
    start = (np.float32(1) - side) / np.float32(2)
    end = start + side
    height, width = image.shape[:2]
    rows, row_weights, row_inside = _sample_points(start, end, extent=height, size=size)
    cols, col_weights, col_inside = _sample_points(start, end, extent=width, size=size)
    pixels = image.astype(np.float32) * np.float32(1.0 / 255.0)
    top, bottom = pixels[rows[0]], pixels[rows[1]]  # (size, W, C) each
    col_weights = col_weights[None, :, None]
    top = top[:, cols[0]] + (top[:, cols[1]] - top[:, cols[0]]) * col_weights
    bottom = bottom[:, cols[0]] + (bottom[:, cols[1]] - bottom[:, cols[0]]) * col_weights
    crop = top + (bottom - top) * row_weights[:, None, None]
    crop[~(row_inside[:, None] & col_inside[None, :])] = 0.0
    scaled = np.clip(crop, 0.0, 1.0) * np.float32(255.5)
    return np.clip(scaled, 0.0, 255.0).astype(np.uint8)


def _sample_points(
    start: np.float32, end: np.float32, *, extent: int, size: int
) -> tuple[tuple[np.ndarray, np.ndarray], np.ndarray, np.ndarray]:
    """Where ``crop_and_resize`` samples one axis of ``extent`` pixels for ``size`` outputs
    from the box edge ``start`` to ``end`` (normalized): the pixel indices below and above
    each point, its weight towards the one above, and whether it lies inside the image."""
    last = np.float32(extent - 1)
    if size > 1:
        scale = (end - start) * last / np.float32(size - 1)
        points = start * last + np.arange(size, dtype=np.float32) * scale
    else:
        points = np.array([0.5 * (float(start) + float(end)) * (extent - 1)], dtype=np.float32)
    inside = (points >= 0) & (points <= last)
    lower = np.floor(points)
    weights = (points - lower).astype(np.float32)
    below = np.clip(lower.astype(np.int64), 0, extent - 1)
    above = np.clip(np.ceil(points).astype(np.int64), 0, extent - 1)
    return (below, above), weights, inside


def _describe(image: object) -> str:
    if isinstance(image, np.ndarray):
        return f'{image.dtype} array of shape {image.shape}'
    return type(image).__name__
