"""Compressed images decode within a time bound and at the scale the model needs, and the
model's input pixels of an image reduced in the node equal those of the engine's own resize
within the stated tolerance."""

from __future__ import annotations

import io
import itertools

import cv2
import numpy as np
import pytest
from PIL import Image
from sensor_msgs.msg import CompressedImage

from vla_sched.model.config.checkpoint_spec import ImagePreprocessing
from vla_sched.model.layers.vision import preprocess_image
from vla_sched.ros.camera_input import convert_for_model
from vla_sched.ros.conversions import ImageError, compressed_to_rgb, rgb_to_image
from vla_sched.ros.image_decode import MAX_JPEG_SCANS, count_jpeg_scans
from vla_sched.ros.model_input import (
    TOLERANCE_LEVELS,
    engine_crops,
    model_image_sizes,
    reduce_to_model_input,
)
from vla_sched.ros.node_config import FrontendConfig, RobotConfig

SIZE = 224


def _scene(height: int, width: int, seed: int = 0) -> np.ndarray:
    """A camera-like frame: smooth shapes and gradients with sensor noise."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    red = (np.sin(x / 37) + np.cos(y / 23)) * 60 + 128
    rgb = np.stack([red, x * 255 / width, y * 255 / height], axis=-1)
    return (rgb + rng.normal(0, 4, rgb.shape)).clip(0, 255).astype(np.uint8)


def _jpeg(rgb: np.ndarray, **options) -> bytes:
    out = io.BytesIO()
    Image.fromarray(rgb).save(out, 'JPEG', **options)
    return out.getvalue()


def _compressed(data: bytes, fmt: str = 'jpeg') -> CompressedImage:
    return CompressedImage(format=fmt, data=data)


def _model_input(rgb: np.ndarray) -> np.ndarray:
    prep = ImagePreprocessing(image_size=SIZE, mean=(0.5,) * 6, std=(0.5,) * 6)
    return preprocess_image(rgb, prep).numpy()


def _differences(today: np.ndarray, reduced: np.ndarray) -> tuple[float, float]:
    """The largest and the mean difference of two model inputs, in levels of 255 (the
    normalisation divides by 255 * 0.5)."""
    levels = np.abs(today - reduced) * 127.5
    return float(levels.max()), float(levels.mean())


@pytest.mark.parametrize(
    ('kind', 'height', 'width'),
    [('raw', 480, 640), ('raw', 100, 640), ('png', 480, 640), ('jpeg', 1536, 2048)],
)
def test_the_model_sees_the_reduced_image_as_it_sees_the_full_one(kind, height, width):
    rgb = _scene(height, width)
    if kind == 'raw':
        msg, full = rgb_to_image(rgb), rgb
    elif kind == 'png':
        msg = _compressed(cv2.imencode('.png', rgb[..., ::-1])[1].tobytes(), 'png')
        full = rgb
    else:
        msg = _compressed(_jpeg(rgb, quality=90))
        full = cv2.cvtColor(cv2.imdecode(np.frombuffer(msg.data, np.uint8), 1), 4)  # BGR2RGB
    options = dict(compressed=kind != 'raw', max_pixels=1 << 24, max_decode_s=30.0)
    reduced = convert_for_model(msg, size=SIZE, **options)
    assert reduced.shape == (SIZE, SIZE, 3)
    np.testing.assert_array_equal(convert_for_model(msg, size=None, **options).shape, rgb.shape)
    largest, mean = _differences(_model_input(full), _model_input(reduced))
    assert largest <= TOLERANCE_LEVELS[0] + 1e-3, (largest, mean)  # float32 rounding
    assert mean <= TOLERANCE_LEVELS[1], (largest, mean)


def test_an_image_no_larger_than_the_model_input_is_sent_as_it_is():
    small = _scene(64, 64)
    assert reduce_to_model_input(small, SIZE) is small
    assert reduce_to_model_input(small, None) is small


def test_a_jpeg_is_decoded_at_the_dct_scale_that_keeps_the_model_input_size():
    msg = _compressed(_jpeg(_scene(1536, 2048), quality=80))
    assert compressed_to_rgb(msg, draft_size=SIZE).shape == (384, 512, 3)  # 1/4
    assert compressed_to_rgb(msg, draft_size=100).shape == (192, 256, 3)  # 1/8
    assert compressed_to_rgb(msg).shape == (1536, 2048, 3)


def test_a_decode_past_its_bound_is_abandoned_and_refused_naming_the_setting():
    msg = _compressed(_jpeg(_scene(512, 512), quality=95, progressive=True))
    ticks = itertools.count()
    clock = lambda: 0.1 * next(ticks)  # noqa: E731  each deadline check is 0.1 s later
    with pytest.raises(ImageError, match=r'did not finish within 0.25 s .limits.max_decode_s'):
        compressed_to_rgb(msg, max_decode_s=0.25, clock=clock)
    assert compressed_to_rgb(msg, max_decode_s=1e6, clock=clock).shape == (512, 512, 3)


def _with_repeated_scan(data: bytes, copies: int) -> bytes:
    """``data`` with its last scan (SOS marker to EOI) repeated ``copies`` more times: each
    copy is another pass over every block of the image for a decoder."""
    last_scan = data[data.rindex(b'\xff\xda') : data.rindex(b'\xff\xd9')]
    return data[:-2] + last_scan * copies + b'\xff\xd9'


def test_a_jpeg_of_more_scans_than_any_encoder_writes_is_refused_before_decoding():
    data = _jpeg(_scene(256, 256), quality=80, progressive=True)
    assert count_jpeg_scans(data) <= 12
    bomb = _with_repeated_scan(data, MAX_JPEG_SCANS)
    with pytest.raises(ImageError, match=f'scans; at most {MAX_JPEG_SCANS} are decoded'):
        compressed_to_rgb(_compressed(bomb))


def test_frames_of_robots_the_engine_center_crops_are_not_reduced():
    config = FrontendConfig(
        robots=(RobotConfig(robot_id='plain'), RobotConfig(robot_id='cropped', center_crop=True))
    )
    engine = config.engine_config()
    assert not engine_crops(engine, 'plain') and engine_crops(engine, 'cropped')

    class Info:
        image_size = SIZE

    sizes = model_image_sizes(lambda: Info(), engine)
    assert (sizes('plain'), sizes('cropped')) == (SIZE, None)
    assert model_image_sizes(lambda: None, engine)('plain') is None  # no engine yet
