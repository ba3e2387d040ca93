"""Messages survive encoding exactly, and malformed frames raise CodecError, never garbage."""

from __future__ import annotations

import math

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vla_sched.ipc import codec
from vla_sched.ipc import messages as m


def _request(**overrides) -> m.StepRequest:
    fields = dict(
        robot_id='arm_1', step_seq=7, stamp_ns=1_000, deadline_ns=2_000, received_ns=1_100,
        images=(np.arange(4 * 5 * 3, dtype=np.uint8).reshape(4, 5, 3),),
        state=np.array([0.5, -1.25, 3.0], dtype=np.float32),
        instruction='pick up the red block', instruction_version=2, priority=1,
    )  # fmt: skip
    fields.update(overrides)
    return m.StepRequest(**fields)


def _roundtrip(msg):
    return codec.decode([bytes(f) for f in codec.encode(msg)])


def test_step_request_round_trips_with_arrays_bit_exact():
    sent = _request()
    got = _roundtrip(sent)
    assert (got.robot_id, got.step_seq, got.instruction, got.priority) == (
        'arm_1',
        7,
        'pick up the red block',
        1,
    )
    (image,) = got.images
    np.testing.assert_array_equal(image, sent.images[0])
    assert image.dtype == np.uint8 and got.state.dtype == np.float32
    np.testing.assert_array_equal(got.state, sent.state)


def _cameras(num: int) -> tuple[np.ndarray, ...]:
    """``num`` images of different sizes, image i filled with i + 1."""
    return tuple(np.full((4 + i, 5, 3), i + 1, np.uint8) for i in range(num))


def test_a_step_with_three_images_round_trips_them_in_order():
    sent = _request(images=_cameras(3))
    frames = codec.encode(sent)
    assert len(frames) == 1 + 3 + 1 + 1  # header, three images, state, previous actions
    got = codec.decode([bytes(f) for f in frames])
    assert isinstance(got.images, tuple) and len(got.images) == 3
    for got_image, sent_image in zip(got.images, sent.images, strict=True):
        np.testing.assert_array_equal(got_image, sent_image)
        assert got_image.dtype == np.uint8


@pytest.mark.parametrize(
    ('images', 'match'),
    [
        ((), r'StepRequest\.images: 0 arrays, expected 1 to 8'),
        (_cameras(codec.MAX_ARRAYS_PER_FIELD + 1), r'9 arrays, expected 1 to 8'),
        ((np.zeros((2, 2, 3), np.uint8), 'pixels'), 'expected a tuple of numpy arrays'),
        (np.zeros((2, 2, 3), np.uint8), 'expected a tuple of arrays, got ndarray'),
    ],
)
def test_encoding_refuses_images_that_are_not_one_to_eight_arrays(images, match):
    with pytest.raises(codec.CodecError, match=match):
        codec.encode(_request(images=images))


def _two_camera_frames() -> list:
    return codec.encode(_request(images=_cameras(2)))


@pytest.mark.parametrize(
    ('images', 'match'),
    [
        ([], r'StepRequest\.images: 0 arrays, expected 1 to 8'),
        ([['uint8', [4, 5, 3], 0]] * 9, r'StepRequest\.images: 9 arrays, expected 1 to 8'),
        ([['uint8', [4, 5, 3], 0], 'uint8'], r'array images\[1\]: malformed descriptor'),
        ({'0': ['uint8', [4, 5, 3], 0]}, 'expected a tuple of arrays, got dict'),
        ([['uint8', [4, 5, 3], 0], ['uint8', [4, 5, 3], 0]], 'arrays share a buffer'),
        ([['uint8', [4, 5, 3], 0], ['uint8', [4, 5, 3], 1]], r'array images\[1\]: 75 bytes'),
    ],
)
def test_malformed_image_lists_are_refused_before_any_array_is_built(images, match, monkeypatch):
    monkeypatch.setattr(codec, '_build_array', _no_allocation)
    frames = _two_camera_frames()
    header = _header(frames)
    header['arrays']['images'] = images
    _refused(_with_header(frames, header), match)


def test_a_missing_or_extra_image_buffer_is_refused():
    frames = _two_camera_frames()  # header, image 0, image 1, state, previous actions
    _refused([frames[0], frames[1], frames[3], frames[4]], '3 buffers for 4 arrays')
    _refused([*frames, b''], '5 buffers for 4 arrays')


