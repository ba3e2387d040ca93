"""Refused input messages: one let through per robot and reason per interval, the rest held
and counted into the next one let through."""

from __future__ import annotations

from vla_sched.ros.refusal_throttle import RefusalThrottle

S = 1_000_000_000


def test_one_refusal_per_key_and_interval_is_let_through_and_the_next_counts_the_held():
    throttle = RefusalThrottle()
    key = ('robot_0', 'invalid_state')
    assert throttle.admit(key, 0, S) == 0
    assert [throttle.admit(key, t, S) for t in range(1, 1000)] == [None] * 999
    assert throttle.admit(('robot_0', 'malformed_image'), 5, S) == 0  # another reason
    assert throttle.admit(('robot_1', 'invalid_state'), 5, S) == 0  # another robot
    assert throttle.admit(key, S, S) == 999
    assert throttle.admit(key, 2 * S, S) == 0
