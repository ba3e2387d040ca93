"""The safety gate without ROS: each check refuses what breaks it, clipping moves a chunk within
the limits (or refuses it when it cannot), a chunk is never kept unchecked, and the limits
come from the URDF with the parameter entries laid over them."""

from __future__ import annotations

import math

import numpy as np
import pytest

from vla_sched.ros.chunk_executor import Chunk, ChunkExecutor
from vla_sched.ros.chunk_executor_config import ChunkExecutorConfig
from vla_sched.ros.node_config import ConfigError
from vla_sched.ros.safety_gate import SafetyGate, clipped, first_violation
from vla_sched.ros.urdf_limits import (
    JointLimits,
    combined_limits,
    limit_entries,
    urdf_joint_limits,
)

MS = 1_000_000
T0 = 1_000 * MS
DT = 100 * MS
JOINTS = ('j0', 'j1')
LIMITS = {
    'j0': JointLimits(lower=-1.0, upper=1.0, velocity=2.0, acceleration=10.0),
    'j1': JointLimits(lower=-3.0, upper=3.0, velocity=1.0, acceleration=math.inf),
}
BOUNDS = {
    field: np.array([getattr(LIMITS[j], field) for j in JOINTS])
    for field in ('lower', 'upper', 'velocity', 'acceleration')
}
URDF = """<?xml version="1.0"?>
<robot name="arm">
  <link name="base"/><link name="l1"/><link name="l2"/><link name="l3"/><link name="l4"/>
  <joint name="shoulder" type="revolute"><parent link="base"/><child link="l1"/>
    <limit lower="-2.5" upper="2.5" velocity="1.5" effort="10"/></joint>
  <joint name="wrist" type="continuous"><parent link="l1"/><child link="l2"/>
    <limit velocity="3.0" effort="5"/></joint>
  <joint name="slide" type="prismatic"><parent link="l2"/><child link="l3"/>
    <limit upper="0.4" velocity="0.2" effort="50"/></joint>
  <joint name="tool" type="fixed"><parent link="l3"/><child link="l4"/></joint>
</robot>
"""


def _chunk(rows, *, stamp_ns: int = T0) -> Chunk:
    return Chunk(1, stamp_ns, DT, stamp_ns + DT, np.asarray(rows, float), JOINTS, 'jp', '')


def _gate(mode: str = 'refuse', measured=(0.0, 0.0)) -> SafetyGate:
    gate = SafetyGate(mode=mode, limits=LIMITS, max_state_age_ns=500 * MS)
    gate.measure(JOINTS, measured, T0)
    return gate


@pytest.mark.parametrize(
    ('rows', 'reason'),
    [
        ([[0.1, 0.0], [1.2, 0.0]], 'velocity_limit'),  # also past j0's upper limit: see below
        ([[0.1, 0.0], [0.2, 3.5]], 'position_limit'),
        ([[0.5, 0.0], [0.5, 0.0]], 'start_jump'),  # 0.5 in 100 ms: 5/s over 2/s
        ([[0.0, 0.05], [0.0, 0.2]], 'velocity_limit'),  # j1 at 1.5/s over 1/s
        ([[0.0, 0.0], [0.0, 0.0], [0.15, 0.0]], 'acceleration_limit'),  # 0 -> 1.5/s in 0.1 s
    ],
)
def test_each_check_refuses_what_breaks_it(rows, reason):
    gate = _gate()
    verdict = gate(_chunk(rows), 0, T0)
    if reason == 'velocity_limit' and rows[1][0] > 1:
        reason = 'position_limit'  # positions are checked first
    assert verdict.actions is None and verdict.detail.startswith(reason)
    assert gate.refused[reason] == 1 and sum(gate.refused.values()) == 1


def test_a_chunk_within_the_limits_passes_unchanged():
    rows = [[0.1, 0.05], [0.25, 0.1], [0.45, 0.15]]
    verdict = _gate()(_chunk(rows), 0, T0)
    np.testing.assert_array_equal(verdict.actions, rows)


def test_the_start_jump_is_allowed_the_time_until_the_first_action_is_reached():
    # arriving 50 ms into a 100 ms action: the jump still gets dt (at least)
    assert _gate()(_chunk([[0.2, 0.0]]), 0, T0 + 50 * MS).actions is not None
    # an action reached in 300 ms may be 0.6 away at 2/s, not one reached in 250 ms
    chunk = _chunk([[0.0, 0.0], [0.0, 0.0], [0.55, 0.0]], stamp_ns=T0 - 200 * MS)
    timing = {'measured': np.zeros(2), 'dt_s': 0.1}
    assert first_violation(chunk.actions[2:], JOINTS, BOUNDS, start_s=0.3, **timing) is None
    too_far = first_violation(chunk.actions[2:], JOINTS, BOUNDS, start_s=0.25, **timing)
    assert too_far.reason == 'start_jump'


def test_only_the_actions_still_to_play_are_checked():
    rows = [[5.0, 0.0], [0.1, 0.0]]  # action 0 is past by the time it arrives
    gate = _gate()
    assert gate(_chunk(rows, stamp_ns=T0 - DT), 1, T0).actions is not None


@pytest.mark.parametrize(
    'rows',
    [
        [[0.9, 0.0], [1.5, 0.4], [2.0, 0.0]],
        [[-0.3, 0.0], [0.3, -0.2], [-0.3, 0.2], [0.3, -0.2]],
        [[0.0, 0.0], [0.1, 0.0], [0.3, 0.0], [0.6, 0.0]],
    ],
)
def test_clipping_moves_a_chunk_within_every_limit(rows):
    gate = _gate('clip')
    verdict = gate(_chunk(rows), 0, T0)
    assert verdict.actions is not None and sum(gate.clipped.values()) == 1
    again = first_violation(
        verdict.actions, JOINTS, BOUNDS, measured=np.zeros(2), start_s=0.1, dt_s=0.1
    )
    assert again is None
    assert not np.array_equal(verdict.actions, rows)


