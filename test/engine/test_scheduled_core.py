"""The scheduled core batches robots, reuses session prefixes and reports every outcome."""

from __future__ import annotations

import dataclasses
import math
import time

import numpy as np
import pytest

from vla_sched.core.forward_batch import ForwardMode
from vla_sched.engine.assembly import assemble_core, kv_memory_config_for, scheduler_config_for
from vla_sched.engine.config import EngineConfig
from vla_sched.engine.scheduled_core import ScheduledCore
from vla_sched.ipc.messages import FailureReason, StepFailure, StepRequest, StepResult
from vla_sched.model.families.protocol import ServingRules

pytestmark = pytest.mark.slow
RULES = ServingRules(prefill_only=False, min_steps_per_pass=0, num_non_text_tokens=256)


def _request(robot_id, step_seq, *, instruction='pick up the cup', version=1, **kw):
    now = time.time_ns()
    fields = dict(
        robot_id=robot_id, step_seq=step_seq, stamp_ns=now, deadline_ns=now + 120 * 10**9,
        received_ns=now,
        images=(np.full((20, 30, 3), (7 * step_seq + len(robot_id)) % 256, np.uint8),),
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
    # The passes' measured costs, which size later passes by deadline, are reported.
    assert stats.decode_step_ms > 0 and stats.num_deadline_waits >= 0
    assert math.isnan(stats.prefill_us_per_token) or stats.prefill_us_per_token > 0


def test_malformed_step_fails_at_once_and_the_engine_keeps_serving(core):
    bad = core.submit(_request('r4', 1, images=(np.zeros((4, 4), np.uint8),)), time.time_ns())
    assert [f.reason for f in bad] == [FailureReason.MALFORMED_IMAGE]
    assert core.submit(_request('r5', 1), time.time_ns()) == []
    (out,) = _drain(core)
    assert isinstance(out, StepResult) and out.robot_id == 'r5'


def test_an_instruction_within_the_bytes_but_beyond_the_tokens_is_refused_and_others_served(
    core,
):
    text = '🍎' * 100  # 400 bytes, within limits.max_instruction_bytes
    limit = core.config.max_instruction_tokens
    num_tokens = core.served.instruction_tokens(text)
    assert len(text.encode()) <= core.config.max_instruction_bytes and num_tokens > limit
    (bad,) = core.submit(_request('r9', 1, instruction=text), time.time_ns())
    assert bad.reason is FailureReason.INVALID_INSTRUCTION
    assert bad.detail == f'instruction is {num_tokens} tokens, limit {limit}'
    assert core.submit(_request('r10', 1), time.time_ns()) == []
    (out,) = _drain(core)
    assert isinstance(out, StepResult) and out.robot_id == 'r10'


def test_request_rows_are_sized_for_the_tighter_instruction_bound():
    by_tokens = kv_memory_config_for(EngineConfig(max_instruction_tokens=64), RULES)
    by_bytes = kv_memory_config_for(EngineConfig(max_instruction_bytes=32), RULES)
    default = kv_memory_config_for(EngineConfig(), RULES)
    assert by_bytes.max_context_len < by_tokens.max_context_len < default.max_context_len
    assert default.max_context_len - by_tokens.max_context_len == 256 - 64


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
    (session,) = [s for s in core.scheduler.sessions() if s.robot_id == 'r7']
    prefix = core.served.translator.prompts.build('open the drawer').token_ids
    assert session.prefix.token_ids.tolist() == list(prefix[: len(session.prefix.token_ids)])
    assert session.instruction_version == 2
    core.close_session('r7')
    assert 'r7' not in {s.robot_id for s in core.scheduler.sessions()}


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


def test_the_scheduler_gets_the_cpu_chunk_and_the_session_timeout_of_the_settings():
    core = _core(chunked_prefill_size=0, session_idle_timeout_s=2.5)
    try:
        assert core.scheduler.config.chunked_prefill_size == 256
        assert core.memory.sessions.idle_timeout_ns == 2_500_000_000
    finally:
        core.close()


def _decode_steps_per_pass(core: ScheduledCore, robots, seq: int) -> tuple[dict, list[int]]:
    """Submit one step per robot and run until idle: the outputs by robot and the number
    of decode steps of every decode pass."""
    for robot in robots:
        assert core.submit(_request(robot, seq), time.time_ns()) == []
    outs, passes = {}, []
    for _ in range(400):
        if not core.has_work():
            return outs, passes
        for out in core.step(time.time_ns()):
            outs[out.robot_id] = out
        core.check_integrity()
        last = core.scheduler.last_batch
        if last is not None and not last.is_extend and last.forward_batch is not None:
            passes.append(last.forward_batch.num_decode_steps)
    raise AssertionError('the scheduler did not go idle')


def test_decode_bursts_give_the_same_actions_in_fewer_passes():
    robots = ('b1', 'b2', 'b3')
    results = {}
    for steps in (1, 8):
        core = _core(num_continuous_decode_steps=steps)
        try:
            results[steps] = _decode_steps_per_pass(core, robots, 1)
        finally:
            core.close()
    (single, single_passes), (burst, burst_passes) = results[1], results[8]
    num_decode_tokens = core.info.action_horizon * core.info.action_dim - 1
    assert set(single_passes) == {1}
    assert max(burst_passes) > 1 and len(burst_passes) < len(single_passes)
    # Every robot got each of its tokens once: a burst never runs past max_new_tokens.
    assert sum(burst_passes) <= sum(single_passes) <= len(robots) * num_decode_tokens
    for robot in robots:
        assert isinstance(burst[robot], StepResult) and isinstance(single[robot], StepResult)
        np.testing.assert_array_equal(burst[robot].actions, single[robot].actions)


def test_no_burst_runs_while_a_step_waits_for_its_prefill():
    # Two decode-only passes follow each prefill: w1 decodes while w2 waits.
    core = _core(
        num_continuous_decode_steps=8, prefill_decode_interval=2, chunked_prefill_size=1024
    )
    try:
        assert core.submit(_request('w1', 1), time.time_ns()) == []
        core.step(time.time_ns())  # w1's whole prefill
        core.check_integrity()
        assert core.scheduler.last_batch.is_extend and not core.scheduler.waiting_queue
        assert core.submit(_request('w2', 1), time.time_ns()) == []
        core.step(time.time_ns())
        core.check_integrity()
        last = core.scheduler.last_batch
        assert core.scheduler.waiting_queue and not last.is_extend
        assert last.forward_batch.num_decode_steps == 1
        outs = _drain(core)
        assert sorted(o.robot_id for o in outs if isinstance(o, StepResult)) == ['w1', 'w2']
    finally:
        core.close()


def test_assembled_parts_given_another_scheduler_config_and_runner_are_served_as_given():
    config = EngineConfig(kv_pool_tokens=1024, page_size=16, chunked_prefill_size=64)
    derived = scheduler_config_for(config, 'cpu')
    chosen = dataclasses.replace(derived, num_continuous_decode_steps=1, enable_overlap=False)
    launches: list[ForwardMode] = []

    class Recorded:
        def __init__(self, runner):
            self.runner = runner

        def launch(self, batch):
            launches.append(batch.forward_mode)
            return self.runner.launch(batch)

    parts = assemble_core(config)
    core = ScheduledCore(
        dataclasses.replace(parts, scheduler_config=chosen, runner=Recorded(parts.runner))
    )
    try:
        assert core.scheduler.config is chosen
        assert isinstance(core.scheduler.runner, Recorded)
        assert core.submit(_request('w', 1), time.time_ns()) == []
        (out,) = _drain(core)
        assert isinstance(out, StepResult)
        assert launches[0] is ForwardMode.EXTEND
        num_tokens = core.info.action_horizon * core.info.action_dim
        assert launches.count(ForwardMode.DECODE) == num_tokens - 1
    finally:
        core.close()
