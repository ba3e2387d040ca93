"""The scheduler owns robot sessions: open, swap the prefix, close, reap when idle."""

from __future__ import annotations

import torch
from sched_testing import (
    make_req,
    make_scheduler,
    run_until_idle,
)

from vla_sched.core.memory.radix_key import RadixKey
from vla_sched.core.scheduling.request import AbortReason

S = 10**9  # nanoseconds
PREFIX = list(range(300, 310))  # system prompt + instruction
OTHER_PREFIX = list(range(400, 410))


def _key(tokens: list[int]) -> RadixKey:
    return RadixKey(torch.tensor(tokens, dtype=torch.int64))


def _step(robot: str, seq: int, prefix: list[int] = PREFIX, *, max_new: int = 3):
    return make_req(
        f'{robot}-{seq}',
        [*prefix, 50 + seq, 51],
        max_new,
        robot_id=robot,
        step_seq=seq,
        session_id=robot,
    )


def _sessions(sched) -> dict[str, tuple[int, int, int]]:
    """Each open session's (instruction version, locked tokens, last active ns)."""
    return {
        s.robot_id: (s.instruction_version, s.locked_len, s.last_active_ns)
        for s in sched.sessions()
    }


def test_a_session_opens_on_the_scheduler_clock_and_the_same_version_changes_nothing():
    sched = make_scheduler()
    sched.clock.advance(7 * S)
    sched.open_or_update_session('r1', _key(PREFIX), instruction_version=2)
    assert _sessions(sched) == {'r1': (2, 0, 7 * S)}
    sched.add_request(_step('r1', 1))
    run_until_idle(sched)
    (session,) = sched.sessions()
    locked = session.locked_node
    sched.open_or_update_session('r1', _key(OTHER_PREFIX), instruction_version=2)
    assert session.prefix.token_ids.tolist() == PREFIX and session.locked_node is locked
    assert session.locked_len == len(PREFIX)
    sched.check_integrity()


def test_a_new_instruction_version_swaps_the_prefix_and_frees_the_old_one_to_eviction():
    sched = make_scheduler()
    sched.open_or_update_session('r1', _key(PREFIX), instruction_version=1)
    sched.add_request(_step('r1', 1))
    run_until_idle(sched)
    assert sched.memory.protected_size() == len(PREFIX)
    sched.clock.advance(S)
    now = sched.clock()
    sched.open_or_update_session('r1', _key(OTHER_PREFIX), instruction_version=2)
    assert _sessions(sched) == {'r1': (2, 0, now)}
    assert (sched.memory.protected_size(), sched.memory.evictable_size()) == (0, len(PREFIX))
    sched.check_integrity()
    old = sched.add_request(_step('r1', 2))  # still the old instruction's prompt
    assert old.abort is AbortReason.SESSION_MISMATCH
    sched.add_request(_step('r1', 3, OTHER_PREFIX))
    run_until_idle(sched)
    assert _sessions(sched)['r1'][:2] == (2, len(OTHER_PREFIX))


def test_a_session_idle_past_the_timeout_is_reaped_in_the_loop_and_its_prefix_unlocked():
    sched = make_scheduler(session_idle_timeout_s=2.0)
    sched.open_or_update_session('gone', _key(PREFIX))
    sched.open_or_update_session('busy', _key(PREFIX))
    sched.add_request(_step('gone', 1))
    run_until_idle(sched)
    sched.clock.advance(S)
    sched.add_request(_step('busy', 1, max_new=50))
    sched.run_once()
    sched.clock.advance(S)  # 'gone' idle 2 s since its step ended, 'busy' mid-step
    sched.run_once()
    assert set(_sessions(sched)) == {'busy'}
    sched.check_integrity()
    sched.clock.advance(5 * S)  # a step in flight keeps its session open however long
    sched.run_once()
    assert set(_sessions(sched)) == {'busy'}
    run_until_idle(sched)
    sched.clock.advance(2 * S)
    sched.add_request(make_req('other', [1, 2, 3], 2))
    run_until_idle(sched)
    assert _sessions(sched) == {}
    assert sched.memory.protected_size() == 0
    sched.check_integrity()


def test_a_reaped_robot_opens_its_session_again_and_reuses_the_cached_prefix():
    sched = make_scheduler(session_idle_timeout_s=1.0)
    sched.open_or_update_session('r1', _key(PREFIX), instruction_version=3)
    sched.add_request(_step('r1', 1))
    run_until_idle(sched)
    sched.clock.advance(10 * S)
    sched.add_request(make_req('other', [1, 2, 3], 2))
    run_until_idle(sched)
    assert _sessions(sched) == {}
    sched.open_or_update_session('r1', _key(PREFIX), instruction_version=3)
    again = _step('r1', 2)
    assert sched.add_request(again) is None
    run_until_idle(sched)
    assert again.num_cached_tokens == len(PREFIX)
    sched.check_integrity()


def test_a_zero_timeout_never_reaps():
    sched = make_scheduler(session_idle_timeout_s=0.0)
    sched.open_or_update_session('r1', _key(PREFIX))
    sched.clock.advance(10**6 * S)
    sched.add_request(make_req('other', [1, 2, 3], 2))
    run_until_idle(sched)
    assert set(_sessions(sched)) == {'r1'}


def test_closing_an_unknown_session_is_a_no_op():
    sched = make_scheduler()
    assert sched.close_session('nobody') == []
    sched.open_or_update_session('r1', _key(PREFIX))
    assert sched.close_session('r1') == []
    assert sched.sessions() == []
    sched.check_integrity()
