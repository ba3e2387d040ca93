"""The engine runs in-process or as a process, answers steps, dies visibly and restarts cleanly;
its messages (and its death) wake the caller, who need not poll."""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest

from vla_sched.engine.client import EngineClient, EngineUnavailable
from vla_sched.engine.config import EngineConfig, EngineLinkConfig
from vla_sched.ipc.messages import (
    EngineInfo,
    EngineStats,
    FailureReason,
    StepFailure,
    StepRequest,
    StepResult,
)

pytestmark = pytest.mark.slow
CORE = {'core': 'scheduled', 'stats_period_s': 0.2, 'kv_pool_tokens': 2048}
WAIT_S = 60.0  # only a hang reaches this


def _request(robot_id: str, step_seq: int, **overrides) -> StepRequest:
    now = time.time_ns()
    fields = dict(
        robot_id=robot_id, step_seq=step_seq, stamp_ns=now, deadline_ns=now + 60 * 10**9,
        received_ns=now, images=(np.full((24, 32, 3), step_seq, np.uint8),),
        state=np.zeros(0, np.float32), instruction='put the cup on the plate',
        instruction_version=1,
    )  # fmt: skip
    fields.update(overrides)
    return StepRequest(**fields)


def _wait_ready(client: EngineClient, timeout_s: float = 120.0) -> None:
    end = time.monotonic() + timeout_s
    while not client.alive:
        assert time.monotonic() < end, 'engine did not become ready'
        assert not client.failure, client.failure
        client.poll(0.05)


def _collect(client: EngineClient, want: int, timeout_s: float = 60.0) -> list:
    """Step results and failures until ``want`` of them arrived."""
    out: list = []
    end = time.monotonic() + timeout_s
    while len(out) < want and time.monotonic() < end:
        out += [m for m in client.poll(0.05) if isinstance(m, StepResult | StepFailure)]
    return out


@pytest.fixture(
    scope='module',
    params=[('inprocess', 'scheduled'), ('process', 'scheduled'), ('inprocess', 'sequential')],
    ids=lambda p: '-'.join(p),
)
def client(request):
    mode, core = request.param
    c = EngineClient(EngineConfig(**{**CORE, 'core': core}), EngineLinkConfig(mode=mode))
    c.start()
    _wait_ready(c)
    yield c
    c.close()


def test_engine_reports_what_the_checkpoint_expects(client):
    assert isinstance(client.info, EngineInfo)
    assert client.info.random_weights
    assert (client.info.action_horizon, client.info.action_dim) == (2, 7)
    assert (client.pid is None) == (client.link.mode == 'inprocess')


def test_a_step_comes_back_as_an_action_chunk_for_its_robot_and_stamp(client):
    sent = _request('arm_a', 1)
    client.send(sent)
    (result,) = _collect(client, 1)
    assert isinstance(result, StepResult)
    assert (result.robot_id, result.step_seq, result.stamp_ns) == ('arm_a', 1, sent.stamp_ns)
    assert result.actions.shape == (2, 7) and result.actions.dtype == np.float32
    assert np.isfinite(result.actions).all()
    assert result.prefill_ms > 0 and result.decode_ms > 0 and not result.late


def test_a_malformed_step_is_refused_and_the_next_robot_is_still_served(client):
    client.send(_request('arm_b', 1, state=np.array([np.nan], np.float32)))
    client.send(_request('arm_c', 1))
    got = {m.robot_id: m for m in _collect(client, 2)}
    assert isinstance(got['arm_b'], StepFailure)
    assert got['arm_b'].reason is FailureReason.INVALID_STATE
    assert isinstance(got['arm_c'], StepResult)


def test_a_result_wakes_the_caller_who_then_takes_it_without_waiting(client):
    woken = threading.Event()
    client.on_arrival = woken.set
    try:
        client.send(_request('arm_w', 1))
        got: list = []
        while not got:
            assert woken.wait(WAIT_S), 'no wake-up'
            woken.clear()
            got = [m for m in client.poll(0.0) if isinstance(m, StepResult)]
    finally:
        client.on_arrival = lambda: None
    assert [(m.robot_id, m.step_seq) for m in got] == [('arm_w', 1)]


def _threads(name: str) -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name == name}


def test_restarts_leave_one_receiving_thread_and_closing_leaves_none():
    names = ('vla_sched-engine-inbox', 'vla_sched-engine')
    others = {name: _threads(name) for name in names}  # other clients' (a fixture's)
    client = EngineClient(EngineConfig(**CORE), EngineLinkConfig(mode='inprocess'))
    client.start()
    try:
        for _ in range(3):
            client.restart()
        _wait_ready(client)
        assert [len(_threads(name) - others[name]) for name in names] == [1, 1]
    finally:
        client.close()
    assert [_threads(name) - others[name] for name in names] == [set(), set()]


def test_stats_arrive_at_the_configured_period(client):
    end = time.monotonic() + 10
    stats = []
    while len(stats) < 2 and time.monotonic() < end:
        stats += [m for m in client.poll(0.05) if isinstance(m, EngineStats)]
    assert len(stats) == 2
    assert stats[1].sent_ns > stats[0].sent_ns


def test_killed_engine_process_is_noticed_and_a_restart_serves_again():
    client = EngineClient(
        EngineConfig(**CORE),
        EngineLinkConfig(mode='process', heartbeat_period_s=0.1, heartbeat_timeout_s=0.5),
    )
    client.start()
    try:
        _wait_ready(client)
        client.send(_request('arm_k', 1))
        woken = threading.Event()
        client.on_arrival = woken.set
        os.kill(client.pid, signal.SIGKILL)
        killed_at = time.monotonic()
        while not client.failure:  # the death itself wakes the caller
            assert woken.wait(WAIT_S), 'the death woke nobody'
            woken.clear()
        while client.alive:
            client.poll(0.05)
        assert time.monotonic() - killed_at < 2.0
        assert 'exited' in client.failure
        with pytest.raises(EngineUnavailable):
            client.send(_request('arm_k', 2))
        client.restart()
        _wait_ready(client)
        client.send(_request('arm_k', 3))
        got = _collect(client, 1)
        # The step in flight when the engine died never comes back, from either engine.
        assert [(m.robot_id, m.step_seq) for m in got] == [('arm_k', 3)]
    finally:
        client.close()