def test_a_short_second_image_builds_no_array(monkeypatch):
    monkeypatch.setattr(codec, '_build_array', _no_allocation)
    frames = _two_camera_frames()
    short = [frames[0], frames[1], bytes(frames[2])[:-1], frames[3], frames[4]]
    _refused(short, r'images\[1\]: 74 bytes')


def test_decoded_arrays_do_not_alias_the_received_buffer():
    frames = [bytearray(f) for f in codec.encode(_request())]
    got = codec.decode(frames)
    frames[1][:] = bytes(len(frames[1]))
    assert got.images[0].max() > 0


def test_every_message_type_round_trips():
    msgs = [
        m.StepResult('a', 3, 10, np.ones((2, 7), np.float32), 1.0, 2.0, 3.0, True, 12),
        m.StepFailure('a', 3, 10, m.FailureReason.KV_POOL_FULL, 'pool of 64 tokens'),
        m.CloseSession('a'),
        m.Heartbeat('engine', 4, 99),
        m.EngineInfo('tiny', 7, 2, 7, 32, 64, True),
        m.EngineStats(
            sent_ns=5,
            num_waiting=1,
            num_running=2,
            chunked_rid='r1',
            num_retracts_total=3,
            num_retracts_window=1,
            num_delayed_prefills=4,
            kv_use_percent=12.5,
            cache_hit_rate=0.75,
            arrival_to_finish_ms_p50=10.0,
            arrival_to_finish_ms_p99=20.0,
            itl_ms_p50=1.0,
            itl_ms_p99=2.0,
            num_deadline_waits=2,
            prefill_us_per_token=35.5,
            decode_step_ms=4.25,
            aborts_by_reason={'kv_pool_full': 1},
            robots={
                'a': m.RobotStats(
                    num_retracts=1,
                    num_cached_session_prefix_tokens=32,
                    ttft_ms_p50=4.5,
                    itl_ms_p50=1.5,
                    itl_ms_p99=3.0,
                )
            },
        ),
    ]
    for msg in msgs:
        got = _roundtrip(msg)
        assert type(got) is type(msg)
        if isinstance(msg, m.StepResult):
            np.testing.assert_array_equal(got.actions, msg.actions)
            assert got.late is True and got.num_cached_prefix_tokens == 12
        else:
            assert got == msg


def _header(frames) -> dict:
    return msgpack.unpackb(bytes(frames[0]))


def _with_header(frames, header) -> list:
    return [msgpack.packb(header), *frames[1:]]


def test_buffer_shorter_than_its_shape_is_refused():
    frames = codec.encode(_request())
    frames[1] = bytes(frames[1])[:-1]
    with pytest.raises(codec.CodecError, match=r'array images\[0\]: 59 bytes'):
        codec.decode(frames)


def test_dtype_outside_the_allow_list_is_refused():
    frames = codec.encode(_request())
    header = _header(frames)
    header['arrays']['state'][0] = 'object'
    with pytest.raises(codec.CodecError, match="dtype 'object' is not allowed"):
        codec.decode(_with_header(frames, header))


def test_unknown_type_unknown_field_and_wrong_scalar_type_are_refused():
    frames = codec.encode(_request())
    header = _header(frames)
    with pytest.raises(codec.CodecError, match='unknown message type'):
        codec.decode(_with_header(frames, {**header, 'type': 'os.system'}))
    bad = {**header, 'fields': {**header['fields'], 'evil': 1}}
    with pytest.raises(codec.CodecError, match=r"unknown fields \['evil'\]"):
        codec.decode(_with_header(frames, bad))
    bad = {**header, 'fields': {**header['fields'], 'step_seq': 'seven'}}
    with pytest.raises(codec.CodecError, match=r'StepRequest\.step_seq: expected int'):
        codec.decode(_with_header(frames, bad))


def test_garbage_header_missing_buffer_and_empty_message_are_refused():
    frames = codec.encode(_request())
    with pytest.raises(codec.CodecError, match='unreadable header'):
        codec.decode([b'\xc1\xff', *frames[1:]])
    with pytest.raises(codec.CodecError, match='0 buffers for 3 arrays'):
        codec.decode(frames[:1])
    with pytest.raises(codec.CodecError, match='empty message'):
        codec.decode([])


