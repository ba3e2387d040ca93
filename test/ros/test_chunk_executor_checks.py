"""No ActionChunk stops the chunk executor: every field is checked before a chunk is kept, a
bad one is skipped and counted by reason, and whatever arrives, nothing invalid is played."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from vla_sched.msg import ActionChunk
from vla_sched.ros.chunk_checks import ChunkRefusedError, chunk_from_message, dt_ns_of
from vla_sched.ros.chunk_executor import ChunkExecutor
from vla_sched.ros.chunk_executor_config import ChunkExecutorConfig
from vla_sched.ros.chunk_executor_node import chunk_rules, sink_messages, take_chunk
from vla_sched.ros.conversions import ns_to_stamp, stamp_to_ns

pytestmark = pytest.mark.slow  # seconds or more: not in the fast tier

S = 1_000_000_000
NOW = 1_000 * S
EE_NAMES = ('x', 'y', 'z', 'roll', 'pitch', 'yaw', 'gripper')
TWIST = ChunkExecutorConfig(sink='twist', publish_gripper=True)
TRAJECTORY = ChunkExecutorConfig()


def _message(
    *,
    dt: float = 0.1,
    rows: np.ndarray | None = None,
    names: tuple[str, ...] = EE_NAMES,
    action_space: str = 'ee_delta',
    stamp_ns: int = NOW,
    budget_ns: int = S // 4,
) -> ActionChunk:
    rows = np.zeros((4, len(names))) if rows is None else np.asarray(rows)
    msg = ActionChunk(robot_id='arm', step_seq=1, horizon=rows.shape[0], dof=rows.shape[1])
    msg.header.stamp = ns_to_stamp(stamp_ns)
    msg.dt = dt
    msg.actions = rows.astype(np.float32).reshape(-1)
    msg.joint_names = list(names)
    msg.action_space = action_space
    msg.deadline = ns_to_stamp(stamp_ns + budget_ns)
    return msg


def _executor(config: ChunkExecutorConfig) -> ChunkExecutor:
    return ChunkExecutor(
        action_spaces=config.action_spaces,
        blending=config.blending,
        ensemble_m=config.ensemble_m,
        lookahead=config.trajectory_points == 'remaining',
        max_stamp_skew_ns=round(config.max_stamp_skew_s * S),
    )


@pytest.mark.parametrize(
    ('fields', 'reason'),
    [
        ({'dt': math.inf}, 'bad_dt'),
        ({'dt': math.nan}, 'bad_dt'),
        ({'dt': 3e38}, 'bad_dt'),
        ({'dt': 0.0}, 'bad_dt'),
        ({'dt': -0.1}, 'bad_dt'),
        ({'dt': 1e-9}, 'bad_dt'),
        ({'rows': np.zeros((4, 3)), 'names': EE_NAMES[:3]}, 'bad_columns'),
        ({'rows': np.zeros((4, 6)), 'names': EE_NAMES[:6]}, 'bad_columns'),  # no gripper
        ({'rows': np.zeros((4, 0)), 'names': ()}, 'bad_shape'),
        ({'rows': np.zeros((0, 7))}, 'bad_shape'),
        ({'rows': np.zeros((4, 7)), 'names': EE_NAMES[:6]}, 'bad_shape'),
        ({'names': ('x',) * 7}, 'bad_columns'),
        ({'names': ('', *EE_NAMES[1:])}, 'bad_columns'),
        ({'rows': np.full((4, 7), np.inf)}, 'non_finite'),
        ({'action_space': 'joint_position'}, 'action_space'),
    ],
)
def test_a_bad_field_is_refused_with_its_reason(fields, reason):
    with pytest.raises(ChunkRefusedError) as refused:
        chunk_from_message(_message(**fields), chunk_rules(TWIST))
    assert refused.value.reason == reason


def test_a_message_whose_sizes_disagree_is_refused_as_bad_shape():
    msg = _message()
    msg.horizon = 3_000_000_000  # horizon * dof far beyond the values it holds
    with pytest.raises(ChunkRefusedError, match='horizon 3000000000') as refused:
        chunk_from_message(msg, chunk_rules(TWIST))
    assert refused.value.reason == 'bad_shape'


@pytest.mark.parametrize('dt', [math.inf, 3e38, math.nan])
def test_a_chunk_the_executor_once_died_on_is_skipped_and_the_next_one_plays(dt):
    executor, rules = _executor(TWIST), chunk_rules(TWIST)
    assert not take_chunk(executor, rules, _message(dt=dt), NOW)
    three_columns = _message(rows=np.zeros((4, 3)), names=EE_NAMES[:3])
    assert not take_chunk(executor, rules, three_columns, NOW)
    assert executor.counts.skipped['bad_dt'] == executor.counts.skipped['bad_columns'] == 1
    assert take_chunk(executor, rules, _message(rows=np.ones((4, 7))), NOW + 1)
    sent = sink_messages(executor.tick(NOW + 1), TWIST)
    assert sent.twist.twist.linear.x == pytest.approx(10.0) and sent.gripper.data == 1.0


def test_a_chunk_stamped_a_minute_ahead_is_skipped_and_does_not_block_the_next():
    executor, rules = _executor(TWIST), chunk_rules(TWIST)
    ahead = _message(stamp_ns=NOW + 60 * S, budget_ns=S)
    assert not take_chunk(executor, rules, ahead, NOW)
    assert executor.counts.last_skip[0] == 'future_stamp'
    assert executor.counts.skipped['future_stamp'] == 1
    # within the tolerated clock skew (1 s), a chunk stamped ahead is kept
    assert take_chunk(executor, rules, _message(stamp_ns=NOW + S // 2), NOW)
    assert take_chunk(executor, rules, _message(stamp_ns=NOW + S // 2 + 1), NOW + 10)


def test_dt_is_read_to_the_microsecond_and_never_raises():
    assert dt_ns_of(np.float32(0.2)) == 200_000_000
    assert dt_ns_of(math.inf) is None and dt_ns_of(math.nan) is None


# --- the property: random chunks, any configuration -----------------------------------------

_SPACES = ('joint_position', 'ee_delta', 'joint_delta', '', 'x' * 300)
_NAMES = ('x', 'y', 'z', 'roll', 'pitch', 'yaw', 'gripper', '', 'j0')
_f32 = st.floats(width=32, allow_nan=True, allow_infinity=True)
_dt = st.one_of(
    _f32, st.sampled_from([0.0, 1e-4, 1e-5, 0.1, 0.25, 10.0, 10.5]), st.floats(1e-4, 10.0)
)


@st.composite
def _messages(draw, config: ChunkExecutorConfig) -> tuple[ActionChunk, int]:
    """A random ActionChunk and the gap before it arrives: a chunk ``config`` plays, with
    each field replaced by a hostile one now and then."""

    def hostile(name: str) -> bool:
        return draw(st.integers(0, 4), label=f'hostile {name}') == 0

    space = config.action_spaces[0]
    if hostile('action_space'):
        space = draw(st.sampled_from(_SPACES))
    horizon = draw(st.integers(0, 5) if hostile('horizon') else st.integers(1, 5))
    dof = draw(st.integers(0, 8) if hostile('dof') else st.integers(config.min_columns, 8))
    num_values = draw(st.integers(0, 45)) if hostile('values') else horizon * dof
    num_names = draw(st.integers(0, 9)) if hostile('names') else dof
    element = _f32 if hostile('finite') else st.floats(-2.0, 2.0, width=32)
    values = draw(st.lists(element, min_size=num_values, max_size=num_values))
    names = [*EE_NAMES, 'j1', 'j2'][:num_names]
    if hostile('name'):
        names = draw(st.lists(st.sampled_from(_NAMES), min_size=num_names, max_size=num_names))
    msg = ActionChunk(robot_id='arm', step_seq=draw(st.integers(0, 2**64 - 1)))
    msg.horizon, msg.dof = horizon, dof
    msg.dt = draw(_dt if hostile('dt') else st.floats(1e-3, 0.5))
    msg.actions = np.asarray(values, dtype=np.float32)
    msg.joint_names = names
    msg.action_space = space
    offset_ns = draw(st.integers(-S, S // 10))
    if hostile('stamp'):
        offset_ns = draw(st.one_of(st.integers(-NOW, 120 * S), st.just(60 * S)))
    msg.header.stamp = ns_to_stamp(NOW + offset_ns)
    if hostile('stamp edges'):  # stamps at the edges of builtin_interfaces/Time
        msg.header.stamp.sec = draw(st.integers(-(2**31), 2**31 - 1))
        msg.header.stamp.nanosec = draw(st.integers(0, 2**32 - 1))
    budget_ns = draw(st.integers(S // 2, 2 * S))
    if hostile('deadline'):
        budget_ns = draw(st.one_of(st.integers(-S, 2 * S), st.integers(0, 10**6 * S)))
    latest_ns = (2**31 - 1) * S  # the latest builtin_interfaces/Time
    msg.deadline = ns_to_stamp(min(stamp_to_ns(msg.header.stamp) + budget_ns, latest_ns))
    gap_ns = draw(st.integers(0, S // 2))
    return msg, gap_ns


def _playable(msg: ActionChunk, config: ChunkExecutorConfig, now_ns: int) -> bool:
    """Whether the chunk may be played, judged from the message alone."""
    dt = float(msg.dt)
    values = np.asarray(msg.actions, dtype=np.float64)
    names = list(msg.joint_names)
    return (
        msg.action_space in config.action_spaces
        and math.isfinite(dt)
        and config.min_chunk_dt_s - 1e-6 <= dt <= config.max_chunk_dt_s + 1e-6
        and msg.horizon >= 1
        and msg.dof >= max(1, config.min_columns)
        and len(values) == msg.horizon * msg.dof == msg.horizon * len(names)
        and all(names)
        and len(set(names)) == len(names)
        and bool(np.all(np.isfinite(values)))
        and stamp_to_ns(msg.header.stamp) <= now_ns + round(config.max_stamp_skew_s * S)
        and now_ns <= stamp_to_ns(msg.deadline)
    )


_configs = st.builds(
    ChunkExecutorConfig,
    sink=st.sampled_from(['joint_trajectory', 'twist', 'none']),
    blending=st.sampled_from(['off', 'temporal_ensemble']),
    trajectory_points=st.sampled_from(['current', 'remaining']),
).map(
    lambda c: ChunkExecutorConfig(
        sink=c.sink,
        publish_gripper=c.sink != 'joint_trajectory',
        blending=c.blending,
        trajectory_points=c.trajectory_points,
    )
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(config=_configs, data=st.data())
def test_random_chunks_never_raise_and_nothing_invalid_is_played(config, data):
    arrivals = data.draw(st.lists(_messages(config), min_size=1, max_size=6), label='arrivals')
    executor, rules = _executor(config), chunk_rules(config)
    now = NOW
    for msg, gap_ns in arrivals:
        now += gap_ns
        if take_chunk(executor, rules, msg, now):
            assert _playable(msg, config, now), msg
            event('a chunk was kept')
        else:
            event(f'skipped: {executor.counts.last_skip[0]}')
        command = executor.tick(now)
        if command is None:
            continue
        event('a command was sent')
        assert command.action_space in config.action_spaces
        assert command.rows.shape[1] >= config.min_columns
        assert np.all(np.isfinite(command.rows))
        assert all(r > now for r in command.reached_ns)
        sent = sink_messages(command, config)  # builds every message the sinks get
        if sent.twist is not None:
            twist = sent.twist.twist
            assert all(math.isfinite(v) for v in (twist.linear.x, twist.angular.z))
        for point in sent.trajectory.points if sent.trajectory is not None else ():
            assert stamp_to_ns(point.time_from_start) > 0
        due = executor.next_tick_ns(now)
        assert due is None or due > now
    counts = executor.counts
    assert counts.actions_executed >= 0 and all(n >= 0 for n in counts.skipped.values())
