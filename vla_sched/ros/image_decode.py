"""Decode a PNG or JPEG within a time bound, a JPEG at the scale the model needs.

``decode_bounded`` decodes with Pillow, whose decoders take their input a block at a time: the
data is handed to them through a reader that checks the deadline before each block of
``DECODE_BLOCK_BYTES``, so a decode that runs past ``max_decode_s`` is abandoned at the next
block (its work is at most one block's past the bound) and refused. A progressive JPEG costs
a pass over every block of the image per scan, and a scan takes about 16 bytes: a crafted
file of a few hundred kB can hold thousands of them (tens of seconds to decode), so a JPEG
with more than ``MAX_JPEG_SCANS`` scans is refused before anything is decoded.

With ``draft_size``, a JPEG is decoded by libjpeg's DCT scaling (Pillow's ``draft``) at 1/2,
1/4 or 1/8 of its size, the smallest scale that keeps both sides at least ``draft_size``:
the image is reduced to the model's input size afterwards, so nothing it needs is lost, and
the inverse DCT and colour conversion run on up to 64 times fewer pixels.
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable

import numpy as np
from PIL import Image

DECODE_BLOCK_BYTES = 512  # the decoders' input between two deadline checks
MAX_JPEG_SCANS = 100  # libjpeg's progressive modes use at most about 10
_JPEG_SOS_MARKER = b'\xff\xda'  # 0xFF in entropy-coded data is followed by 0x00


class DecodeError(ValueError):
    """The data cannot be decoded, or not within the bound; the message says which."""


class _PastDeadlineError(Exception):
    pass


class _DeadlineReader(io.BytesIO):
    """The encoded bytes, read by the decoder only while the deadline has not passed."""

    def __init__(self, data: bytes, *, deadline: float, clock: Callable[[], float]) -> None:
        super().__init__(data)
        self._deadline = deadline
        self._clock = clock

    def read(self, size: int | None = -1) -> bytes:
        if self._clock() > self._deadline:
            raise _PastDeadlineError
        return super().read(size)


def count_jpeg_scans(data: bytes) -> int:
    """The SOS markers in ``data`` (an upper bound of a JPEG's scans)."""
    return data.count(_JPEG_SOS_MARKER)


def decode_bounded(
    data: bytes,
    *,
    kind: str,
    max_decode_s: float,
    draft_size: int | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> np.ndarray:
    """Decode PNG or JPEG ``data`` (``kind`` ``png`` or ``jpeg``) to uint8 RGB ``[H, W, 3]``.

    Raises:
        DecodeError: too many scans, undecodable or truncated data, or a decode still running
            ``max_decode_s`` after it started.
    """
    if kind == 'jpeg' and (scans := count_jpeg_scans(data)) > MAX_JPEG_SCANS:
        raise DecodeError(f'JPEG has {scans} scans; at most {MAX_JPEG_SCANS} are decoded')
    started = clock()
    reader = _DeadlineReader(data, deadline=started + max_decode_s, clock=clock)
    try:
        image = Image.open(reader, formats=('PNG',) if kind == 'png' else ('JPEG',))
        image.decodermaxblock = DECODE_BLOCK_BYTES
        if kind == 'jpeg' and draft_size is not None:
            image.draft('RGB', (draft_size, draft_size))
        image.load()
        rgb = np.array(image if image.mode == 'RGB' else image.convert('RGB'))
    except _PastDeadlineError:
        raise DecodeError(
            f'{kind} decode did not finish within {max_decode_s:g} s '
            f'(limits.max_decode_s): abandoned'
        ) from None
    except (OSError, ValueError, SyntaxError, EOFError, Image.DecompressionBombError) as exc:
        raise DecodeError(f'compressed image cannot be decoded: {exc}') from exc
    return np.ascontiguousarray(rgb, dtype=np.uint8)
