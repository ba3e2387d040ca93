"""Both channel kinds deliver messages in order; ZMQ lives in a private folder and has limits,
and only the engine and the node, holding the key of this start, talk on it."""

from __future__ import annotations

import os
import stat
import time

import numpy as np
import pytest
import zmq
from zmq.utils.monitor import recv_monitor_message

from vla_sched.ipc import codec, frame_keys
from vla_sched.ipc import messages as m
from vla_sched.ipc.channel import (
    ChannelClosedError,
    ZmqChannel,
    in_process_pair,
    new_endpoints,
    private_runtime_dir,
    remove_runtime_dir,
)
from vla_sched.ipc.codec import CodecError
from vla_sched.ipc.heartbeat import HeartbeatTracker

KEY = frame_keys.new_key()


# What a connecting socket learns once the bound one has taken or refused it.
SETTLED = (
    zmq.EVENT_HANDSHAKE_SUCCEEDED
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq.EVENT_DISCONNECTED
)


def _connect_settled(sock, endpoint: str) -> None:
    """Connect ``sock`` to ``endpoint`` and wait until its handshake has succeeded or
    failed, so what is sent next is sent with the connection decided."""
    monitor = sock.get_monitor_socket(SETTLED)
    try:
        sock.connect(endpoint)
        assert monitor.poll(10_000), f'no handshake with {endpoint}'
        recv_monitor_message(monitor)
    finally:
        sock.disable_monitor()
        monitor.close(0)


@pytest.fixture
def runtime_dir():
    path = private_runtime_dir()
    yield path
    remove_runtime_dir(path)


def test_in_process_pair_delivers_in_order_both_ways_and_refuses_after_close():
    a, b = in_process_pair()
    a.send(m.CloseSession('x'))
    a.send(m.CloseSession('y'))
    b.send(m.Heartbeat('engine', 1, 0))
    assert [b.recv(), b.recv(), b.recv()] == [m.CloseSession('x'), m.CloseSession('y'), None]
    assert a.recv(0.5) == m.Heartbeat('engine', 1, 0)
    a.close()
    with pytest.raises(ChannelClosedError):
        a.send(m.CloseSession('z'))


def test_runtime_dir_is_private_to_this_user(runtime_dir):
    assert stat.S_IMODE(runtime_dir.stat().st_mode) == 0o700


def test_zmq_channel_carries_arrays_between_bound_and_connected_ends(runtime_dir):
    endpoints = new_endpoints(runtime_dir, 1)
    frontend = ZmqChannel(endpoints, bind=True, key=KEY)
    engine = ZmqChannel(endpoints, bind=False, key=KEY)
    try:
        result = m.StepResult(
            'a', 1, 5, np.arange(14, dtype=np.float32).reshape(2, 7), 1.0, 2.0, 3.0, False, 4
        )
        engine.send(result)
        got = frontend.recv(timeout_s=5.0)
        np.testing.assert_array_equal(got.actions, result.actions)
        # The frontend sends only on live connections, and the engine's inbound connection
        # may come up after its outbound one has delivered: retry until it is up.
        deadline = time.monotonic() + 10.0
        while True:
            try:
                frontend.send(m.CloseSession('a'))
                break
            except ChannelClosedError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.01)
        assert engine.recv(timeout_s=5.0) == m.CloseSession('a')
        assert frontend.recv(timeout_s=0.0) is None
    finally:
        engine.close()
        frontend.close()


def test_zmq_send_without_a_connected_peer_fails_instead_of_queueing(runtime_dir):
    frontend = ZmqChannel(new_endpoints(runtime_dir, 2), bind=True, key=KEY)
    try:
        with pytest.raises(ChannelClosedError, match='no engine connected'):
            frontend.send(m.CloseSession('a'))
    finally:
        frontend.close()


def test_zmq_peer_sending_an_oversized_message_is_cut_off(runtime_dir):
    endpoints = new_endpoints(runtime_dir, 3)
    frontend = ZmqChannel(endpoints, bind=True, key=KEY, max_message_bytes=1024)
    engine = ZmqChannel(endpoints, bind=False, key=KEY)
    try:
        big = m.StepResult('a', 1, 5, np.zeros((64, 64), np.float32), 0, 0, 0, False, 0)
        engine.send(big)
        assert frontend.recv(timeout_s=0.5) is None
    finally:
        engine.close()
        frontend.close()


