"""ROS messages <-> numpy at the node's boundary, with every input checked first.

Images go through cv_bridge, but only after their encoding, size, step and data length have
been checked here: cv_bridge reads ``width * height * channels`` bytes from the buffer and
ignores ``step`` (a padded image decodes into sheared rows), crashes on ``is_bigendian`` under
NumPy 2, and decodes ``16UC1`` as 8-bit. So the node accepts ``rgb8``, ``bgr8`` and ``mono8``
(expanded to three channels), repacks padded rows itself, and refuses everything else.

Compressed images are sized from their header before anything is decoded: a PNG's IHDR chunk
or a JPEG's SOFn marker states the width and height, and an image declaring more than the
limit is refused without allocating anything it declares (a few hundred bytes of PNG can
declare 12000 x 12000 pixels). Data that is neither PNG nor JPEG is refused undecoded. The
rest is decoded by Pillow within a time bound, a JPEG at the scale the model needs
(``image_decode``).

Every refusal raises ``ConversionError`` (or a subclass) whose message names the field.
"""

from __future__ import annotations

import functools
import math
import struct
import time
from collections.abc import Callable, Sequence

import numpy as np
from builtin_interfaces.msg import Duration, Time
from cv_bridge import CvBridge, CvBridgeError
from sensor_msgs.msg import CompressedImage, Image, JointState

from vla_sched.ros.image_decode import DecodeError, decode_bounded

ACCEPTED_ENCODINGS = {'rgb8': 3, 'bgr8': 3, 'mono8': 1}
ACCEPTED_COMPRESSED_FORMATS = ('jpeg', 'jpg', 'png')
DEFAULT_MAX_IMAGE_PIXELS = 4096 * 4096
DEFAULT_MAX_DECODE_S = 0.5
_DCT_SCALES = (1, 2, 4, 8)  # the JPEG decoding scales (libjpeg's DCT scaling) used
PNG_SIGNATURE = b'\x89PNG\r\n\x1a\n'
JPEG_SOI = b'\xff\xd8'
# SOFn markers carry the frame size; C4 (DHT), C8 (JPG) and CC (DAC) share the range but not.
_JPEG_SOF_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
_JPEG_STANDALONE_MARKERS = frozenset({0x01, *range(0xD0, 0xD8)})  # TEM, RSTn: no length
_JPEG_SOS, _JPEG_EOI = 0xDA, 0xD9


class ConversionError(ValueError):
    """An input message that cannot become a step's input; the message says why."""


class ImageError(ConversionError):
    """Wrong encoding, size, step or data length."""


class StateError(ConversionError):
    """NaN or inf joint values, or joint names that do not match the configured ones."""


class InstructionError(ConversionError):
    """Empty or over-long instruction."""


@functools.cache
def _bridge() -> CvBridge:
    """One bridge for every conversion: it holds only lookup tables, filled when it is made
    (a new one per image cost more than the conversion), and only reads them after."""
    return CvBridge()


def image_to_rgb(msg: Image, *, max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS) -> np.ndarray:
    """Convert a ``sensor_msgs/Image`` to a contiguous uint8 RGB array ``[H, W, 3]``.

    Args:
        msg: the image; ``rgb8``, ``bgr8`` or ``mono8``, rows possibly padded (``step``).
        max_pixels: refuse images with more pixels than this.

    Raises:
        ImageError: naming the encoding, the dimensions, ``step`` or the data length.
    """
    channels = ACCEPTED_ENCODINGS.get(msg.encoding)
    if channels is None:
        raise ImageError(
            f'image encoding {msg.encoding!r} is not accepted; '
            f'use one of {sorted(ACCEPTED_ENCODINGS)}'
        )
    height, width = int(msg.height), int(msg.width)
    if height < 1 or width < 1:
        raise ImageError(f'image size {width}x{height} is empty')
    if height * width > max_pixels:
        raise ImageError(f'image size {width}x{height} exceeds {max_pixels} pixels')
    row_len = width * channels
    if msg.step < row_len:
        raise ImageError(
            f'image step {msg.step} is smaller than width*channels = {width}*{channels}'
        )
    if len(msg.data) != msg.step * height:
        raise ImageError(
            f'image data has {len(msg.data)} bytes; {width}x{height} {msg.encoding} with '
            f'step {msg.step} needs {msg.step * height}'
        )
    return _decode_checked(msg, height=height, width=width, row_len=row_len)


def _decode_checked(msg: Image, *, height: int, width: int, row_len: int) -> np.ndarray:
    if msg.step != row_len or msg.is_bigendian:
        # Hand cv_bridge a packed copy (8-bit data has no byte order).
        msg = _packed_copy(msg, height=height, width=width, row_len=row_len)
    try:
        rgb = _bridge().imgmsg_to_cv2(msg, desired_encoding='rgb8')
    except CvBridgeError as exc:
        raise ImageError(f'cv_bridge cannot convert {msg.encoding}: {exc}') from exc
    if rgb.shape != (height, width, 3) or rgb.dtype != np.uint8:
        raise ImageError(f'cv_bridge returned {rgb.dtype} {rgb.shape}, expected uint8 RGB')
    return np.ascontiguousarray(rgb)


