"""Messages survive encoding exactly, and malformed frames raise CodecError, never garbage."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest

from vla_sched.ipc import codec
from vla_sched.ipc import messages as m


def _request(**overrides) -> m.StepRequest:
    fields = dict(
        robot_id='arm_1', step_seq=7, stamp_ns=1_000, deadline_ns=2_000, received_ns=1_100,
        image=np.arange(4 * 5 * 3, dtype=np.uint8).reshape(4, 5, 3),
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
    np.testing.assert_array_equal(got.image, sent.image)
    assert got.image.dtype == np.uint8 and got.state.dtype == np.float32
    np.testing.assert_array_equal(got.state, sent.state)


def test_decoded_arrays_do_not_alias_the_received_buffer():
    frames = [bytearray(f) for f in codec.encode(_request())]
    got = codec.decode(frames)
    frames[1][:] = bytes(len(frames[1]))
    assert got.image.max() > 0


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
    with pytest.raises(codec.CodecError, match='array image: 59 bytes'):
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
    with pytest.raises(codec.CodecError, match='0 buffers for 2 arrays'):
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
