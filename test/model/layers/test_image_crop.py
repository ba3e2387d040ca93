"""OpenVLA's LIBERO center crop against an independent implementation of TensorFlow's
``crop_and_resize`` and ``convert_image_dtype`` (torch ``grid_sample`` in float64)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from vla_sched.model.layers.image_crop import center_crop_image


def reference_crop(image: np.ndarray, *, area_fraction: float, size: int) -> np.ndarray:
    """TF's crop: sample points y1 * (H - 1) + i * (y2 - y1) * (H - 1) / (size - 1) (likewise
    x), bilinear; ``grid_sample`` with ``align_corners=True`` maps -1 and 1 to the first and
    last pixel centres. Then clip to [0, 1] and TF's saturating cast: trunc(x * 255.5)."""
    height, width, _ = image.shape
    side = math.sqrt(area_fraction)
    start = (1 - side) / 2
    steps = torch.arange(size, dtype=torch.float64) / (size - 1)
    rows = (start + steps * side) * (height - 1)
    cols = (start + steps * side) * (width - 1)
    grid_y = 2 * rows / (height - 1) - 1
    grid_x = 2 * cols / (width - 1) - 1
    grid = torch.stack(torch.meshgrid(grid_x, grid_y, indexing='xy'), dim=-1)[None]
    pixels = torch.from_numpy(image).permute(2, 0, 1)[None].to(torch.float64) / 255
    crop = torch.nn.functional.grid_sample(
        pixels, grid, mode='bilinear', padding_mode='zeros', align_corners=True
    )[0].permute(1, 2, 0)
    scaled = crop.clamp(0, 1) * 255.5
    return scaled.clamp(0, 255).floor().to(torch.uint8).numpy()


@pytest.mark.parametrize(
    ('shape', 'size'),
    [((256, 256, 3), 224), ((240, 320, 3), 224), ((7, 9, 3), 224), ((7, 9, 3), 5)],
)
def test_the_crop_matches_tfs_crop_and_resize_within_one_level(shape, size):
    image = np.random.default_rng(sum(shape) + size).integers(0, 256, shape, dtype=np.uint8)
    crop = center_crop_image(image, size=size)
    expected = reference_crop(image, area_fraction=0.9, size=size)
    assert crop.shape == (size, size, 3) and crop.dtype == np.uint8
    difference = np.abs(crop.astype(np.int16) - expected.astype(np.int16))
    # Both truncate x * 255.5 as TF does. TF (and the crop) place the sample points in
    # float32, the reference in float64: where the two values land on either side of an
    # integer they differ by one level (about 0.07% of the values here). Rounding x * 255
    # instead of truncating x * 255.5 would differ on about a quarter of them.
    assert difference.max() <= 1
    assert np.mean(difference == 0) >= 0.995


def test_the_crop_keeps_the_centre_and_drops_the_border():
    image = np.zeros((100, 100, 3), np.uint8)
    image[:2] = 255  # a bright border row outside the 94.9% box (starts at row 2.5)
    image[40:60, 40:60] = 200
    crop = center_crop_image(image, size=224)
    assert crop[0].max() == 0
    # trunc(200 / 255 * 255.5) = 200: a flat area keeps its level.
    assert (crop[100:124, 100:124] == 200).all()
    assert np.array_equal(center_crop_image(image, area_fraction=1.0, size=100), image)


@pytest.mark.parametrize(
    ('image', 'kwargs', 'message'),
    [
        (np.zeros((4, 4, 3), np.float32), {}, r'\(H, W, C\) uint8 pixels, got float32'),
        (np.zeros((4, 4), np.uint8), {}, r'got uint8 array of shape \(4, 4\)'),
        ([[[0]]], {}, 'got list'),
        (np.zeros((0, 4, 3), np.uint8), {}, 'non-empty image'),
        (np.zeros((4, 4, 3), np.uint8), {'area_fraction': 0.0}, r'area_fraction must be in'),
        (np.zeros((4, 4, 3), np.uint8), {'area_fraction': 1.5}, r'area_fraction must be in'),
        (np.zeros((4, 4, 3), np.uint8), {'area_fraction': '0.9'}, 'must be a number'),
        (np.zeros((4, 4, 3), np.uint8), {'size': 0}, 'size must be a positive integer'),
        (np.zeros((4, 4, 3), np.uint8), {'size': 22.4}, 'size must be a positive integer'),
    ],
)
def test_bad_inputs_are_refused_naming_what_is_wrong(image, kwargs, message):
    with pytest.raises(ValueError, match=message):
        center_crop_image(image, **kwargs)
