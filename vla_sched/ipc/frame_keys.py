"""Per-start keys: every ZMQ frame between the node and its engine carries an HMAC.

The node makes a fresh key (``new_key``) at each engine start and hands it to the engine
process at spawn through an inherited pipe (``key_pipe``, read once by ``read_key``), never
on the command line or in the environment, where other processes of the user can read it.
Each message goes as its codec frames followed by one tag frame: HMAC-SHA256 under the key
over the direction (``TO_ENGINE`` or ``FROM_ENGINE``, so a frame cannot be sent back where it
came from) and every frame with its length. ``open_frames`` gives the codec frames of a
message whose tag checks out, and raises ``CodecError`` for any other (forged, cut, or made
under another start's key), so the receiver counts it as a bad frame and drops it.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from collections.abc import Sequence

from vla_sched.ipc.codec import CodecError

KEY_BYTES = 32
TAG_BYTES = hashlib.sha256().digest_size
TO_ENGINE = b'vla_sched to engine'
FROM_ENGINE = b'vla_sched from engine'
MAX_KEY_READ_BYTES = 4 * KEY_BYTES  # a pipe that says more is not ours


def new_key() -> bytes:
    """A fresh random key for one engine start."""
    return secrets.token_bytes(KEY_BYTES)


def check_key(key: bytes) -> bytes:
    """``key`` if it is a key (``KEY_BYTES`` bytes), else ValueError."""
    if not isinstance(key, bytes) or len(key) != KEY_BYTES:
        raise ValueError(f'a frame key is {KEY_BYTES} bytes')
    return key


def tag(key: bytes, direction: bytes, frames: Sequence[bytes | memoryview]) -> bytes:
    """The tag frame of a message's ``frames`` sent in ``direction``."""
    mac = hmac.new(key, direction, hashlib.sha256)
    for frame in frames:
        mac.update(memoryview(frame).nbytes.to_bytes(8, 'little'))
        mac.update(frame)
    return mac.digest()


def sealed(key: bytes, direction: bytes, frames: list[bytes | memoryview]) -> list:
    """``frames`` followed by their tag frame."""
    return [*frames, tag(key, direction, frames)]


def open_frames(key: bytes, direction: bytes, frames: Sequence[memoryview]) -> list[memoryview]:
    """The codec frames of a sealed message, or CodecError if its tag does not check out."""
    if len(frames) < 2 or memoryview(frames[-1]).nbytes != TAG_BYTES:
        raise CodecError('a message without its key tag (not from this start of the link)')
    body = list(frames[:-1])
    if not hmac.compare_digest(tag(key, direction, body), bytes(frames[-1])):
        raise CodecError('a message whose key tag does not match (forged, or another start)')
    return body


def key_pipe(key: bytes) -> int:
    """The read end of a pipe holding ``key`` and then its end, for a child to inherit
    (``subprocess.Popen(pass_fds=...)``); the caller closes it once the child started."""
    read_fd, write_fd = os.pipe()
    try:
        os.write(write_fd, check_key(key))
    finally:
        os.close(write_fd)
    return read_fd


def read_key(fd: int) -> bytes:
    """The key from the inherited pipe ``fd`` (which is closed), or ValueError."""
    data = b''
    try:
        while len(data) <= MAX_KEY_READ_BYTES:
            chunk = os.read(fd, MAX_KEY_READ_BYTES)
            if not chunk:
                break
            data += chunk
    finally:
        os.close(fd)
    return check_key(data)