def test_unknown_failure_reason_is_refused():
    frames = codec.encode(m.StepFailure('a', 1, 2, m.FailureReason.SUPERSEDED, ''))
    header = _header(frames)
    header['fields']['reason'] = 'rm -rf'
    with pytest.raises(codec.CodecError, match='StepFailure'):
        codec.decode(_with_header(frames, header))


def test_encoding_refuses_foreign_objects_and_disallowed_dtypes():
    with pytest.raises(codec.CodecError, match=r'not a vla_sched\.ipc message'):
        codec.encode({'robot_id': 'a'})
    with pytest.raises(codec.CodecError, match='dtype complex64'):
        codec.encode(_request(state=np.zeros(2, np.complex64)))


def _stats(**overrides) -> m.EngineStats:
    fields = dict(
        sent_ns=5, num_waiting=1, num_running=2, chunked_rid='', num_retracts_total=0,
        num_retracts_window=0, num_delayed_prefills=0, kv_use_percent=1.0, cache_hit_rate=0.5,
        arrival_to_finish_ms_p50=1.0, arrival_to_finish_ms_p99=2.0, itl_ms_p50=1.0,
        itl_ms_p99=2.0, aborts_by_reason={'queue_full': 2}, robots={'a': m.RobotStats()},
        num_deadline_waits=0, prefill_us_per_token=20.0, decode_step_ms=3.0,
    )  # fmt: skip
    fields.update(overrides)
    return m.EngineStats(**fields)


def _refused(frames, match: str) -> None:
    with pytest.raises(codec.CodecError, match=match):
        codec.decode(frames)


def _refused_header(header, match: str, frames=None) -> None:
    frames = codec.encode(_request()) if frames is None else frames
    _refused(_with_header(frames, header), match)


def _request_header() -> dict:
    return _header(codec.encode(_request()))


def _with_array(name: str, spec: list, frames=None) -> tuple[dict, list]:
    frames = codec.encode(_request()) if frames is None else frames
    header = _header(frames)
    header['arrays'][name] = spec
    return header, frames


@pytest.mark.parametrize('header', [[1, 2], 7, 'StepRequest', None, b'raw'])
def test_header_that_is_not_a_map_is_refused(header):
    frames = codec.encode(_request())
    _refused([msgpack.packb(header), *frames[1:]], 'not a map')


def test_truncated_header_and_trailing_bytes_are_unreadable():
    frames = codec.encode(_request())
    _refused([bytes(frames[0])[:-3], *frames[1:]], 'unreadable header')
    _refused([bytes(frames[0]) + b'\x00', *frames[1:]], 'unreadable header')


def test_header_with_a_missing_or_extra_key_is_refused():
    header = _request_header()
    _refused_header({k: v for k, v in header.items() if k != 'fields'}, 'header keys')
    _refused_header({**header, 'extra': 1}, 'header keys')


@pytest.mark.parametrize(
    'version',
    [codec.VERSION + 1, codec.VERSION - 1, True, float(codec.VERSION), str(codec.VERSION), None],
)
def test_header_of_another_version_is_refused(version):
    _refused_header({**_request_header(), 'v': version}, 'unsupported header')


@pytest.mark.parametrize('name', [None, 7, ['StepRequest'], {'a': 1}, 'RobotStats'])
def test_message_type_that_is_not_a_message_name_is_refused(name):
    _refused_header({**_request_header(), 'type': name}, 'unknown message type')


@pytest.mark.parametrize('key', ['fields', 'arrays'])
def test_fields_or_arrays_that_are_not_maps_are_refused(key):
    _refused_header({**_request_header(), key: [1]}, 'malformed header')


def test_missing_scalar_field_is_refused_and_a_defaulted_one_may_be_omitted():
    header = _request_header()
    del header['fields']['robot_id']
    _refused_header(header, r"missing fields \['robot_id'\]")
    header = _request_header()
    del header['fields']['priority']
    assert codec.decode(_with_header(codec.encode(_request()), header)).priority == 0


def test_missing_array_field_is_refused():
    frames = codec.encode(_request())
    header = _header(frames)
    del header['arrays']['state']
    _refused([msgpack.packb(header), frames[1]], r"missing fields \['state'\]")


