"""Both channel kinds deliver messages in order; ZMQ lives in a private folder and has limits."""

from __future__ import annotations

import stat
import time

import numpy as np
import pytest

from vla_sched.ipc import messages as m
from vla_sched.ipc.channel import (
    ChannelClosedError,
    ZmqChannel,
    in_process_pair,
    new_endpoints,
    private_runtime_dir,
    remove_runtime_dir,
)
from vla_sched.ipc.heartbeat import HeartbeatTracker


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
    frontend = ZmqChannel(endpoints, bind=True)
    engine = ZmqChannel(endpoints, bind=False)
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
    frontend = ZmqChannel(new_endpoints(runtime_dir, 2), bind=True)
    try:
        with pytest.raises(ChannelClosedError, match='no engine connected'):
            frontend.send(m.CloseSession('a'))
    finally:
        frontend.close()


def test_zmq_peer_sending_an_oversized_message_is_cut_off(runtime_dir):
    endpoints = new_endpoints(runtime_dir, 3)
    frontend = ZmqChannel(endpoints, bind=True, max_message_bytes=1024)
    engine = ZmqChannel(endpoints, bind=False)
    try:
        big = m.StepResult('a', 1, 5, np.zeros((64, 64), np.float32), 0, 0, 0, False, 0)
        engine.send(big)
        assert frontend.recv(timeout_s=0.5) is None
    finally:
        engine.close()
        frontend.close()


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
