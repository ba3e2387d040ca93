"""Compressed images are sized from their PNG or JPEG header, before anything is decoded."""

from __future__ import annotations

import struct
import zlib

import cv2
import numpy as np
import pytest
from sensor_msgs.msg import CompressedImage

from vla_sched.ros.conversions import (
    ImageError,
    compressed_size,
    compressed_to_rgb,
    jpeg_size,
    png_size,
)

HUGE = 12000


def _png_chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack('>I', len(body)) + kind + body + struct.pack('>I', zlib.crc32(kind + body))


def _png_declaring(width: int, height: int) -> bytes:
    """A PNG whose IHDR declares ``width`` x ``height`` RGB, with a few rows of data."""
    ihdr = struct.pack('>IIBBBBB', width, height, 8, 2, 0, 0, 0)
    idat = zlib.compress(bytes(3 * width + 1) * 4)
    return (
        b'\x89PNG\r\n\x1a\n'
        + _png_chunk(b'IHDR', ihdr)
        + _png_chunk(b'IDAT', idat)
        + _png_chunk(b'IEND', b'')
    )


def _jpeg_declaring(width: int, height: int, *, sof: int = 0xC0, fill: bytes = b'') -> bytes:
    """SOI, a JFIF APP0, a DQT, then a SOFn declaring ``width`` x ``height``, then EOI."""
    app0 = b'\xff\xe0' + struct.pack('>H', 16) + b'JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00'
    dqt = b'\xff\xdb' + struct.pack('>H', 67) + bytes(65)
    components = b'\x01\x11\x00\x02\x11\x00\x03\x11\x00'
    frame = struct.pack('>HBHHB', 17, 8, height, width, 3) + components
    return b'\xff\xd8' + app0 + fill + dqt + b'\xff' + bytes([sof]) + frame + b'\xff\xd9'


def _encoded(ext: str, width: int, height: int, *params: int) -> bytes:
    frame = np.zeros((height, width, 3), dtype=np.uint8)
    frame[:, : width // 2] = 200
    ok, data = cv2.imencode(ext, frame, list(params))
    assert ok
    return data.tobytes()


def test_real_png_and_jpeg_headers_give_their_size():
    assert png_size(_encoded('.png', 53, 37)) == (53, 37)
    assert jpeg_size(_encoded('.jpg', 53, 37)) == (53, 37)
    progressive = _encoded('.jpg', 40, 24, cv2.IMWRITE_JPEG_PROGRESSIVE, 1)
    assert compressed_size(progressive) == ('jpeg', 40, 24)


def test_a_few_hundred_bytes_can_declare_12000_squared_and_are_read_as_such():
    png = _png_declaring(HUGE, HUGE)
    jpeg = _jpeg_declaring(HUGE, HUGE, sof=0xC2, fill=b'\xff\xff')
    assert len(png) < 500 and len(jpeg) < 500
    assert compressed_size(png) == ('png', HUGE, HUGE)
    assert compressed_size(jpeg) == ('jpeg', HUGE, HUGE)


@pytest.mark.parametrize('kind', ['png', 'jpeg'])
def test_a_declared_size_over_the_limit_is_refused_before_decoding(kind):
    data = _png_declaring(HUGE, HUGE) if kind == 'png' else _jpeg_declaring(HUGE, HUGE)
    msg = CompressedImage(format=kind, data=data)
    with pytest.raises(ImageError, match=f'{kind} header declares 12000x12000 = 144000000'):
        compressed_to_rgb(msg, max_pixels=4096 * 4096)


def test_a_real_image_over_the_limit_is_refused_naming_the_setting():
    msg = CompressedImage(format='png', data=_encoded('.png', 20, 10))
    with pytest.raises(ImageError, match=r'20x10 = 200 pixels; limits\.max_image_pixels is 199'):
        compressed_to_rgb(msg, max_pixels=199)
    assert compressed_to_rgb(msg, max_pixels=200).shape == (10, 20, 3)


@pytest.mark.parametrize(
    ('data', 'text'),
    [
        (b'GIF89a' + bytes(40), 'neither PNG nor JPEG'),
        (b'BM' + bytes(60), 'neither PNG nor JPEG'),
        (b'\x89PNG\r\n\x1a\n' + bytes(4), 'PNG header is truncated'),
        (b'\x89PNG\r\n\x1a\x00' + bytes(20), 'no PNG signature'),
        (_png_declaring(8, 8)[:8] + _png_chunk(b'tEXt', b'a' * 13), 'IHDR'),
        (_png_declaring(0, 8), 'empty image 0x8'),
        (b'\xff\xd8', 'ends before its frame header'),
        (_jpeg_declaring(HUGE, HUGE)[:-16], 'frame header \\(SOFn\\) is truncated'),
        (_jpeg_declaring(HUGE, HUGE)[:23], 'truncated in a segment length'),
        (b'\xff\xd8\xff\xda\x00\x08' + bytes(8), 'marker 0xDA before its frame header'),
        (b'\xff\xd8\x00\x10', 'no marker at byte 2'),
        (b'\xff\xd8\xff\xe0\x00\x01', 'has length 1'),
        (_jpeg_declaring(640, 0), 'declares 640x0'),
    ],
)
def test_malformed_headers_are_refused_naming_the_problem(data, text):
    with pytest.raises(ImageError, match=text):
        compressed_size(data)
    with pytest.raises(ImageError, match=text):
        compressed_to_rgb(CompressedImage(format='png', data=data))


def test_an_image_decoding_to_another_size_than_declared_is_refused():
    png = bytearray(_encoded('.png', 8, 6))
    ihdr = bytes(png[12:29])  # type and body
    patched = b'IHDR' + struct.pack('>I', 9) + ihdr[8:]
    png[12:33] = patched + struct.pack('>I', zlib.crc32(patched))
    assert png_size(bytes(png)) == (9, 6)
    with pytest.raises(ImageError, match=r'cannot be decoded|did not decode|declares 9x6'):
        compressed_to_rgb(CompressedImage(format='png', data=bytes(png)))
