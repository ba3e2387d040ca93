"""Image, joint-state and instruction conversions at the node's boundary."""

from __future__ import annotations

import math

import cv2
import numpy as np
import pytest
from sensor_msgs.msg import CompressedImage, Image, JointState

from vla_sched.ros.conversions import (
    ImageError,
    InstructionError,
    StateError,
    check_instruction,
    compressed_to_rgb,
    image_to_rgb,
    joint_state_to_vector,
    ns_to_duration,
    ns_to_stamp,
    rgb_to_image,
    stamp_to_ns,
)


def _rgb(height: int = 5, width: int = 7) -> np.ndarray:
    return np.arange(height * width * 3, dtype=np.uint8).reshape(height, width, 3)


def _image(encoding: str, data: bytes, *, height: int, width: int, step: int) -> Image:
    msg = Image(height=height, width=width, encoding=encoding, step=step)
    msg.data = data
    return msg


def test_rgb8_round_trips_exactly():
    rgb = _rgb()
    out = image_to_rgb(rgb_to_image(rgb))
    assert out.dtype == np.uint8 and out.flags['C_CONTIGUOUS']
    np.testing.assert_array_equal(out, rgb)


def test_bgr8_is_converted_to_rgb():
    rgb = _rgb()
    bgr = np.ascontiguousarray(rgb[..., ::-1])
    msg = _image('bgr8', bgr.tobytes(), height=5, width=7, step=21)
    np.testing.assert_array_equal(image_to_rgb(msg), rgb)


def test_mono8_is_expanded_to_three_equal_channels():
    gray = np.arange(35, dtype=np.uint8).reshape(5, 7)
    out = image_to_rgb(_image('mono8', gray.tobytes(), height=5, width=7, step=7))
    assert out.shape == (5, 7, 3)
    for channel in range(3):
        np.testing.assert_array_equal(out[..., channel], gray)


def test_padded_rows_are_read_by_step_not_sheared():
    rgb = _rgb()
    padded = np.zeros((5, 24), dtype=np.uint8)  # 21 bytes of pixels + 3 of padding per row
    padded[:, :21] = rgb.reshape(5, 21)
    padded[:, 21:] = 99
    out = image_to_rgb(_image('rgb8', padded.tobytes(), height=5, width=7, step=24))
    np.testing.assert_array_equal(out, rgb)


def test_big_endian_flag_on_8bit_data_changes_nothing():
    rgb = _rgb()
    msg = rgb_to_image(rgb)
    msg.is_bigendian = 1
    np.testing.assert_array_equal(image_to_rgb(msg), rgb)


@pytest.mark.parametrize('encoding', ['16UC1', 'mono16', 'rgba8', 'bayer_rggb8', '32FC1', ''])
def test_other_encodings_are_refused_by_name(encoding):
    msg = _image(encoding, bytes(70), height=5, width=7, step=14)
    with pytest.raises(ImageError, match='encoding'):
        image_to_rgb(msg)


def test_truncated_data_is_refused_with_both_lengths():
    msg = _image('rgb8', bytes(104), height=5, width=7, step=21)
    with pytest.raises(ImageError, match=r'104 bytes.*needs 105'):
        image_to_rgb(msg)


def test_step_below_width_times_channels_is_refused():
    msg = _image('rgb8', bytes(100), height=5, width=7, step=20)
    with pytest.raises(ImageError, match='step 20'):
        image_to_rgb(msg)


def test_empty_and_oversized_images_are_refused():
    with pytest.raises(ImageError, match='empty'):
        image_to_rgb(_image('rgb8', b'', height=0, width=7, step=21))
    with pytest.raises(ImageError, match='exceeds 34 pixels'):
        image_to_rgb(rgb_to_image(_rgb()), max_pixels=34)


def _png(rgb: np.ndarray) -> bytes:
    ok, png = cv2.imencode('.png', np.ascontiguousarray(rgb[..., ::-1]))
    assert ok
    return png.tobytes()