def test_unknown_array_and_non_string_field_name_are_refused():
    header, frames = _with_array('evil', ['uint8', [0], 2])
    _refused_header(header, r"unknown fields \['evil'\]", [*frames, b''])
    header = _request_header()
    header['fields'][b'robot_id'] = 'x'
    _refused_header(header, 'unknown fields')


def test_scalar_where_an_array_is_declared_is_refused():
    frames = codec.encode(_request())
    header = _header(frames)
    del header['arrays']['state']
    header['fields']['state'] = 5
    _refused([msgpack.packb(header), frames[1]], r'StepRequest\.state: an array field sent as')


def test_array_where_a_scalar_is_declared_is_refused():
    header, frames = _with_array('robot_id', ['uint8', [3], 2])
    del header['fields']['robot_id']
    _refused_header(header, r'StepRequest\.robot_id: a scalar field sent as', [*frames, b'arm'])


def test_field_sent_both_as_scalar_and_as_array_is_refused():
    header = _request_header()
    header['fields']['images'] = 0
    _refused_header(header, r'StepRequest\.images: an array field sent as a scalar')


@pytest.mark.parametrize(
    ('field', 'value'),
    [('step_seq', True), ('step_seq', 1.5), ('robot_id', 3), ('instruction', None)],
)
def test_scalar_of_the_wrong_type_is_refused(field, value):
    header = _request_header()
    header['fields'][field] = value
    _refused_header(header, rf'StepRequest\.{field}: expected')


@pytest.mark.parametrize(
    ('field', 'value', 'match'),
    [
        ('kv_use_percent', True, r'kv_use_percent: expected float'),
        ('aborts_by_reason', [1], r'aborts_by_reason: expected a map'),
        ('aborts_by_reason', {'x': 'one'}, r"aborts_by_reason\['x'\]: expected int"),
        ('robots', {'a': 3}, r"robots\['a'\]: expected a RobotStats map"),
        ('robots', {'a': {'evil': 1}}, r"RobotStats: unknown fields \['evil'\]"),
        ('robots', {'a': {'itl_ms_p99': 'slow'}}, r'itl_ms_p99: expected float'),
        ('robots', {b'a': {}}, r'robots key: expected str'),
    ],
)
def test_engine_stats_with_malformed_nested_fields_is_refused(field, value, match):
    frames = codec.encode(_stats())
    header = _header(frames)
    header['fields'][field] = value
    _refused(_with_header(frames, header), match)


@pytest.mark.parametrize('reason', [['superseded'], 3, None, 'SUPERSEDED'])
def test_failure_reason_that_is_not_a_reason_value_is_refused(reason):
    frames = codec.encode(m.StepFailure('a', 1, 2, m.FailureReason.SUPERSEDED, ''))
    header = _header(frames)
    header['fields']['reason'] = reason
    _refused(_with_header(frames, header), r'StepFailure\.reason: .* is not a FailureReason')


@pytest.mark.parametrize('spec', [None, 'uint8', ['uint8', [3]], ['uint8', [3], 1, 0], {}])
def test_malformed_array_descriptor_is_refused(spec):
    _refused_header(_with_array('state', spec)[0], 'array state: malformed descriptor')


@pytest.mark.parametrize('dtype', ['object', 'float16', 'complex64', '<f4', ['float32'], 4])
def test_array_dtype_outside_the_allow_list_or_not_a_name_is_refused(dtype):
    _refused_header(_with_array('state', [dtype, [3], 1])[0], 'array state: dtype')


@pytest.mark.parametrize(
    'shape', [3, '3', {'a': 3}, None, [-1], [1.0, 3], [True, 3], [None], [1] * 33]
)
def test_array_shape_that_is_not_a_list_of_counts_is_refused(shape):
    _refused_header(_with_array('state', ['float32', shape, 1])[0], 'array state: bad shape')


@pytest.mark.parametrize(
    'shape',
    [
        [2**32, 2**32],  # 2**64 elements: wraps to 0 in int64 arithmetic
        [2**64 - 1],  # the largest msgpack integer
        [2**61],  # 2**61 elements fit int64, their 2**63 bytes do not
        [0, 2**62],  # no elements, yet numpy cannot describe it
    ],
)
def test_array_shape_whose_size_overflows_int64_is_refused(shape, monkeypatch):
    monkeypatch.setattr(codec, '_build_array', _no_allocation)
    frames = codec.encode(_request())
    header, frames = _with_array(
        'state', ['float32', shape, 1], [frames[0], frames[1], b'', frames[3]]
    )
    _refused_header(header, r'array state: shape .* is too large', frames)


