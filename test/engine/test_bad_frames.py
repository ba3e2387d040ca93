"""A malformed or unexpected frame is refused, counted and logged; both ends keep serving; a
process without the key of the engine's start can neither take steps nor forge results."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
import threading
import time

import msgpack
import numpy as np
import pytest
import zmq
from zmq.utils.monitor import recv_monitor_message

from vla_sched.engine.bad_frames import BadFrames
from vla_sched.engine.client import EngineClient
from vla_sched.engine.config import EngineConfig, EngineLinkConfig
from vla_sched.engine.core_factory import build_core
from vla_sched.engine.message_server import serve
from vla_sched.ipc import codec, frame_keys
from vla_sched.ipc.channel import (
    in_process_pair,
    new_endpoints,
    private_runtime_dir,
    remove_runtime_dir,
)
from vla_sched.ipc.heartbeat import HeartbeatTracker
from vla_sched.ipc.messages import (
    EngineInfo,
    EngineStats,
    FailureReason,
    Heartbeat,
    StepFailure,
    StepRequest,
    StepResult,
)

pytestmark = pytest.mark.slow  # seconds or more: not in the fast tier

CONFIG = EngineConfig(core='scheduled', stats_period_s=0.1, kv_pool_tokens=2048)


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


def _request(robot_id: str, step_seq: int, **overrides) -> StepRequest:
    now = time.time_ns()
    fields = dict(
        robot_id=robot_id, step_seq=step_seq, stamp_ns=now, deadline_ns=now + 60 * 10**9,
        received_ns=now, images=(np.full((24, 32, 3), 7, np.uint8),),
        state=np.zeros(0, np.float32), instruction='put the cup on the plate',
        instruction_version=1,
    )  # fmt: skip
    fields.update(overrides)
    return StepRequest(**fields)


def _stats() -> EngineStats:
    return EngineStats(1, 0, 0, '', 0, 0, 0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)


def _bit_flipped(msg) -> list[bytes]:
    header, *buffers = codec.encode(msg)
    flipped = bytearray(header)
    flipped[0] ^= 0x80  # the map marker becomes an integer
    return [bytes(flipped), *map(bytes, buffers)]


def _array_sent_as_scalar(msg, name: str) -> list[bytes]:
    """``msg`` encoded with its array field ``name`` as a plain number."""
    header, *buffers = codec.encode(msg)
    data = msgpack.unpackb(header)
    index = data['arrays'].pop(name)[2]
    data['fields'][name] = 7
    rest = [bytes(b) for i, b in enumerate(buffers) if i != index]
    for spec in data['arrays'].values():
        for item in spec if isinstance(spec[0], list) else [spec]:  # a tuple field's list
            item[2] -= item[2] > index
    return [msgpack.packb(data), *rest]


def _until(poll, done, timeout_s: float = 120.0) -> list:
    got: list = []
    end = time.monotonic() + timeout_s
    while not done(got):
        assert time.monotonic() < end, f'gave up waiting; got {got}'
        got += poll()
    return got


def _has(kind: type):
    return lambda got: any(isinstance(m, kind) for m in got)


def _answers(got: list) -> dict:
    return {(m.robot_id, m.step_seq): m for m in got if isinstance(m, StepResult | StepFailure)}


def _bad_frames_said(got: list) -> int:
    stats = [m for m in got if isinstance(m, EngineStats)]
    return stats[-1].num_bad_frames_received if stats else -1


@pytest.mark.slow
def test_in_process_engine_refuses_what_is_not_for_it_and_fails_a_step_it_cannot_take():
    frontend, engine = in_process_pair()
    stop = threading.Event()
    core = build_core(CONFIG)
    beat = HeartbeatTracker(sender='engine', period_s=0.05, timeout_s=60.0)
    kwargs = dict(heartbeat=beat, stats_period_s=CONFIG.stats_period_s, stop=stop)
    thread = threading.Thread(target=serve, args=(engine, core), kwargs=kwargs, daemon=True)
    thread.start()
    try:
        frontend.send(Heartbeat('frontend', 1, 0))
        _until(lambda: [frontend.recv(1.0)], _has(EngineInfo))
        frontend.send(b'\x84garbage')  # not a message at all
        frontend.send(_stats())  # the engine's own message, sent to it
        frontend.send(_request('arm_x', 1, images=7))  # an array field as a scalar
        frontend.send(_request('arm_y', 1))
        got = _until(
            lambda: [frontend.recv(0.05)],
            lambda got: len(_answers(got)) == 2 and _bad_frames_said(got) == 2,
        )
        answers = _answers(got)
        assert isinstance(answers['arm_y', 1], StepResult)
        failure = answers['arm_x', 1]
        assert isinstance(failure, StepFailure)
        assert failure.reason is FailureReason.INTERNAL_ERROR
        assert thread.is_alive()
    finally:
        stop.set()
        thread.join(10)
        core.close()


KEY = frame_keys.new_key()


class KeyedPush:
    """The test's end toward the engine: sends frames tagged with the engine's key, as the
    node does, whatever they hold."""

    def __init__(self, socket) -> None:
        self.socket = socket

    def send_multipart(self, frames: list) -> None:
        self.socket.send_multipart(frame_keys.sealed(KEY, frame_keys.TO_ENGINE, frames))

    def close(self, linger: int) -> None:
        self.socket.close(linger)


@pytest.fixture
def engine_process():
    """A real engine process connected to sockets the test binds itself, so the test can
    send it any frame under the key it handed it: (push, pull, process)."""
    runtime_dir = private_runtime_dir()
    endpoints = new_endpoints(runtime_dir, 1)
    ctx = zmq.Context()
    push, pull = KeyedPush(ctx.socket(zmq.PAIR)), ctx.socket(zmq.PAIR)
    push.socket.bind(endpoints.to_engine)
    pull.bind(endpoints.from_engine)
    key_fd = frame_keys.key_pipe(KEY)
    cmd = [
        sys.executable, '-m', 'vla_sched.engine.main',
        '--to-engine', endpoints.to_engine, '--from-engine', endpoints.from_engine,
        '--key-fd', str(key_fd), '--config', json.dumps(CONFIG.to_mapping()),
        '--heartbeat-period', '0.2', '--heartbeat-timeout', '60',
    ]  # fmt: skip
    process = subprocess.Popen(cmd, start_new_session=True, pass_fds=(key_fd,))
    os.close(key_fd)
    try:
        yield push, pull, process
    finally:
        process.terminate()
        process.wait(30)
        push.close(0)
        pull.close(0)
        ctx.term()
        remove_runtime_dir(runtime_dir)


def _recv(pull, timeout_s: float) -> list:
    if not pull.poll(int(timeout_s * 1000)):
        return []
    frames = pull.recv_multipart()
    return [codec.decode(frame_keys.open_frames(KEY, frame_keys.FROM_ENGINE, frames))]


@pytest.mark.slow
def test_engine_process_refuses_bad_frames_counts_them_and_answers_the_good_step(engine_process):
    push, pull, process = engine_process
    push.send_multipart(codec.encode(Heartbeat('frontend', 1, 0)))
    _until(lambda: _recv(pull, 1.0), _has(EngineInfo))
    push.send_multipart(_bit_flipped(_request('arm_a', 1)))
    push.send_multipart(_array_sent_as_scalar(_request('arm_b', 1), 'state'))
    push.send_multipart(codec.encode(_stats()))
    push.socket.send_multipart(codec.encode(_request('arm_f', 1)))  # without the key's tag
    push.send_multipart(codec.encode(_request('arm_c', 1)))
    got = _until(
        lambda: _recv(pull, 0.05),
        lambda got: ('arm_c', 1) in _answers(got) and _bad_frames_said(got) == 4,
    )
    assert isinstance(_answers(got)['arm_c', 1], StepResult)
    assert ('arm_f', 1) not in _answers(got)
    assert process.poll() is None


@pytest.mark.slow
def test_a_foreign_process_can_neither_take_the_engines_steps_nor_forge_its_results():
    client = EngineClient(CONFIG, EngineLinkConfig(mode='process'))
    client.start()
    ctx = zmq.Context()
    sockets = []
    try:
        _until(lambda: client.poll(0.05), lambda got: client.alive)
        # Processes of the same user on the client's sockets: receivers on its outbound one,
        # senders of a well-formed result on its inbound one.
        for kind, endpoint in (
            (zmq.PULL, client.endpoints.to_engine),
            (zmq.PAIR, client.endpoints.to_engine),
            (zmq.PUSH, client.endpoints.from_engine),
            (zmq.PAIR, client.endpoints.from_engine),
        ):
            sock = ctx.socket(kind)
            sock.setsockopt(zmq.LINGER, 0)
            _connect_settled(sock, endpoint)
            sockets.append(sock)
        forged = StepResult('arm_r', 9, 1, np.ones((2, 7), np.float32), 0, 0, 0, False, 0)
        for sock in sockets[2:]:
            with contextlib.suppress(zmq.Again):  # a socket with no way out drops it at once
                sock.send_multipart(codec.encode(forged), flags=zmq.NOBLOCK)
        steps = [(f'arm_{i}', 1) for i in range(8)]
        for robot_id, step_seq in steps:
            client.send(_request(robot_id, step_seq))
        got = _until(lambda: client.poll(0.05), lambda got: set(steps) <= set(_answers(got)))
        assert all(isinstance(_answers(got)[step], StepResult) for step in steps)
        assert ('arm_r', 9) not in _answers(got)
        assert not any(sock.poll(100) for sock in sockets[:2])
        assert client.alive
    finally:
        for sock in sockets:
            sock.close(0)
        client.close()
        ctx.term()


def test_refusals_are_all_counted_but_logged_at_most_once_per_period(caplog):
    now = [0.0]
    bad = BadFrames('the node', logger=logging.getLogger('bad'), log_period_s=10.0,
                    clock=lambda: now[0])  # fmt: skip
    with caplog.at_level(logging.WARNING, logger='bad'):
        for _ in range(50):
            bad.refuse('x' * 1000)
        now[0] = 10.0
        bad.refuse('late')
    assert bad.num_refused == 51
    assert len(caplog.records) == 2
    assert '49 more since the last line' in caplog.records[1].getMessage()
    assert len(caplog.records[0].getMessage()) < 300