def test_png_compressed_image_decodes_to_rgb():
    rgb = _rgb(8, 6)
    msg = CompressedImage(format='png', data=_png(rgb))
    np.testing.assert_array_equal(compressed_to_rgb(msg), rgb)


def test_compressed_garbage_and_unknown_formats_are_refused():
    with pytest.raises(ImageError, match='format'):
        compressed_to_rgb(CompressedImage(format='tiff', data=b'abc'))
    with pytest.raises(ImageError, match='neither PNG nor JPEG'):
        compressed_to_rgb(CompressedImage(format='jpeg', data=b'not a jpeg at all'))
    with pytest.raises(ImageError, match=r'cannot be decoded|did not decode'):
        compressed_to_rgb(CompressedImage(format='png', data=_png(_rgb(8, 6))[:60]))
    with pytest.raises(ImageError, match='no data'):
        compressed_to_rgb(CompressedImage(format='png', data=b''))


def _joints(names, positions) -> JointState:
    return JointState(name=list(names), position=[float(p) for p in positions])


def test_joint_state_is_reordered_to_the_configured_order_and_extras_ignored():
    msg = _joints(['c', 'extra', 'a', 'b'], [3.0, 9.0, 1.0, 2.0])
    out = joint_state_to_vector(msg, ('a', 'b', 'c'))
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, [1.0, 2.0, 3.0])


def test_missing_joint_is_refused_naming_it_and_the_unknown_ones():
    msg = _joints(['a', 'wrist'], [1.0, 2.0])
    with pytest.raises(StateError, match=r"lacks configured joints \['b'\].*unknown.*'wrist'"):
        joint_state_to_vector(msg, ('a', 'b'))


@pytest.mark.parametrize('bad', [math.nan, math.inf, -math.inf, 1e300])
def test_non_finite_positions_are_refused_naming_the_joint(bad):
    msg = _joints(['a', 'b'], [0.0, bad])
    with pytest.raises(StateError, match=r"'b'|overflow"):
        joint_state_to_vector(msg, ('a', 'b'))


def test_duplicate_names_and_length_mismatch_are_refused():
    with pytest.raises(StateError, match='twice'):
        joint_state_to_vector(_joints(['a', 'a'], [0.0, 1.0]), ('a',))
    msg = JointState(name=['a', 'b'], position=[0.0])
    with pytest.raises(StateError, match='2 names but 1 positions'):
        joint_state_to_vector(msg, ('a',))


def test_instruction_is_stripped_and_limited_in_utf8_bytes():
    assert check_instruction('  open the drawer \n', max_bytes=64) == 'open the drawer'
    assert check_instruction('é' * 5, max_bytes=10) == 'é' * 5
    with pytest.raises(InstructionError, match='11 bytes; the limit is 10'):
        check_instruction('é' * 5 + 'x', max_bytes=10)


@pytest.mark.parametrize('text', ['', '   ', '\n\t'])
def test_empty_instruction_is_refused(text):
    with pytest.raises(InstructionError, match='empty'):
        check_instruction(text, max_bytes=64)


def test_instruction_with_nul_is_refused():
    with pytest.raises(InstructionError, match='NUL'):
        check_instruction('go\x00now', max_bytes=64)


def test_stamps_and_durations_round_trip_nanoseconds():
    ns = 1_700_000_123_456_789_012
    stamp = ns_to_stamp(ns)
    assert (stamp.sec, stamp.nanosec) == (1_700_000_123, 456_789_012)
    assert stamp_to_ns(stamp) == ns
    duration = ns_to_duration(2_500_000_000)
    assert (duration.sec, duration.nanosec) == (2, 500_000_000)


@pytest.mark.parametrize('text', ['\x01\x02\x03', '\u200b\u200b', '\x1b\x07\x08'])
def test_an_instruction_of_control_or_format_characters_only_is_refused(text):
    with pytest.raises(InstructionError, match='no printable character'):
        check_instruction(text, max_bytes=64)
    assert check_instruction('\x01open the drawer', max_bytes=64) == '\x01open the drawer'
