"""No trajectory the executor sends ends on arrival: every point is due at least
``min_lead_s`` after its tick, so JointTrajectoryController's acceptance rule
(``trajectory_controller_rules``) holds for every trajectory received within that lead, at
every latency of the chunk's arrival up to its end, in every merge mode."""

from __future__ import annotations

import numpy as np
import pytest
from trajectory_controller_rules import controller_refusal

from vla_sched.ros.chunk_executor import Chunk, ChunkExecutor
from vla_sched.ros.chunk_executor_node import trajectory_message
from vla_sched.ros.conversions import stamp_to_ns

MS = 1_000_000
T0 = 5_000 * MS
DT = 100 * MS
HORIZON = 4
LEAD = 15 * MS
MODES = ('latest', 'aligned', 'blend', 'temporal_ensemble', 'rtc')


def _chunk(seq: int, stamp_ns: int) -> Chunk:
    actions = np.arange(HORIZON * 2, dtype=np.float64).reshape(HORIZON, 2) + 10 * seq
    return Chunk(seq, stamp_ns, DT, stamp_ns + HORIZON * DT, actions, ('j0', 'j1'), 'jp', '')


def _refusals(ex: ChunkExecutor, now_ns: int) -> list[str]:
    """Play from ``now_ns`` to the hold; why the controller refuses each trajectory received
    1 ns before the lead runs out (none expected), and each point due under the lead."""
    found = []
    while now_ns is not None:
        command = ex.tick(now_ns)
        if command is None:
            break
        traj = trajectory_message(command, stamped=True)
        refusal = controller_refusal(traj, received_ns=now_ns + LEAD - 1)
        if refusal is not None:
            found.append(f'{now_ns - T0} ns: {refusal}')
        leads = [stamp_to_ns(p.time_from_start) for p in traj.points]
        found += [f'{now_ns - T0} ns: a point due in {lead} ns' for lead in leads if lead < LEAD]
        now_ns = ex.next_tick_ns(now_ns)
    return found


@pytest.mark.parametrize('lookahead', [False, True])
@pytest.mark.parametrize('mode', MODES)
def test_every_trajectory_is_accepted_at_every_arrival_latency(mode, lookahead):
    # a second chunk arriving at every latency (0.5 ms steps, and 1 ns either side of each
    # action boundary) while the first plays
    latencies = set(range(0, HORIZON * DT, MS // 2))
    latencies |= {k * DT + d for k in range(1, HORIZON + 1) for d in (-LEAD, -1, 0, 1)}
    sent = 0
    for latency in sorted(latencies):
        ex = ChunkExecutor(
            action_spaces=('jp',),
            blending=mode,
            ensemble_m=0.0,
            lookahead=lookahead,
            min_lead_ns=LEAD,
            blend_joints=('j0',),
        )
        assert ex.receive(_chunk(1, T0 - 2 * DT), T0 - 2 * DT) is None
        assert _refusals(ex, T0 - 2 * DT) == []
        stamp = T0 + DT
        arrival = stamp + latency
        reason = ex.receive(_chunk(2, stamp), arrival)
        room = stamp + HORIZON * DT - arrival
        if mode == 'latest':
            assert reason is None if room > 0 else reason == 'ended_before_arrival'
        elif room >= LEAD:
            assert reason is None, (latency, reason)
        else:
            assert reason == ('ends_within_lead' if room > 0 else 'ended_before_arrival')
        assert _refusals(ex, arrival) == [], latency
        sent += ex.counts.actions_executed
    assert sent > len(latencies)


def test_an_action_due_within_the_lead_is_dropped_and_the_next_one_sent():
    ex = ChunkExecutor(
        action_spaces=('jp',), blending='aligned', ensemble_m=0.0, lookahead=False,
        min_lead_ns=LEAD,
    )  # fmt: skip
    ex.receive(_chunk(1, T0), T0 + DT - MS)  # 1 ms before action 0's end
    command = ex.tick(T0 + DT - MS)
    assert command.reached_ns == (T0 + 2 * DT,)  # action 1, at its own time
    np.testing.assert_array_equal(command.rows[0], [12.0, 13.0])
    assert ex.next_tick_ns(T0 + DT - MS) == T0 + 2 * DT  # action 1 is not sent twice