def _packed_copy(msg: Image, *, height: int, width: int, row_len: int) -> Image:
    rows = np.frombuffer(msg.data, dtype=np.uint8).reshape(height, msg.step)[:, :row_len]
    packed = Image(header=msg.header, height=height, width=width, encoding=msg.encoding)
    packed.is_bigendian = 0
    packed.step = row_len
    packed.data = np.ascontiguousarray(rows).tobytes()
    return packed


def png_size(data: bytes | memoryview) -> tuple[int, int]:
    """``(width, height)`` from a PNG's IHDR chunk, reading only its first 24 bytes.

    Raises:
        ImageError: no PNG signature, a truncated header, a first chunk that is not a
            13-byte IHDR, or a zero width or height.
    """
    head = bytes(data[:24])
    if head[:8] != PNG_SIGNATURE:
        raise ImageError('compressed image is not a PNG (no PNG signature)')
    if len(head) < 24:
        raise ImageError(f'PNG header is truncated: {len(head)} of 24 bytes')
    chunk_len, chunk_type, width, height = struct.unpack('>I4sII', head[8:24])
    if chunk_type != b'IHDR' or chunk_len != 13:
        raise ImageError(f'PNG does not start with a 13-byte IHDR chunk ({chunk_type!r})')
    if width == 0 or height == 0:
        raise ImageError(f'PNG header declares an empty image {width}x{height}')
    return width, height


def jpeg_size(data: bytes | memoryview) -> tuple[int, int]:
    """``(width, height)`` from a JPEG's first SOFn marker, walking the marker segments
    before it (each step moves forward, so any input ends the walk).

    Raises:
        ImageError: no SOI marker, a truncated or malformed segment, scan data or the end
            of the image before a frame header, or a zero width or height (a height given
            later by a DNL marker is not supported).
    """
    view = memoryview(data)
    size = len(view)
    if bytes(view[:2]) != JPEG_SOI:
        raise ImageError('compressed image is not a JPEG (no SOI marker)')
    pos = 2
    while True:
        if pos >= size:
            raise ImageError('JPEG ends before its frame header (SOFn)')
        if view[pos] != 0xFF:
            raise ImageError(f'JPEG has no marker at byte {pos}')
        while pos < size and view[pos] == 0xFF:  # the marker's 0xFF and any fill bytes
            pos += 1
        if pos >= size:
            raise ImageError('JPEG ends before its frame header (SOFn)')
        marker = view[pos]
        pos += 1
        if marker in _JPEG_STANDALONE_MARKERS:
            continue
        if marker in (_JPEG_SOS, _JPEG_EOI, 0x00):
            raise ImageError(f'JPEG reaches marker 0x{marker:02X} before its frame header')
        if pos + 2 > size:
            raise ImageError('JPEG header is truncated in a segment length')
        (segment_len,) = struct.unpack('>H', view[pos : pos + 2])
        if segment_len < 2:
            raise ImageError(f'JPEG segment 0x{marker:02X} has length {segment_len}')
        if marker in _JPEG_SOF_MARKERS:
            if segment_len < 8 or pos + 7 > size:
                raise ImageError('JPEG frame header (SOFn) is truncated')
            height, width = struct.unpack('>HH', view[pos + 3 : pos + 7])
            if width == 0 or height == 0:
                raise ImageError(f'JPEG frame header declares {width}x{height} (not supported)')
            return width, height
        pos += segment_len


def compressed_size(data: bytes | memoryview) -> tuple[str, int, int]:
    """``(kind, width, height)`` of PNG or JPEG ``data`` as its header declares them; nothing
    is decoded.

    Raises:
        ImageError: the data is neither PNG nor JPEG, or its header is malformed.
    """
    head = bytes(data[:8])
    if head.startswith(PNG_SIGNATURE[:4]):
        return ('png', *png_size(data))
    if head.startswith(JPEG_SOI):
        return ('jpeg', *jpeg_size(data))
    raise ImageError(
        f'compressed image data is neither PNG nor JPEG (starts with {head[:4].hex()}); '
        'it is not decoded'
    )


