"""The executor's merge modes on a recorded chunk sequence: what each plays at the seam between
two chunks, and that a gripper's open/close is never averaged in any of them.

The sequence (``RECORDED``) is an arm of two joints and a gripper, dt 100 ms, horizon 5,
observed every 200 ms, each chunk published 125 ms after its image and arriving 5 ms later;
the gripper closes in the second chunk.
"""

from __future__ import annotations

import numpy as np
import pytest

from vla_sched.ros.chunk_executor import Chunk, ChunkExecutor
from vla_sched.ros.merge import MergeRule, ensemble_weights, frozen_prefix

MS = 1_000_000
T0 = 10_000 * MS
DT = 100 * MS
JOINTS = ('j0', 'j1', 'gripper')
OPEN, CLOSED = 1.0, 0.0
PUBLISH_MS = 125
ARRIVAL_MS = 130

# (image stamp after T0 in ms, j0 of action 0, the gripper): j0 rises 1 per action, j1 = -j0
RECORDED = ((0, 0.0, OPEN), (200, 10.0, CLOSED), (400, 20.0, CLOSED))


def _recorded() -> list[Chunk]:
    chunks = []
    for seq, (stamp_ms, start, gripper) in enumerate(RECORDED, start=1):
        j0 = start + np.arange(5.0)
        actions = np.stack([j0, -j0, np.full(5, gripper)], axis=1)
        stamp = T0 + stamp_ms * MS
        chunks.append(Chunk(seq, stamp, DT, stamp + 300 * MS, actions, JOINTS, 'jp', 'base'))
    return chunks


def _executor(mode: str, **kwargs) -> ChunkExecutor:
    return ChunkExecutor(
        action_spaces=('jp',),
        blending=mode,
        ensemble_m=kwargs.pop('m', 0.0),
        lookahead=False,
        **kwargs,
    )


