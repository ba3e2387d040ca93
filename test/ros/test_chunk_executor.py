"""The chunk executor's rules, on plain times: a chunk plays out one action per dt, blends
with the chunks it overlaps as ACT does, never plays after its deadline or its end, and holds
when nothing valid is left."""

from __future__ import annotations

import numpy as np
import pytest

from vla_sched.ros.chunk_executor import Chunk, ChunkExecutor
from vla_sched.ros.chunk_executor_config import ChunkExecutorConfig
from vla_sched.ros.merge import ensemble_weights
from vla_sched.ros.node_config import ConfigError

MS = 1_000_000
T0 = 50_000 * MS  # the image stamp of the first chunk
DT = 100 * MS
JOINTS = ('j0', 'j1')


def _chunk(seq: int, stamp_ns: int, rows, *, budget_ns: int = 150 * MS, **fields) -> Chunk:
    values = {
        'step_seq': seq,
        'stamp_ns': stamp_ns,
        'dt_ns': DT,
        'deadline_ns': stamp_ns + budget_ns,
        'actions': np.asarray(rows, dtype=np.float64),
        'joint_names': JOINTS,
        'action_space': 'joint_position',
        'frame_id': 'base',
    }
    values.update(fields)
    return Chunk(**values)


def _ramp(start: float, horizon: int = 4) -> np.ndarray:
    """Action k is ``[start + k, -(start + k)]``."""
    column = start + np.arange(horizon, dtype=np.float64)
    return np.stack([column, -column], axis=1)


def _executor(blending: str = 'off', m: float = 0.0, lookahead: bool = False) -> ChunkExecutor:
    return ChunkExecutor(
        action_spaces=('joint_position',), blending=blending, ensemble_m=m, lookahead=lookahead
    )


def test_a_chunk_plays_one_action_per_dt_on_its_boundaries_then_holds():
    ex = _executor()
    assert ex.receive(_chunk(1, T0, _ramp(0.0)), T0 + 30 * MS) is None
    played, now = [], T0 + 30 * MS  # received mid-interval: action 0 at once
    while now is not None:
        command = ex.tick(now)
        if command is None:
            break
        played.append((now - T0, command.rows[0][0], command.reached_ns[0] - T0))
        now = ex.next_tick_ns(now)
    assert played == [
        (30 * MS, 0.0, 100 * MS),
        (100 * MS, 1.0, 200 * MS),
        (200 * MS, 2.0, 300 * MS),
        (300 * MS, 3.0, 400 * MS),
    ]
    assert now == T0 + 400 * MS  # the end of the chunk: that tick holds
    assert ex.holding and ex.next_tick_ns(now) is None
    assert (ex.counts.actions_executed, ex.counts.chunks_executed, ex.counts.holds) == (4, 1, 1)
    assert ex.tick(now + DT) is None and ex.counts.holds == 1  # one hold, however long


@pytest.mark.parametrize(
    ('received_after_ns', 'reason'),
    [(151 * MS, 'past_deadline'), (400 * MS, 'ended_before_arrival'), (150 * MS, None)],
)
def test_a_chunk_received_after_its_deadline_is_skipped_never_played(received_after_ns, reason):
    ex = _executor()
    now = T0 + received_after_ns
    assert ex.receive(_chunk(1, T0, _ramp(0.0)), now) == reason
    if reason is None:
        assert ex.tick(now).rows[0][0] == 1.0  # 150 ms: action 1
    else:
        assert ex.tick(now) is None and ex.counts.skipped[reason] == 1
        assert ex.counts.actions_executed == 0 and not ex.holding


def test_no_action_is_played_after_its_chunks_end_even_with_a_late_deadline():
    ex = _executor()
    chunk = _chunk(1, T0, _ramp(0.0, horizon=2), budget_ns=10_000 * MS)
    assert ex.receive(chunk, T0) is None
    assert ex.tick(T0 + 180 * MS).rows[0][0] == 1.0
    assert ex.tick(T0 + 199 * MS) is None  # reached 1 ms later: under the minimum lead
    assert ex.tick(T0 + 200 * MS) is None  # its end


