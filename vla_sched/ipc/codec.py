"""Encode the frontend/engine messages as ZMQ frames, without pickle.

A message is ``[header, *buffers]``: the header is msgpack (``type``, a version, the scalar
fields, and for each numpy field its dtype, shape and buffer index); each array travels as
one raw frame. Decoding checks the type, every field, every dtype against an allow-list and
every buffer's length against its shape, so a corrupt or hostile frame raises ``CodecError``
instead of building a wrong message.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import typing
from collections.abc import Sequence
from typing import Any

import msgpack
import numpy as np

from vla_sched.ipc import messages as m

VERSION = 1
ALLOWED_DTYPES = frozenset({'uint8', 'float32', 'float64', 'int32', 'int64'})
MESSAGE_TYPES: dict[str, type] = {
    cls.__name__: cls
    for cls in (
        m.StepRequest,
        m.StepResult,
        m.StepFailure,
        m.CloseSession,
        m.Heartbeat,
        m.EngineStats,
        m.EngineInfo,
    )
}
_NESTED = {'robots': m.RobotStats}  # EngineStats.robots: dict[str, RobotStats]
_ENUMS = {'reason': m.FailureReason}


class CodecError(ValueError):
    """A frame sequence that is not a valid message."""


def encode(msg: Any) -> list[bytes | memoryview]:
    """Frames for one message: a msgpack header, then one raw buffer per numpy field."""
    name = type(msg).__name__
    if MESSAGE_TYPES.get(name) is not type(msg):
        raise CodecError(f'cannot encode {type(msg)!r}: not a vla_sched.ipc message')
    fields: dict[str, Any] = {}
    arrays: dict[str, list] = {}
    buffers: list[memoryview] = []
    for f in dataclasses.fields(msg):
        value = getattr(msg, f.name)
        if isinstance(value, np.ndarray):
            array = np.ascontiguousarray(value)
            if array.dtype.name not in ALLOWED_DTYPES:
                raise CodecError(f'{name}.{f.name}: dtype {array.dtype} is not allowed')
            arrays[f.name] = [array.dtype.name, list(array.shape), len(buffers)]
            buffers.append(memoryview(array).cast('B'))
        elif isinstance(value, enum.Enum):
            fields[f.name] = value.value
        elif f.name in _NESTED:
            fields[f.name] = {k: dataclasses.asdict(v) for k, v in value.items()}
        else:
            fields[f.name] = value
    header = msgpack.packb({'type': name, 'v': VERSION, 'fields': fields, 'arrays': arrays})
    return [header, *buffers]


def _array(name: str, spec: Any, frames: Sequence[bytes | memoryview]) -> np.ndarray:
    if not (isinstance(spec, list) and len(spec) == 3):
        raise CodecError(f'array {name}: malformed descriptor {spec!r}')
    dtype, shape, index = spec
    if dtype not in ALLOWED_DTYPES:
        raise CodecError(f'array {name}: dtype {dtype!r} is not allowed')
    if not (isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape)):
        raise CodecError(f'array {name}: bad shape {shape!r}')
    if not (isinstance(index, int) and 0 <= index < len(frames)):
        raise CodecError(f'array {name}: buffer {index!r} is missing')
    buf = memoryview(frames[index])
    want = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    if buf.nbytes != want:
        raise CodecError(f'array {name}: {buf.nbytes} bytes for {dtype} {shape} ({want} bytes)')
    # A copy: the message must not alias a ZMQ buffer that will be reused.
    return np.frombuffer(buf, dtype=dtype).reshape(shape).copy()


@functools.cache
def _scalar_types(cls: type) -> dict[str, type]:
    """The fields of ``cls`` typed as a plain str, int, float or bool."""
    hints = typing.get_type_hints(cls)
    return {name: hint for name, hint in hints.items() if hint in (str, int, float, bool)}


def _check_scalars(cls: type, fields: dict[str, Any]) -> None:
    for name, hint in _scalar_types(cls).items():
        if name not in fields:
            continue
        value = fields[name]
        ok = isinstance(value, hint) or (hint is float and isinstance(value, int))
        if not ok or (hint is int and isinstance(value, bool)):
            raise CodecError(f'{cls.__name__}.{name}: expected {hint.__name__}, got {value!r}')


def decode(frames: Sequence[bytes | memoryview]) -> Any:
    """The message encoded in ``frames``; raises CodecError on anything malformed."""
    if not frames:
        raise CodecError('empty message')
    try:
        header = msgpack.unpackb(bytes(frames[0]), raw=False, strict_map_key=True)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as exc:
        raise CodecError(f'unreadable header: {exc}') from exc
    if not isinstance(header, dict) or header.get('v') != VERSION:
        raise CodecError(f'unsupported header (version {getattr(header, "get", dict)("v")!r})')
    cls = MESSAGE_TYPES.get(header.get('type'))
    if cls is None:
        raise CodecError(f'unknown message type {header.get("type")!r}')
    fields, arrays = header.get('fields'), header.get('arrays')
    if not isinstance(fields, dict) or not isinstance(arrays, dict):
        raise CodecError(f'{cls.__name__}: malformed header')
    buffers = frames[1:]
    if len(buffers) != len(arrays):
        raise CodecError(f'{cls.__name__}: {len(buffers)} buffers for {len(arrays)} arrays')
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = (set(fields) | set(arrays)) - names
    if unknown:
        raise CodecError(f'{cls.__name__}: unknown fields {sorted(unknown)}')
    _check_scalars(cls, fields)
    kwargs = dict(fields)
    for name, spec in arrays.items():
        kwargs[name] = _array(name, spec, buffers)
    try:
        if 'reason' in kwargs and cls is m.StepFailure:
            kwargs['reason'] = _ENUMS['reason'](kwargs['reason'])
        if 'robots' in kwargs and cls is m.EngineStats:
            kwargs['robots'] = {k: _NESTED['robots'](**v) for k, v in kwargs['robots'].items()}
        return cls(**kwargs)
    except (TypeError, ValueError, AttributeError) as exc:
        raise CodecError(f'{cls.__name__}: {exc}') from exc
