"""Encode the frontend/engine messages as ZMQ frames, without pickle.

A message is ``[header, *buffers]``: the header is msgpack (``type``, a version, the scalar
fields, and for each numpy field its dtype, shape and buffer index; for a field holding a
tuple of arrays, such as ``StepRequest.images``, a list of 1 to ``MAX_ARRAYS_PER_FIELD`` of
those); each array travels as one raw frame. Decoding checks the type, every field, every
dtype against an allow-list and every buffer's length against its shape, so a corrupt or
hostile frame raises ``CodecError`` instead of building a wrong message.
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

# 3: StepRequest.images (a tuple of arrays) and EngineInfo.num_images; 4: StepRequest's
# previous_actions and inference_delay (real-time chunking).
VERSION = 4
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
ARRAY_TUPLE = tuple[np.ndarray, ...]  # the declared type of a field holding several arrays
MAX_ARRAYS_PER_FIELD = 8


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

    def descriptor(where: str, value: np.ndarray) -> list:
        array = np.ascontiguousarray(value)
        if array.dtype.name not in ALLOWED_DTYPES:
            raise CodecError(f'{where}: dtype {array.dtype} is not allowed')
        # An empty array (no previous actions) travels as an empty frame.
        buffers.append(memoryview(array).cast('B') if array.size else memoryview(b''))
        return [array.dtype.name, list(array.shape), len(buffers) - 1]

    hints = _hints(type(msg))
    for f in dataclasses.fields(msg):
        value = getattr(msg, f.name)
        if hints[f.name] == ARRAY_TUPLE:
            _check_tuple_len(f'{name}.{f.name}', value)
            if not all(isinstance(item, np.ndarray) for item in value):
                raise CodecError(f'{name}.{f.name}: expected a tuple of numpy arrays')
            arrays[f.name] = [descriptor(f'{name}.{f.name}[{i}]', v) for i, v in enumerate(value)]
        elif isinstance(value, np.ndarray):
            arrays[f.name] = descriptor(f'{name}.{f.name}', value)
        elif isinstance(value, enum.Enum):
            fields[f.name] = value.value
        elif f.name in _NESTED:
            fields[f.name] = {k: dataclasses.asdict(v) for k, v in value.items()}
        else:
            fields[f.name] = value
    header = msgpack.packb({'type': name, 'v': VERSION, 'fields': fields, 'arrays': arrays})
    return [header, *buffers]


INT64_MAX = 2**63 - 1
MAX_NDIM = 32  # numpy's smallest limit across versions
_HEADER_KEYS = frozenset({'type', 'v', 'fields', 'arrays'})
_SCALARS = (str, int, float, bool)


@dataclasses.dataclass(frozen=True, slots=True)
class _ArraySpec:
    """A checked array descriptor: its buffer's length already matches dtype and shape."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    index: int
    buffer: memoryview


def _frame(frame: Any) -> memoryview:
    """``frame`` as a flat byte view (no copy); CodecError if it is not a contiguous buffer."""
    try:
        return memoryview(frame).cast('B')
    except (TypeError, ValueError) as exc:
        raise CodecError(f'frame is not a contiguous byte buffer: {exc}') from exc


def _read_header(frame: memoryview) -> dict:
    """The header map, with exactly the keys ``type``, ``v``, ``fields`` and ``arrays``."""
    try:
        header = msgpack.unpackb(frame, raw=False, strict_map_key=True)
    except (ValueError, TypeError, OverflowError, msgpack.UnpackException) as exc:
        raise CodecError(f'unreadable header: {exc}') from exc
    if not isinstance(header, dict):
        raise CodecError(f'header is a {type(header).__name__}, not a map')
    if set(header) != _HEADER_KEYS:
        raise CodecError(f'header keys {sorted(header, key=repr)} are not {sorted(_HEADER_KEYS)}')
    version = header['v']
    if type(version) is not int or version != VERSION:
        raise CodecError(f'unsupported header (version {version!r})')
    return header


def _message_class(name: Any) -> type:
    cls = MESSAGE_TYPES.get(name) if isinstance(name, str) else None
    if cls is None:
        raise CodecError(f'unknown message type {name!r}')
    return cls


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    """The declared type of every field of ``cls``."""
    return typing.get_type_hints(cls)