def _play(ex: ChunkExecutor, until_ms: int = 1000) -> dict[int, tuple[np.ndarray, int]]:
    """Replay ``RECORDED`` through ``ex``: a tick at each arrival and each due tick; the first
    row sent at each tick (ms after T0) with when it is reached (ms after T0)."""
    arrivals = {c.stamp_ns + ARRIVAL_MS * MS: c for c in _recorded()}
    played, now, due = {}, T0, None
    while now <= T0 + until_ms * MS:
        chunk = arrivals.pop(now, None)
        if chunk is not None:
            published = chunk.stamp_ns + PUBLISH_MS * MS
            assert ex.receive(chunk, now, published_ns=published) is None
        if chunk is not None or now == due:
            command = ex.tick(now)
            if command is not None:
                played[(now - T0) // MS] = (command.rows[0], (command.reached_ns[0] - T0) // MS)
            due = ex.next_tick_ns(now)
        candidates = [t for t in (*arrivals, due) if t is not None and t > now]
        if not candidates:
            break
        now = min(candidates)
    return played


def test_aligned_plays_the_new_chunks_action_of_the_time_at_once_by_its_timestamps():
    played = _play(_executor('aligned'))
    j0 = {t: row[0] for t, (row, _) in played.items()}
    # chunk 1 from 130 ms (its action 1), chunk 2 from 330 ms (its action 1: 300-400 ms)
    assert j0 == {130: 1.0, 200: 2.0, 300: 3.0, 330: 11.0, 400: 12.0, 500: 13.0,
                  530: 21.0, 600: 22.0, 700: 23.0, 800: 24.0}  # fmt: skip
    assert played[330][1] == 400  # reached at the end of the interval it covers


def test_off_is_the_former_name_of_aligned():
    assert _play(_executor('off')).keys() == _play(_executor('aligned')).keys()


def test_latest_plays_each_new_chunk_from_its_start_on_arrival():
    played = _play(_executor('latest'))
    j0 = {t: row[0] for t, (row, _) in played.items()}
    assert j0[130] == 0.0 and played[130][1] == 230  # action 0 now, reached dt later
    assert j0[330] == 10.0 and played[330][1] == 430  # the latency ignored
    assert [j0[t] for t in (430, 530)] == [11.0, 20.0]


def test_rtc_plays_on_over_the_frozen_prefix_and_takes_the_new_chunk_after_it():
    chunk = _recorded()[1]
    # published 125 ms after its image: actions 0 and 1 (0-100, 100-200 ms) had started
    assert frozen_prefix(chunk, arrived_ns=chunk.stamp_ns + 130 * MS, published_ns=0) == 2
    played = _play(_executor('rtc'))
    j0 = {t: row[0] for t, (row, _) in played.items()}
    # at 330 ms chunk 1's action 3 is committed; chunk 2 takes over at 400 ms with action 2
    assert j0[330] == 3.0 and played[330][1] == 400
    assert [j0[t] for t in (300, 400, 500, 600)] == [3.0, 12.0, 13.0, 22.0]
    assert all(reached - t <= DT // MS for t, (_, reached) in played.items())


def test_a_chunk_published_later_than_it_arrived_freezes_more():
    chunk = _recorded()[0]
    late = frozen_prefix(chunk, arrived_ns=chunk.stamp_ns + 50 * MS, published_ns=chunk.stamp_ns)
    assert late == 1
    assert frozen_prefix(chunk, arrived_ns=0, published_ns=chunk.stamp_ns + 250 * MS) == 3
    assert frozen_prefix(chunk, arrived_ns=chunk.end_ns + DT, published_ns=0) == chunk.horizon


def test_blend_cross_fades_only_the_blend_joints_over_the_overlap():
    ex = _executor('blend', blend_joints=('j0',))
    played = _play(ex)
    # at 330 ms (chunk 2's arrival) the weight of chunk 2 is 0: j0 is chunk 1's action 3
    row = played[330][0]
    assert row[0] == pytest.approx(3.0) and row[1] == -11.0  # j1 switches at once
    # at 400 ms: w = (400 - 330) / (500 - 330), chunk 1's action 4 and chunk 2's action 2
    w = 70 / 170
    assert played[400][0][0] == pytest.approx((1 - w) * 4.0 + w * 12.0)
    assert played[400][0][1] == -12.0


def test_temporal_ensemble_averages_the_arm_joints_of_every_covering_chunk():
    played = _play(_executor('temporal_ensemble', m=0.5))
    expected = ensemble_weights(2, 0.5) @ np.array([4.0, 12.0])  # at 400 ms
    assert played[400][0][0] == pytest.approx(expected)
    assert played[400][0][1] == pytest.approx(-expected)


@pytest.mark.parametrize('mode', ['latest', 'aligned', 'blend', 'temporal_ensemble', 'rtc'])
def test_a_gripper_open_or_close_is_never_averaged(mode):
    ex = _executor(mode, blend_joints=('j0', 'j1'), **({'m': 0.0} if mode != 'blend' else {}))
    grippers = [row[2] for row, _ in _play(ex).values()]
    assert set(grippers) == {OPEN, CLOSED}  # both were played, nothing in between
    assert grippers == sorted(grippers, reverse=True)  # open until it closed


def test_a_gripper_cannot_be_a_blend_joint():
    with pytest.raises(ValueError, match='a gripper is never blended'):
        MergeRule('blend', blend_joints=frozenset({'j0', 'left_finger_joint'}))


def test_rtc_takes_over_early_rather_than_hold_when_the_old_chunk_has_nothing_left():
    ex = _executor('rtc', min_lead_ns=15 * MS)
    first, second = _recorded()[:2]
    ex.receive(first, first.stamp_ns)
    ex.tick(first.stamp_ns)
    arrival = first.end_ns - 10 * MS  # the old chunk's last action is reached in 10 ms
    assert ex.receive(second, arrival) is None
    command = ex.tick(arrival)
    assert command is not None and not ex.holding and ex.counts.holds == 0
    assert command.rows[0][0] == 13.0 and command.reached_ns[0] == first.end_ns + DT
