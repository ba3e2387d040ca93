"""The scheduled core batches robots, reuses session prefixes and reports every outcome."""

from __future__ import annotations

import time

import numpy as np
import pytest

from vla_sched.ipc.messages import FailureReason, StepFailure, StepRequest, StepResult
from vla_sched.serving.engine_config import EngineConfig
from vla_sched.serving.scheduled_core import ScheduledCore

pytestmark = pytest.mark.slow


def _request(robot_id, step_seq, *, instruction='pick up the cup', version=1, **kw):
    now = time.time_ns()
    fields = dict(
        robot_id=robot_id, step_seq=step_seq, stamp_ns=now, deadline_ns=now + 120 * 10**9,
        received_ns=now, image=np.full((20, 30, 3), (7 * step_seq + len(robot_id)) % 256,
                                       np.uint8),
        state=np.zeros(0, np.float32), instruction=instruction, instruction_version=version,
    )  # fmt: skip
    fields.update(kw)
    return StepRequest(**fields)


def _drain(core: ScheduledCore, max_iterations: int = 400) -> list:
    """Run the scheduler until idle, checking its invariants after every iteration."""
    out: list = []
    for _ in range(max_iterations):
        if not core.has_work():
            return out
        out += core.step(time.time_ns())
        core.check_integrity()
    raise AssertionError('the scheduler did not go idle')


def _core(**overrides) -> ScheduledCore:
    settings = dict(kv_pool_tokens=1024, page_size=16, chunked_prefill_size=64,
                    enable_overlap=True)  # fmt: skip
    settings.update(overrides)
    return ScheduledCore.from_config(EngineConfig(**settings))


@pytest.fixture(scope='module')
def core():
    c = _core()
    yield c
    c.close()


def test_three_robots_get_chunks_and_their_second_steps_reuse_the_session_prefix(core):
    for robot in ('r1', 'r2', 'r3'):
        assert core.submit(_request(robot, 1), time.time_ns()) == []
    first = {m.robot_id: m for m in _drain(core)}
    for robot in ('r1', 'r2', 'r3'):
        assert core.submit(_request(robot, 2), time.time_ns()) == []
    second = {m.robot_id: m for m in _drain(core)}
    for out in (*first.values(), *second.values()):
        assert isinstance(out, StepResult)
        assert out.actions.shape == (core.info.action_horizon, core.info.action_dim)
        assert np.isfinite(out.actions).all()
    # Same system prompt and instruction: every second step hits the cached prefix.
    assert all(m.num_cached_prefix_tokens >= 16 for m in second.values())
    stats = core.stats(time.time_ns())
    assert stats.cache_hit_rate > 0
    assert core.scheduler.metrics.robot('r1').num_steps_done == 2
    assert stats.robots['r1'].num_cached_session_prefix_tokens >= 16
    assert stats.robots['r1'].itl_ms_p50 > 0 and stats.robots['r1'].ttft_ms_p50 > 0


def test_malformed_step_fails_at_once_and_the_engine_keeps_serving(core):
    bad = core.submit(_request('r4', 1, image=np.zeros((4, 4), np.uint8)), time.time_ns())
    assert [f.reason for f in bad] == [FailureReason.MALFORMED_IMAGE]
    assert core.submit(_request('r5', 1), time.time_ns()) == []
    (out,) = _drain(core)
    assert isinstance(out, StepResult) and out.robot_id == 'r5'


def test_a_newer_step_supersedes_the_waiting_one(core):
    assert core.submit(_request('r6', 1), time.time_ns()) == []
    assert core.submit(_request('r6', 2), time.time_ns()) == []
    outs = {m.step_seq: m for m in _drain(core)}
    assert isinstance(outs[1], StepFailure) and outs[1].reason is FailureReason.SUPERSEDED
    assert isinstance(outs[2], StepResult)
    assert core.scheduler.metrics.robot('r6').num_superseded == 1


def test_a_new_instruction_swaps_the_session_prefix(core):
    assert core.submit(_request('r7', 1), time.time_ns()) == []
    _drain(core)
    request = _request('r7', 2, instruction='open the drawer', version=2)
    assert core.submit(request, time.time_ns()) == []
    (out,) = _drain(core)
    assert isinstance(out, StepResult)
    session = core.memory.sessions.get('r7')
    prefix = core.prompts.build('open the drawer').token_ids
    assert session.prefix.token_ids.tolist() == list(prefix[: len(session.prefix.token_ids)])
    assert session.instruction_version == 2
    core.close_session('r7')
    assert 'r7' not in core.memory.sessions


def test_queue_time_starts_when_the_frontend_received_the_observation(core):
    now = time.time_ns()
    request = _request('r9', 1, received_ns=now - 50 * 10**6)
    assert core.submit(request, now) == []
    (out,) = _drain(core)
    assert isinstance(out, StepResult) and out.queue_ms >= 50.0


def test_a_step_past_its_deadline_is_dropped_and_counted(core):
    now = time.time_ns()
    late = _request('r8', 1, stamp_ns=now - 10**9, received_ns=now - 10**9, deadline_ns=now - 1)
    outs = core.submit(late, now) + _drain(core)
    assert [(m.step_seq, m.reason) for m in outs] == [(1, FailureReason.DEADLINE_MISSED)]


def test_a_tiny_kv_pool_refuses_a_step_as_kv_pool_full_and_names_the_pool():
    small = _core(kv_pool_tokens=64, chunked_prefill_size=32)
    try:
        outs = small.submit(_request('big', 1), time.time_ns()) + _drain(small)
        assert len(outs) == 1 and isinstance(outs[0], StepFailure)
        assert outs[0].reason is FailureReason.KV_POOL_FULL
        assert 'KV pool' in outs[0].detail
    finally:
        small.close()


def test_prefill_chunk_defaults_to_the_device_and_a_set_value_wins():
    auto = EngineConfig()
    assert auto.prefill_chunk_tokens('cpu') == 256
    assert auto.prefill_chunk_tokens('cuda') == 8192
    assert EngineConfig(chunked_prefill_size=96).prefill_chunk_tokens('cuda') == 96


def test_the_scheduler_gets_the_cpu_chunk_when_the_setting_is_zero():
    core = _core(chunked_prefill_size=0)
    try:
        assert core.scheduler.config.chunked_prefill_size == 256
    finally:
        core.close()