@functools.cache
def _required(cls: type) -> frozenset[str]:
    """The fields of ``cls`` that have no default."""
    no_default = dataclasses.MISSING
    return frozenset(
        f.name
        for f in dataclasses.fields(cls)
        if f.default is no_default and f.default_factory is no_default
    )


def _holds_arrays(hint: Any) -> bool:
    """Whether a field declared ``hint`` travels as buffers: an array or a tuple of arrays."""
    return hint is np.ndarray or hint == ARRAY_TUPLE


def _check_tuple_len(where: str, value: Any) -> None:
    """``value`` is a tuple (or, decoded, a list) of 1 to ``MAX_ARRAYS_PER_FIELD`` items."""
    if not isinstance(value, tuple | list):
        raise CodecError(f'{where}: expected a tuple of arrays, got {type(value).__name__}')
    if not 1 <= len(value) <= MAX_ARRAYS_PER_FIELD:
        raise CodecError(f'{where}: {len(value)} arrays, expected 1 to {MAX_ARRAYS_PER_FIELD}')


def _check_names(cls: type, fields: dict, arrays: dict) -> None:
    """No unknown field, every array field in ``arrays``, every other one in ``fields``."""
    where = cls.__name__
    hints = _hints(cls)
    unknown = (set(fields) | set(arrays)) - set(hints)
    if unknown:
        raise CodecError(f'{where}: unknown fields {sorted(unknown, key=repr)}')
    for name in fields:
        if _holds_arrays(hints[name]):
            raise CodecError(f'{where}.{name}: an array field sent as a scalar')
    for name in arrays:
        if not _holds_arrays(hints[name]):
            raise CodecError(f'{where}.{name}: a scalar field sent as an array')
    missing = _required(cls) - set(fields) - set(arrays)
    if missing:
        raise CodecError(f'{where}: missing fields {sorted(missing)}')


def _type_name(hint: Any) -> str:
    return getattr(hint, '__name__', None) or repr(hint)


def _value(where: str, hint: Any, value: Any) -> Any:
    """``value`` checked against the declared ``hint``, and converted to it (enum, nested)."""
    if hint in _SCALARS:
        ok = isinstance(value, hint) or (hint is float and isinstance(value, int))
        if not ok or (hint in (int, float) and isinstance(value, bool)):
            raise CodecError(f'{where}: expected {hint.__name__}, got {value!r}')
        return value
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        allowed = {e.value: e for e in hint}
        if not isinstance(value, str) or value not in allowed:
            raise CodecError(f'{where}: {value!r} is not a {hint.__name__}')
        return allowed[value]
    if typing.get_origin(hint) is dict:
        key_hint, item_hint = typing.get_args(hint)
        if not isinstance(value, dict):
            raise CodecError(f'{where}: expected a map, got {value!r}')
        return {
            _value(f'{where} key', key_hint, k): _value(f'{where}[{k!r}]', item_hint, v)
            for k, v in value.items()
        }
    if dataclasses.is_dataclass(hint):
        if not isinstance(value, dict):
            raise CodecError(f'{where}: expected a {hint.__name__} map, got {value!r}')
        _check_names(hint, value, {})
        return hint(**_fields(hint, value, where))
    raise CodecError(f'{where}: cannot decode a field of type {_type_name(hint)}')


def _fields(cls: type, fields: dict, where: str) -> dict[str, Any]:
    """The non-array fields of ``cls``, each checked against its declared type."""
    hints = _hints(cls)
    return {name: _value(f'{where}.{name}', hints[name], v) for name, v in fields.items()}


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _array_spec(name: str, spec: Any, buffers: Sequence[memoryview]) -> _ArraySpec:
    """One array descriptor ``[dtype, shape, buffer index]``, checked against its buffer.

    Sizes are computed with Python ints, so a declared shape too large for int64 is refused
    rather than wrapped; nothing is allocated here.
    """
    if not (isinstance(spec, list) and len(spec) == 3):
        raise CodecError(f'array {name}: malformed descriptor {spec!r}')
    dtype, shape, index = spec
    if not (isinstance(dtype, str) and dtype in ALLOWED_DTYPES):
        raise CodecError(f'array {name}: dtype {dtype!r} is not allowed')
    if not (isinstance(shape, list) and len(shape) <= MAX_NDIM and all(map(_is_count, shape))):
        raise CodecError(f'array {name}: bad shape {shape!r}')
    if not (_is_count(index) and index < len(buffers)):
        raise CodecError(f'array {name}: buffer {index!r} is missing')
    itemsize = np.dtype(dtype).itemsize
    # numpy refuses a shape whose non-zero dims overflow, even when another dim is zero.
    extent = itemsize
    for dim in shape:
        extent *= max(dim, 1)
        if extent > INT64_MAX:
            raise CodecError(f'array {name}: shape {shape} is too large')
    want = itemsize * _product(shape)
    buf = buffers[index]
    if buf.nbytes != want:
        raise CodecError(f'array {name}: {buf.nbytes} bytes for {dtype} {shape} ({want} bytes)')
    return _ArraySpec(name, dtype, tuple(shape), index, buf)