def test_a_chunk_that_ended_before_it_arrived_is_not_said_to_be_past_its_deadline():
    ex = _executor()
    chunk = _chunk(1, T0, _ramp(0.0), budget_ns=10_000 * MS)
    assert ex.receive(chunk, T0 + 450 * MS) == 'ended_before_arrival'
    _, detail = ex.counts.last_skip
    assert 'arrived 450.0 ms after its stamp' in detail and 'horizon 4 x dt 100 ms' in detail
    near_end = _chunk(2, T0 + DT, _ramp(0.0), budget_ns=10_000 * MS)
    assert ex.receive(near_end, T0 + 495 * MS) == 'ends_within_lead'  # its end 5 ms away
    assert ex.counts.skipped['past_deadline'] == 0


def test_without_blending_the_newest_chunk_wins_and_an_unplayed_older_one_is_superseded():
    ex = _executor()
    ex.receive(_chunk(1, T0, _ramp(0.0)), T0 + 10 * MS)
    assert ex.tick(T0 + 10 * MS).rows[0][0] == 0.0
    ex.receive(_chunk(2, T0 + 100 * MS, _ramp(10.0)), T0 + 120 * MS)
    ex.receive(_chunk(3, T0 + 150 * MS, _ramp(20.0)), T0 + 160 * MS)
    command = ex.tick(T0 + 160 * MS)
    assert command.rows[0][0] == 20.0  # chunk 3's action 0
    assert command.reached_ns[0] == T0 + 250 * MS  # the end of chunk 3's interval
    assert ex.counts.skipped['superseded'] == 1  # chunk 2 never played; chunk 1 did
    assert ex.counts.chunks_executed == 2
    assert ex.next_tick_ns(T0 + 160 * MS) == T0 + 250 * MS  # on chunk 3's boundaries now


def test_a_chunk_not_newer_than_the_newest_or_of_another_action_space_is_skipped():
    ex = _executor()
    ex.receive(_chunk(2, T0 + 50 * MS, _ramp(0.0)), T0 + 60 * MS)
    assert ex.receive(_chunk(1, T0, _ramp(5.0)), T0 + 60 * MS) == 'out_of_order'
    assert ex.receive(_chunk(3, T0 + 50 * MS, _ramp(5.0)), T0 + 60 * MS) == 'out_of_order'
    ee = _chunk(4, T0 + 60 * MS, _ramp(5.0), action_space='ee_delta')
    assert ex.receive(ee, T0 + 60 * MS) == 'action_space'
    assert ex.tick(T0 + 60 * MS).rows[0][0] == 0.0


def test_the_ensemble_weights_are_acts_exponential_oldest_first():
    np.testing.assert_allclose(
        ensemble_weights(3, 0.5), np.exp([0.0, -0.5, -1.0]) / np.exp([0.0, -0.5, -1.0]).sum()
    )
    np.testing.assert_allclose(ensemble_weights(4, 0.0), [0.25] * 4)
    assert ensemble_weights(1, 3.0).tolist() == [1.0]


def test_temporal_ensembling_blends_every_chunk_that_covers_the_time():
    m = 0.7
    ex = _executor('temporal_ensemble', m)
    chunks = [_chunk(i + 1, T0 + i * DT, _ramp(10.0 * i)) for i in range(3)]
    for chunk in chunks:
        ex.receive(chunk, chunk.stamp_ns)
    now = T0 + 250 * MS  # chunk 1's action 2, chunk 2's action 1, chunk 3's action 0
    expected = ensemble_weights(3, m) @ np.array([_ramp(0.0)[2], _ramp(10.0)[1], _ramp(20.0)[0]])
    command = ex.tick(now)
    np.testing.assert_allclose(command.rows[0], expected, rtol=1e-12)
    assert command.reached_ns[0] == T0 + 300 * MS  # the newest chunk's interval end
    # after chunk 1 ended, the two others; after chunk 2 ended, chunk 3 alone
    pair = ensemble_weights(2, m) @ np.array([_ramp(10.0)[3], _ramp(20.0)[2]])
    np.testing.assert_allclose(ex.tick(T0 + 420 * MS).rows[0], pair, rtol=1e-12)
    np.testing.assert_allclose(ex.tick(T0 + 520 * MS).rows[0], _ramp(20.0)[3], rtol=1e-12)
    assert ex.tick(T0 + 600 * MS) is None
    assert ex.counts.chunks_executed == 3 and ex.counts.skipped['superseded'] == 0