def _no_allocation(spec):
    raise AssertionError(f'array {spec.name} built before every check passed')


def test_buffer_longer_than_its_shape_is_refused():
    frames = codec.encode(_request())
    longer = [*frames[:2], bytes(frames[2]) + b'\x00', frames[3]]
    _refused(longer, r'array state: 13 bytes .*\(12 bytes\)')


def test_engine_stats_not_measured_yet_round_trip_as_nan():
    got = _roundtrip(_stats(prefill_us_per_token=math.nan, decode_step_ms=math.nan))
    assert math.isnan(got.prefill_us_per_token) and math.isnan(got.decode_step_ms)


def test_zero_size_array_round_trips():
    got = _roundtrip(_request(state=np.zeros((0,), np.float32)))
    assert got.state.shape == (0,) and got.state.dtype == np.float32
    assert got.previous_actions.shape == (0, 0) and got.inference_delay == 0


def test_previous_actions_and_the_inference_delay_round_trip():
    previous = np.arange(12, dtype=np.float32).reshape(3, 4)
    got = _roundtrip(_request(previous_actions=previous, inference_delay=2))
    np.testing.assert_array_equal(got.previous_actions, previous)
    assert got.inference_delay == 2


def test_extra_buffer_frame_is_refused():
    _refused([*codec.encode(_request()), b''], '4 buffers for 3 arrays')


@pytest.mark.parametrize('index', [3, -1, True, 1.0, None])
def test_buffer_index_that_names_no_frame_is_refused(index):
    _refused_header(_with_array('state', ['float32', [3], index])[0], 'array state: buffer')


def test_two_arrays_sharing_one_buffer_are_refused():
    frames = codec.encode(_request(state=np.zeros(15, np.float32)))
    header = _header(frames)
    header['arrays']['state'] = ['uint8', [60], 0]
    _refused(_with_header(frames, header), 'arrays share a buffer')


def test_frame_that_is_not_a_contiguous_byte_buffer_is_refused():
    frames = codec.encode(_request())
    _refused(['a str header', *frames[1:]], 'not a contiguous byte buffer')
    _refused([frames[0], 60, frames[2], frames[3]], 'not a contiguous byte buffer')
    strided = memoryview(np.zeros(120, np.uint8))[::2]
    _refused([frames[0], strided, frames[2], frames[3]], 'not a contiguous byte buffer')


def test_no_array_is_built_when_a_later_array_is_malformed(monkeypatch):
    monkeypatch.setattr(codec, '_build_array', _no_allocation)
    frames = codec.encode(_request())
    _refused([*frames[:2], bytes(frames[2])[:-1], frames[3]], 'array state: 11 bytes')


def _decodes_or_refuses(frames) -> None:
    try:
        got = codec.decode(frames)
    except codec.CodecError:
        return
    assert type(got) in codec.MESSAGE_TYPES.values()


_FRAMES = [bytes(f) for f in codec.encode(_request())]


@settings(max_examples=300, deadline=None, database=None)
@given(data=st.data())
def test_random_byte_mutations_either_decode_or_raise_codec_error(data):
    frames = list(_FRAMES)
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(frames) - 1))
        frame = bytearray(frames[i])
        action = data.draw(st.sampled_from(['flip', 'cut', 'grow']))
        if action == 'flip' and frame:
            frame[data.draw(st.integers(0, len(frame) - 1))] = data.draw(st.integers(0, 255))
        elif action == 'cut':
            del frame[data.draw(st.integers(0, len(frame))) :]
        else:
            frame += data.draw(st.binary(max_size=8))
        frames[i] = bytes(frame)
    _decodes_or_refuses(frames)


_MSGPACK_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=8)
    | st.binary(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None, database=None)
@given(
    section=st.sampled_from(['fields', 'arrays']),
    name=st.sampled_from(['robot_id', 'step_seq', 'images', 'state', 'priority', 'evil']),
    value=_MSGPACK_VALUES,
)
def test_random_header_values_either_decode_or_raise_codec_error(section, name, value):
    header = msgpack.unpackb(_FRAMES[0])
    header[section][name] = value
    _decodes_or_refuses([msgpack.packb(header), *_FRAMES[1:]])
