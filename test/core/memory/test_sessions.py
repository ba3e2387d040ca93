"""Robot sessions: prefix locking, step KV policy, instruction change, close, idle timeout."""

from __future__ import annotations

import pytest
import torch
from kv_testing import decode, make_memory, prefill

from vla_sched.core.memory.kv_errors import SessionError
from vla_sched.core.memory.kv_memory import KVMemory
from vla_sched.core.memory.radix_key import RadixKey
from vla_sched.core.memory.req_kv import ReqKV

PREFIX = list(range(100, 110))  # system prompt + instruction, 10 tokens
OTHER_PREFIX = list(range(200, 210))
S = 10**9  # nanoseconds


def _prefix(tokens: list[int] = PREFIX) -> RadixKey:
    return RadixKey(torch.tensor(tokens, dtype=torch.int64))


def _step(memory: KVMemory, robot: str, rid: str, frame: int, *, now_ns: int = 0) -> ReqKV:
    """A step whose 6 observation tokens differ per frame, bound to the robot's session."""
    prefix = memory.sessions.get(robot).prefix.token_ids.tolist()
    req = ReqKV.from_prompt(rid, prefix + [frame] * 6)
    memory.sessions.begin_step(robot, req, now_ns=now_ns)
    return req


def test_open_locks_nothing_until_a_step_caches_the_prefix() -> None:
    memory = make_memory(page_size=4, num_pages=16)
    session = memory.sessions.open('r1', _prefix(), now_ns=0)
    assert session.locked_len == 0
    step = _step(memory, 'r1', 's1', frame=1)
    prefill(memory, step)
    assert session.locked_len == 8  # page-aligned part of the 10-token prefix
    memory.check_integrity([step])
    assert session.locked_node.lock_ref == 2  # the session and its step (cached to there)
    memory.release(step, insert=True)
    assert session.locked_node.lock_ref == 1


def test_free_policy_frees_the_steps_own_kv_and_keeps_the_prefix_locked() -> None:
    memory = make_memory(page_size=4, num_pages=16)
    memory.sessions.open('r1', _prefix(), now_ns=0)
    step = _step(memory, 'r1', 's1', frame=1)
    prefill(memory, step)
    decode(memory, step, num_steps=3)
    memory.release(step, insert=True, now_ns=S)
    assert (memory.evictable_size(), memory.protected_size()) == (0, 8)
    assert memory.allocator.num_free_pages == 16 - 2
    memory.check_integrity([])


def test_insert_policy_caches_the_steps_kv_as_evictable() -> None:
    memory = make_memory(page_size=4, num_pages=16, session_step_kv='insert')
    memory.sessions.open('r1', _prefix(), now_ns=0)
    step = _step(memory, 'r1', 's1', frame=1)
    prefill(memory, step)
    decode(memory, step, num_steps=3)
    memory.release(step, insert=True, now_ns=S)
    # 16 prompt tokens + 3 decoded = 19 committed: 16 cached, 8 of them the locked prefix
    assert (memory.evictable_size(), memory.protected_size()) == (8, 8)
    memory.check_integrity([])