def _send_when_connected(channel: ZmqChannel, msg) -> None:
    """The frontend sends only on live connections: retry until the engine's is up."""
    deadline = time.monotonic() + 10.0
    while True:
        try:
            channel.send(msg)
            return
        except ChannelClosedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def test_another_process_connecting_to_the_engine_socket_takes_no_message(runtime_dir):
    endpoints = new_endpoints(runtime_dir, 4)
    frontend = ZmqChannel(endpoints, bind=True, key=KEY)
    engine = ZmqChannel(endpoints, bind=False, key=KEY)
    ctx = zmq.Context()
    takers = [ctx.socket(zmq.PULL), ctx.socket(zmq.PAIR)]
    try:
        _send_when_connected(frontend, m.CloseSession('first'))
        assert engine.recv(timeout_s=5.0) == m.CloseSession('first')
        for taker in takers:
            taker.setsockopt(zmq.LINGER, 0)
            _connect_settled(taker, endpoints.to_engine)
        # Once the engine is connected, the socket takes no other peer.
        sent = [m.CloseSession(f'robot_{i}') for i in range(20)]
        for msg in sent:
            frontend.send(msg)
        assert [engine.recv(timeout_s=5.0) for _ in sent] == sent
        assert not any(taker.poll(200) for taker in takers)
    finally:
        for taker in takers:
            taker.close(0)
        ctx.term()
        engine.close()
        frontend.close()


def test_a_message_without_this_starts_key_is_refused_and_the_next_one_arrives(runtime_dir):
    endpoints = new_endpoints(runtime_dir, 5)
    frontend = ZmqChannel(endpoints, bind=True, key=KEY)
    ctx = zmq.Context()
    forger = ctx.socket(zmq.PAIR)  # speaks for the engine without its key
    forger.setsockopt(zmq.LINGER, 0)
    forger.connect(endpoints.from_engine)
    result = m.StepResult('a', 1, 5, np.zeros((2, 7), np.float32), 0.0, 0.0, 0.0, False, 0)
    frames = codec.encode(result)
    try:
        forger.send_multipart(frames)  # no tag
        forger.send_multipart(
            frame_keys.sealed(frame_keys.new_key(), frame_keys.FROM_ENGINE, frames)
        )
        forger.send_multipart(frame_keys.sealed(KEY, frame_keys.TO_ENGINE, frames))  # sent back
        tampered = frame_keys.sealed(KEY, frame_keys.FROM_ENGINE, codec.encode(result))
        tampered[1] = np.ones((2, 7), np.float32).tobytes()
        forger.send_multipart(tampered)
        forger.send_multipart(frame_keys.sealed(KEY, frame_keys.FROM_ENGINE, frames))
        for _ in range(4):
            with pytest.raises(CodecError, match='key tag'):
                frontend.recv(timeout_s=5.0)
        got = frontend.recv(timeout_s=5.0)
        assert isinstance(got, m.StepResult) and got.robot_id == 'a'
    finally:
        forger.close(0)
        ctx.term()
        frontend.close()


def test_the_frame_key_reaches_a_child_through_an_inherited_pipe_once():
    key = frame_keys.new_key()
    fd = frame_keys.key_pipe(key)
    assert frame_keys.read_key(fd) == key
    with pytest.raises(OSError):
        os.fstat(fd)  # read once, then closed
    with pytest.raises(ValueError, match='32 bytes'):
        frame_keys.read_key(_pipe_with(b'short'))


def _pipe_with(data: bytes) -> int:
    read_fd, write_fd = os.pipe()
    os.write(write_fd, data)
    os.close(write_fd)
    return read_fd


def test_heartbeat_tracker_sends_at_its_period_and_ages_the_peer():
    hb = HeartbeatTracker(sender='frontend', period_s=0.2, timeout_s=1.0)
    assert not hb.alive(0.0)
    first = hb.due(0.0)
    assert first == m.Heartbeat('frontend', 1, 0)
    assert hb.due(0.1) is None
    assert hb.due(0.2).seq == 2
    hb.seen(0.3)
    assert hb.alive(1.29) and not hb.alive(1.3)
    assert hb.age_s(0.8) == pytest.approx(0.5)
    hb.reset()
    assert hb.age_s(0.8) == float('inf')
    with pytest.raises(ValueError, match='period'):
        HeartbeatTracker(sender='x', period_s=1.0, timeout_s=1.0)