def test_lookahead_holds_the_newest_chunks_later_actions_each_blended_at_its_start():
    ex = _executor('temporal_ensemble', 0.0, lookahead=True)
    ex.receive(_chunk(1, T0, _ramp(0.0)), T0)
    ex.receive(_chunk(2, T0 + DT, _ramp(10.0)), T0 + 130 * MS)
    now = T0 + 130 * MS
    command = ex.tick(now)
    assert [r - T0 for r in command.reached_ns] == [200 * MS, 300 * MS, 400 * MS, 500 * MS]
    column = command.rows[:, 0]
    # actions 1, 2, 3 of chunk 1 averaged with 0, 1, 2 of chunk 2; then chunk 2 alone
    np.testing.assert_allclose(column, [5.5, 6.5, 7.5, 13.0])
    assert all(r > now for r in command.reached_ns)


def test_a_chunk_with_other_joint_names_replaces_the_kept_ones():
    ex = _executor('temporal_ensemble', 0.0)
    ex.receive(_chunk(1, T0, _ramp(0.0)), T0)
    other = _chunk(2, T0 + 50 * MS, _ramp(10.0), joint_names=('a', 'b'))
    ex.receive(other, T0 + 60 * MS)
    command = ex.tick(T0 + 60 * MS)
    assert command.joint_names == ('a', 'b') and command.rows[0][0] == 10.0


@pytest.mark.parametrize(
    ('fields', 'message'),
    [
        ({'dt_ns': 0}, 'dt must be positive'),
        ({'actions': np.zeros((0, 2))}, 'no \\[horizon, dof\\] actions'),
        ({'actions': np.zeros((2, 3))}, '3 action columns for 2 joint names'),
        ({'actions': np.array([[0.0, np.nan]])}, 'non-finite'),
    ],
)
def test_a_malformed_chunk_is_refused(fields, message):
    with pytest.raises(ValueError, match=message):
        _chunk(1, T0, _ramp(0.0), **fields)


def test_the_gripper_needs_a_sink_that_plays_ee_delta_chunks():
    assert ChunkExecutorConfig(sink='twist', publish_gripper=True).action_spaces == ('ee_delta',)
    with pytest.raises(ConfigError, match='publish_gripper needs ee_delta chunks'):
        ChunkExecutorConfig(sink='joint_trajectory', publish_gripper=True)
    with pytest.raises(ConfigError, match='blending must be one of'):
        ChunkExecutorConfig(blending='average')


def test_a_hold_is_counted_and_timed_until_a_new_chunk_plays():
    ex = _executor()
    ex.receive(_chunk(1, T0, _ramp(0.0, horizon=2)), T0)
    ex.tick(T0)
    ex.tick(T0 + DT)
    assert ex.tick(T0 + 2 * DT) is None and ex.hold_since_ns == T0 + 2 * DT
    assert ex.holding and ex.hold_ns(T0 + 2 * DT + 700 * MS) == 700 * MS
    later = T0 + 3 * DT
    ex.receive(_chunk(2, later, _ramp(5.0, horizon=1)), later + 500 * MS - DT // 2)
    assert ex.tick(later + 500 * MS - DT // 2) is None  # stamped too long ago: still held
    ex.receive(_chunk(3, T0 + 2_000 * MS, _ramp(9.0, horizon=1)), T0 + 2_000 * MS)
    assert ex.tick(T0 + 2_000 * MS).rows[0][0] == 9.0
    assert ex.hold_since_ns is None and not ex.holding
    assert ex.counts.held_ns == ex.counts.longest_hold_ns == 1_800 * MS
    assert ex.tick(T0 + 2_100 * MS) is None and ex.counts.holds == 2


def test_the_executed_action_period_is_the_time_between_new_actions():
    ex = _executor()
    ex.receive(_chunk(1, T0, _ramp(0.0, horizon=8)), T0)
    for tick_ms in (0, 100, 200, 330, 400, 500, 600):  # one tick 30 ms late
        ex.tick(T0 + tick_ms * MS)
    ex.receive(_chunk(2, T0 + 610 * MS, _ramp(5.0)), T0 + 610 * MS)
    ex.tick(T0 + 610 * MS)  # a new chunk's action reached at a new time: a new action
    # 100, 100, 130, 70, 100, 100, then 10 to the new chunk's action
    assert len(ex.action_periods) == 7 and ex.action_periods.percentile(50) == 100.0
    assert (ex.action_periods.percentile(0), ex.action_periods.percentile(100)) == (10.0, 130.0)