def test_a_chunk_clipping_cannot_fix_is_refused():
    # measured far outside j0's limits: no first action within them is reachable in time
    gate = _gate('clip', measured=(3.0, 0.0))
    verdict = gate(_chunk([[0.9, 0.0], [0.9, 0.0]]), 0, T0)
    assert verdict.actions is None and 'clipped, still' in verdict.detail
    assert sum(gate.refused.values()) == 1 and sum(gate.clipped.values()) == 0


def test_clipped_steps_from_the_measured_position():
    bounds = {
        'lower': np.array([-10.0]),
        'upper': np.array([10.0]),
        'velocity': np.array([1.0]),
        'acceleration': np.array([np.inf]),
    }
    out = clipped(np.array([[1.0], [2.0]]), bounds, measured=np.zeros(1), start_s=0.1, dt_s=0.1)
    np.testing.assert_allclose(out[:, 0], [0.1, 0.2])


def test_no_state_a_stale_state_or_a_joint_without_limits_is_refused():
    gate = SafetyGate(mode='clip', limits=LIMITS, max_state_age_ns=500 * MS)
    assert gate(_chunk([[0.0, 0.0]]), 0, T0).detail.startswith('no_joint_state')
    gate.measure(JOINTS, [0.0, math.nan], T0)  # a NaN position is not a measurement
    assert gate(_chunk([[0.0, 0.0]]), 0, T0).detail.startswith('no_joint_state')
    gate.measure(JOINTS, [0.0, 0.0], T0)
    assert gate(_chunk([[0.0, 0.0]]), 0, T0 + 501 * MS).detail.startswith('stale_joint_state')
    other = Chunk(1, T0, DT, T0 + DT, np.zeros((1, 2)), ('j0', 'elbow'), 'jp', '')
    assert gate(other, 0, T0).detail.startswith('no_limits')
    assert [gate.refused[r] for r in ('no_joint_state', 'stale_joint_state', 'no_limits')] == [
        2,
        1,
        1,
    ]


def test_the_executor_keeps_nothing_the_gate_refused_and_plays_what_it_clipped():
    ex = ChunkExecutor(action_spaces=('jp',), blending='aligned', ensemble_m=0.0, lookahead=True)
    assert ex.receive(_chunk([[0.5, 0.0]]), T0, gate=_gate()) == 'safety_gate'
    assert ex.counts.skipped['safety_gate'] == 1 and ex.tick(T0) is None
    assert 'start_jump' in ex.counts.last_skip[1]
    assert ex.receive(_chunk([[0.5, 0.0], [0.6, 0.0]]), T0, gate=_gate('clip')) is None
    np.testing.assert_allclose(ex.tick(T0).rows, [[0.2, 0.0], [0.4, 0.0]])


def test_the_safe_position_is_checked_against_the_limits_and_the_time_to_reach_it():
    gate = _gate()
    assert gate.check_target(JOINTS, np.array([0.5, 1.0]), 2.0, T0).actions is not None
    assert gate.check_target(JOINTS, np.array([0.5, 1.0]), 0.5, T0).actions is None  # j1 2/s
    assert gate.check_target(JOINTS, np.array([1.5, 0.0]), 9.0, T0).actions is None


def test_the_urdf_gives_position_and_velocity_limits_of_its_moving_joints():
    limits = urdf_joint_limits(URDF)
    assert limits == {
        'shoulder': JointLimits(-2.5, 2.5, 1.5),
        'wrist': JointLimits(velocity=3.0),
        'slide': JointLimits(0.0, 0.4, 0.2),  # URDF's lower defaults to 0
    }


def test_entries_are_laid_over_the_urdf_field_by_field():
    entries = limit_entries(('shoulder acceleration=4 upper=2.0', 'j9 velocity=1'))
    limits = combined_limits(urdf_joint_limits(URDF), entries)
    assert limits['shoulder'] == JointLimits(-2.5, 2.0, 1.5, 4.0)
    assert limits['j9'] == JointLimits(velocity=1.0)


@pytest.mark.parametrize(
    ('fields', 'message'),
    [
        ({'robot_description': '<robot><joint'}, 'not XML'),
        ({'robot_description': '<sdf/>'}, 'not a URDF'),
        ({'joint_limits': ('j0 speed=1',)}, 'is not one of'),
        ({'joint_limits': ('j0 velocity=fast',)}, 'not a number'),
        ({'joint_limits': ('j0 lower=1 upper=0',)}, 'above upper'),
        ({'joint_limits': ('j0 velocity=1', 'j0 upper=1')}, 'twice'),
        ({'safety_gate': 'refuse', 'sink': 'twist'}, 'checks joint_position chunks'),
        ({'starvation_action': 'safe_position'}, 'needs safe_position entries'),
        (
            {
                'starvation_action': 'safe_position',
                'safe_position': ('j0=2.0',),
                'joint_limits': ('j0 upper=1.0',),
            },
            'outside its limits',
        ),
        ({'starvation_action': 'safe_position', 'safe_position': ('j0',)}, "not 'joint="),
        ({'blend_joints': ('j0', 'gripper')}, 'a gripper is never blended'),
    ],
)
def test_bad_limits_and_settings_are_configuration_errors(fields, message):
    with pytest.raises(ConfigError, match=message):
        ChunkExecutorConfig(**fields)