@pytest.mark.parametrize(('page_size', 'reused'), [(1, 10), (4, 8)])
def test_the_next_step_reuses_the_cached_prefix(page_size: int, reused: int) -> None:
    memory = make_memory(page_size=page_size, num_pages=64)
    memory.sessions.open('r1', _prefix(), now_ns=0)
    first = _step(memory, 'r1', 's1', frame=1)
    prefill(memory, first)
    prefix_slots = first.prefix_indices[:reused].tolist()
    memory.release(first, insert=True, now_ns=S // 10)
    second = _step(memory, 'r1', 's2', frame=2, now_ns=2 * S // 10)
    assert memory.match_prefix(second).device_indices.tolist() == prefix_slots
    memory.check_integrity([second])


def test_the_locked_prefix_survives_evicting_everything() -> None:
    memory = make_memory(num_pages=32, session_step_kv='insert')
    memory.sessions.open('r1', _prefix(), now_ns=0)
    step = _step(memory, 'r1', 's1', frame=1)
    prefill(memory, step)
    memory.release(step, insert=True)
    assert memory.evict(1000) == 6
    assert memory.protected_size() == 10
    assert memory.sessions.get('r1').locked_len == 10
    memory.check_integrity([])


def test_instruction_change_unlocks_the_old_prefix_and_locks_the_new_one() -> None:
    memory = make_memory(num_pages=64)
    session = memory.sessions.open('r1', _prefix(), now_ns=0)
    step = _step(memory, 'r1', 's1', frame=1)
    prefill(memory, step)
    memory.release(step, insert=True)
    memory.sessions.change_prefix('r1', _prefix(OTHER_PREFIX), now_ns=S)
    assert session.locked_len == 0
    assert (memory.evictable_size(), memory.protected_size()) == (10, 0)
    step = _step(memory, 'r1', 's2', frame=2)
    prefill(memory, step)
    memory.release(step, insert=True)
    assert session.locked_len == 10
    assert (memory.evictable_size(), memory.protected_size()) == (10, 10)
    assert memory.evict(100) == 10
    assert memory.match_prefix(ReqKV.from_prompt('p', [*OTHER_PREFIX, 0])).device_indices.numel()
    memory.check_integrity([])


def test_the_session_records_the_instruction_version_of_its_prefix() -> None:
    memory = make_memory(num_pages=16)
    session = memory.sessions.open('r1', _prefix(), now_ns=0, instruction_version=3)
    assert session.instruction_version == 3
    memory.sessions.change_prefix('r1', _prefix(OTHER_PREFIX), now_ns=S, instruction_version=7)
    assert session.instruction_version == 7
    memory.sessions.change_prefix('r1', _prefix(), now_ns=2 * S)  # no version given: the next one
    assert (session.instruction_version, session.prefix.token_ids.tolist()) == (8, PREFIX)
    memory.check_integrity([])


def test_close_unlocks_the_prefix_and_returns_steps_still_in_flight() -> None:
    memory = make_memory(num_pages=32)
    memory.sessions.open('r1', _prefix(), now_ns=0)
    step = _step(memory, 'r1', 's1', frame=1)
    prefill(memory, step)
    assert memory.sessions.close('r1') == ('s1',)
    assert 'r1' not in memory.sessions
    memory.check_integrity([step])
    memory.release(step, insert=False)  # the caller aborts the in-flight step
    assert (memory.evictable_size(), memory.protected_size()) == (10, 0)
    memory.check_integrity([])


def test_idle_timeout_closes_only_idle_sessions_without_steps() -> None:
    memory = make_memory(num_pages=64, session_idle_timeout_s=10.0)
    for robot in ('idle', 'busy', 'recent'):
        memory.sessions.open(robot, _prefix(), now_ns=0)
    busy_step = _step(memory, 'busy', 'b1', frame=1, now_ns=S)
    prefill(memory, busy_step)
    recent = _step(memory, 'recent', 'r1', frame=2, now_ns=S)
    prefill(memory, recent)
    memory.release(recent, insert=True, now_ns=5 * S)
    assert memory.sessions.reap_idle(now_ns=99 * S // 10) == []
    assert memory.sessions.reap_idle(now_ns=10 * S) == ['idle']
    assert memory.sessions.reap_idle(now_ns=149 * S // 10) == []
    assert memory.sessions.reap_idle(now_ns=15 * S) == ['recent']
    assert 'busy' in memory.sessions
    memory.check_integrity([busy_step])


def test_a_retracted_step_stays_active_so_its_session_is_not_reaped() -> None:
    memory = make_memory(num_pages=64, session_idle_timeout_s=1.0)
    memory.sessions.open('r1', _prefix(), now_ns=0)
    step = _step(memory, 'r1', 's1', frame=1)
    prefill(memory, step)
    memory.retract(step)
    assert memory.sessions.reap_idle(now_ns=100 * S) == []
    memory.check_integrity([step])


def test_bad_session_calls_raise_naming_robot_and_request() -> None:
    memory = make_memory()
    memory.sessions.open('r1', _prefix(), now_ns=0)
    with pytest.raises(SessionError, match="robot 'r1' already has an open session"):
        memory.sessions.open('r1', _prefix(), now_ns=0)
    with pytest.raises(SessionError, match="robot 'r9' has no open session"):
        memory.sessions.close('r9')
    stranger = ReqKV.from_prompt('x', [*OTHER_PREFIX, 1, 1])
    with pytest.raises(SessionError, match=r"request 'x' does not extend .* robot 'r1'"):
        memory.sessions.begin_step('r1', stranger, now_ns=0)
    other_namespace = ReqKV.from_prompt('y', [*PREFIX, 1], extra_key='franka')
    with pytest.raises(SessionError, match="request 'y'"):
        memory.sessions.begin_step('r1', other_namespace, now_ns=0)
    memory.check_integrity([])