def _product(dims: list[int]) -> int:
    out = 1
    for dim in dims:
        out *= dim
    return out


def _array_specs(
    cls: type, arrays: dict, buffers: Sequence[memoryview]
) -> dict[str, _ArraySpec | list[_ArraySpec]]:
    """Every array descriptor checked (a tuple field's list of 1 to ``MAX_ARRAYS_PER_FIELD``
    of them), each buffer frame used by exactly one array."""
    hints = _hints(cls)
    described: list[tuple[str, Any]] = []
    for name, spec in arrays.items():
        if hints[name] == ARRAY_TUPLE:
            _check_tuple_len(f'{cls.__name__}.{name}', spec)
            described.extend((f'{name}[{i}]', item) for i, item in enumerate(spec))
        else:
            described.append((name, spec))
    if len(buffers) != len(described):
        raise CodecError(f'{cls.__name__}: {len(buffers)} buffers for {len(described)} arrays')
    checked = [_array_spec(name, spec, buffers) for name, spec in described]
    indices = [spec.index for spec in checked]
    if len(set(indices)) != len(indices):
        raise CodecError(f'{cls.__name__}: arrays share a buffer ({indices})')
    specs: dict[str, _ArraySpec | list[_ArraySpec]] = {}
    items = iter(checked)
    for name in arrays:
        if hints[name] == ARRAY_TUPLE:
            specs[name] = [next(items) for _ in arrays[name]]
        else:
            specs[name] = next(items)
    return specs


def _build_array(spec: _ArraySpec) -> np.ndarray:
    # A copy: the message must not alias a ZMQ buffer that will be reused.
    return np.frombuffer(spec.buffer, dtype=spec.dtype).reshape(spec.shape).copy()


def _build(spec: _ArraySpec | list[_ArraySpec]) -> np.ndarray | tuple[np.ndarray, ...]:
    if isinstance(spec, list):
        return tuple(_build_array(item) for item in spec)
    return _build_array(spec)


def decode(frames: Sequence[bytes | memoryview]) -> Any:
    """The message encoded in ``frames``; raises CodecError on anything malformed.

    Checked in this order: at least one frame, each a contiguous byte buffer; the header is
    msgpack, a map with exactly ``type``, ``v``, ``fields`` and ``arrays``, of version
    ``VERSION``; ``type`` names a message; ``fields`` and ``arrays`` are maps naming only
    fields of that message, every array field in ``arrays`` and every other in ``fields``,
    none required missing; every field value has its declared type (enums and nested stats
    included); a tuple-of-arrays field has a list of 1 to ``MAX_ARRAYS_PER_FIELD``
    descriptors; there is one buffer frame per array, and each array descriptor has an allowed
    dtype, a list shape of at most ``MAX_NDIM`` non-negative ints whose size fits int64, a
    buffer index used by no other array, and a buffer of exactly the declared byte length.

    Nothing whose size the input declares is allocated until every check has passed; then
    each array is a copy of its received buffer. No other exception type escapes.
    """
    if not frames:
        raise CodecError('empty message')
    views = [_frame(f) for f in frames]
    header = _read_header(views[0])
    cls = _message_class(header['type'])
    fields, arrays = header['fields'], header['arrays']
    if not isinstance(fields, dict) or not isinstance(arrays, dict):
        raise CodecError(f'{cls.__name__}: malformed header')
    _check_names(cls, fields, arrays)
    kwargs = _fields(cls, fields, cls.__name__)
    specs = _array_specs(cls, arrays, views[1:])
    kwargs.update((name, _build(spec)) for name, spec in specs.items())
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:  # unreachable after the checks above
        raise CodecError(f'{cls.__name__}: {exc}') from exc