def compressed_to_rgb(
    msg: CompressedImage,
    *,
    max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS,
    max_decode_s: float = DEFAULT_MAX_DECODE_S,
    draft_size: int | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> np.ndarray:
    """Convert a JPEG or PNG ``sensor_msgs/CompressedImage`` to uint8 RGB ``[H, W, 3]``.

    The size its header declares is checked against ``max_pixels`` before decoding; the
    decode is abandoned when it runs past ``max_decode_s``, and a JPEG is decoded at 1/2, 1/4
    or 1/8 of its size when both sides stay at least ``draft_size`` (``image_decode``).

    Raises:
        ImageError: unknown format, neither PNG nor JPEG data, a malformed header, a
            declared size over ``max_pixels``, undecodable data, a decode past the bound, or
            decoded pixels that differ from the declared size (at its decoding scale).
    """
    kind = msg.format.split(';')[0].strip().lower()
    if kind not in ACCEPTED_COMPRESSED_FORMATS and not kind.startswith(('rgb8', 'bgr8')):
        raise ImageError(
            f'compressed image format {msg.format!r} is not accepted; '
            f'use one of {list(ACCEPTED_COMPRESSED_FORMATS)}'
        )
    if len(msg.data) == 0:
        raise ImageError('compressed image has no data')
    data_kind, width, height = compressed_size(msg.data)
    if width * height > max_pixels:
        raise ImageError(
            f'{data_kind} header declares {width}x{height} = {width * height} pixels; '
            f'limits.max_image_pixels is {max_pixels}'
        )
    try:
        rgb = decode_bounded(
            bytes(msg.data),
            kind=data_kind,
            max_decode_s=max_decode_s,
            draft_size=draft_size,
            clock=clock,
        )
    except DecodeError as exc:
        raise ImageError(str(exc)) from exc
    scaled = {(-(-height // s), -(-width // s)) for s in _DCT_SCALES}
    if rgb.shape[:2] not in scaled or (draft_size is None and rgb.shape[:2] != (height, width)):
        raise ImageError(
            f'{data_kind} decoded to {rgb.shape[1]}x{rgb.shape[0]}, its header declares '
            f'{width}x{height}'
        )
    return rgb


def rgb_to_image(rgb: np.ndarray, *, stamp=None, frame_id: str = '') -> Image:
    """Build an ``rgb8`` ``sensor_msgs/Image`` from a uint8 ``[H, W, 3]`` array."""
    if rgb.dtype != np.uint8 or rgb.ndim != 3 or rgb.shape[2] != 3:
        raise ImageError(f'expected uint8 [H, W, 3], got {rgb.dtype} {rgb.shape}')
    msg = Image(height=rgb.shape[0], width=rgb.shape[1], encoding='rgb8')
    if stamp is not None:
        msg.header.stamp = stamp
    msg.header.frame_id = frame_id
    msg.is_bigendian = 0
    msg.step = rgb.shape[1] * 3
    msg.data = np.ascontiguousarray(rgb).tobytes()
    return msg


def joint_state_to_vector(msg: JointState, joint_names: Sequence[str]) -> np.ndarray:
    """The positions of ``joint_names``, in that order, as float32.

    The message may list more joints than configured (a robot publishes every joint it has),
    but each configured joint must appear exactly once with a finite position.

    Raises:
        StateError: a configured joint is missing, listed twice, or not finite, or the
            message's name and position lists differ in length.
    """
    if len(msg.name) != len(msg.position):
        raise StateError(
            f'joint_states has {len(msg.name)} names but {len(msg.position)} positions'
        )
    index: dict[str, int] = {}
    for i, name in enumerate(msg.name):
        if name in index:
            raise StateError(f'joint_states lists joint {name!r} twice')
        index[name] = i
    missing = [name for name in joint_names if name not in index]
    if missing:
        unknown = sorted(set(msg.name) - set(joint_names))
        hint = f'; it has unknown joints {unknown}' if unknown else ''
        raise StateError(f'joint_states lacks configured joints {missing}{hint}')
    values = np.array([msg.position[index[name]] for name in joint_names], dtype=np.float64)
    bad = [name for name, v in zip(joint_names, values, strict=True) if not math.isfinite(v)]
    if bad:
        raise StateError(f'joint_states has non-finite positions for {bad}')
    limit = float(np.finfo(np.float32).max)
    huge = [name for name, v in zip(joint_names, values, strict=True) if abs(v) > limit]
    if huge:
        raise StateError(f'joint_states positions of {huge} overflow float32')
    return values.astype(np.float32)


def check_instruction(text: str, *, max_bytes: int) -> str:
    """Return the instruction stripped of surrounding whitespace if it is usable.

    Raises:
        InstructionError: empty (or only whitespace), over ``max_bytes`` in UTF-8,
            containing NUL characters, or without a printable character (only control or
            format characters: nothing a model can read as a task).
    """
    size = len(text.encode('utf-8', errors='surrogatepass'))
    if size > max_bytes:
        raise InstructionError(f'instruction has {size} bytes; the limit is {max_bytes}')
    stripped = text.strip()
    if not stripped:
        raise InstructionError('instruction is empty')
    if '\x00' in stripped:
        raise InstructionError('instruction contains a NUL character')
    if not any(ch.isprintable() and not ch.isspace() for ch in stripped):
        raise InstructionError('instruction has no printable character')
    return stripped


def stamp_to_ns(stamp) -> int:
    """Nanoseconds of a ``builtin_interfaces/Time``."""
    return int(stamp.sec) * 1_000_000_000 + int(stamp.nanosec)


def ns_to_stamp(ns: int):
    """A ``builtin_interfaces/Time`` for ``ns`` nanoseconds (clamped at 0)."""
    ns = max(0, int(ns))
    return Time(sec=ns // 1_000_000_000, nanosec=ns % 1_000_000_000)


def ns_to_duration(ns: int):
    """A ``builtin_interfaces/Duration`` for ``ns`` nanoseconds (non-negative)."""
    ns = max(0, int(ns))
    return Duration(sec=ns // 1_000_000_000, nanosec=ns % 1_000_000_000)
