"""/diagnostics statuses: names, keys, levels, values and hardware ids, without a node."""

from __future__ import annotations

import dataclasses

import pytest
from builtin_interfaces.msg import Time

from vla_sched.ipc.messages import EngineStats, RobotStats
from vla_sched.ros import diagnostic_keys as k
from vla_sched.ros import diagnostics as d
from vla_sched.ros.engine_link import DEAD, READY, STARTING, EngineView
from vla_sched.ros.node_config import DiagnosticsConfig
from vla_sched.ros.robot_slot import RobotView
from vla_sched.ros.text_bounds import MAX_VALUE_CHARS

CFG = DiagnosticsConfig(queue_warn_threshold=4, rate_warn_fraction=0.8, silent_robot_s=3.0)
NODE = '/gpu0/vla_sched'
NAN = float('nan')


def _stats(**overrides) -> EngineStats:
    fields = dict(
        sent_ns=1,
        num_waiting=2,
        num_running=3,
        chunked_rid='robot_1#7',
        num_retracts_total=5,
        num_retracts_window=0,
        num_delayed_prefills=4,
        kv_use_percent=37.5,
        cache_hit_rate=0.625,
        arrival_to_finish_ms_p50=11.0,
        arrival_to_finish_ms_p99=19.5,
        itl_ms_p50=3.25,
        itl_ms_p99=7.75,
        aborts_by_reason={'kv_pool_full': 2, 'deadline_missed': 1},
        robots={'r1': _robot_stats()},
    )
    fields.update(overrides)
    return EngineStats(**fields)


def _robot_stats() -> RobotStats:
    return RobotStats(
        num_retracts=3,
        num_cached_session_prefix_tokens=40,
        ttft_ms_p50=21.5,
        itl_ms_p50=2.25,
        itl_ms_p99=6.5,
    )


def _engine(state: str = READY, **overrides) -> EngineView:
    fields = dict(
        state=state,
        mode='process',
        pid=4242,
        model_name='tiny-vla-v1',
        random_weights=True,
        prompt_layout='image first: frames share only BOS',
        heartbeat_age_s=0.1,
        state_age_s=2.0,
        num_restarts=0,
        restart_attempt=0,
        since_restart_s=NAN,
        uptime_s=2.0,
        last_error='',
        restart_in_s=None,
        stats=_stats(),
        stats_age_s=0.3,
    )
    fields.update(overrides)
    return EngineView(**fields)


def _robot(**overrides) -> RobotView:
    fields = dict(
        robot_id='r1',
        window_s=5.0,
        target_rate_hz=10.0,
        action_rate_hz=9.5,
        image_rate_hz=10.0,
        rate_judged=True,
        stamp_to_publish_ms_p50=40.0,
        stamp_to_publish_ms_p95=70.0,
        stamp_to_publish_ms_p99=80.0,
        publish_jitter_ms_p99=4.5,
        num_chunks=100,
        num_deadline_misses=1,
        num_superseded=7,
        num_chunks_all_past=2,
        num_all_past_window=0,
        all_past_cause='',
        placeholder_joint_names=(),
        num_refused_window=0,
        refused_by_reason={'deadline_missed': 1},
        last_error='',
        last_error_age_s=NAN,
        since_last_chunk_s=0.05,
        silent_s=0.1,
        state_age_s=0.02,
        seen_image=True,
    )
    fields.update(overrides)
    return RobotView(**fields)


ROBOT_KEYS = k.robot_keys(5.0)


def _sched(view: EngineView, **kwargs) -> d.StatusData:
    return d.scheduler_data(view, CFG, node_name=NODE, **kwargs)


def _rob(view: RobotView, stats: RobotStats | None = None) -> d.StatusData:
    return d.robot_data(view, stats, CFG, node_name=NODE)


def test_healthy_scheduler_is_ok_with_every_key_in_order():
    data = _sched(_engine())
    assert data.name == '/gpu0/vla_sched: scheduler' and data.level == d.OK
    assert data.hardware_id == NODE
    values = dict(data.values)
    assert [k for k, _ in data.values] == list(k.SCHEDULER_KEYS)
    assert values['waiting queue depth'] == '2'
    assert values['running batch size'] == '3'
    assert values['chunked request'] == 'robot_1#7'
    assert values['retracts total'] == '5' and values['retracts in last 10 s'] == '0'
    assert values['delayed prefills'] == '4'
    assert values['KV pool use (%)'] == '37.5'
    assert values['radix cache hit rate (%)'] == '62.5'
    assert values[k.STEP_LATENCY_P50_KEY] == '11.00'
    assert values[k.STEP_LATENCY_P99_KEY] == '19.50'
    assert values[k.ITL_P50_KEY] == '3.25' and values[k.ITL_P99_KEY] == '7.75'
    assert values['engine heartbeat age (s)'] == '0.10'
    assert values['engine pid'] == '4242'
    assert 'random weights' in values['model']
    assert values['engine restarts'] == '0' and values['engine uptime (s)'] == '2.0'
    assert values['time since last engine restart (s)'] == 'n/a'
    assert values['engine last error'] == 'n/a'


def test_every_value_is_one_number_or_one_word():
    robots = [_robot(refused_by_reason={'deadline_missed': 6, 'engine_unavailable': 181})]
    values = [*_sched(_engine(), robots=robots).values, *_rob(robots[0], _robot_stats()).values]
    free_text = {'model', 'prompt layout', 'chunked request', 'engine last error', 'last error'}
    for key, value in values:
        if key not in free_text:
            assert ' ' not in value and '=' not in value and ',' not in value, (key, value)
        assert value not in ('', 'none', 'never'), (key, value)


def test_counts_by_reason_get_one_key_each():
    values = dict(_sched(_engine()).values)
    assert values['aborts: kv_pool_full'] == '2' and values['aborts: deadline_missed'] == '1'
    assert values['aborts: superseded'] == '0'
    view = _robot(refused_by_reason={'deadline_missed': 6, 'engine_unavailable': 181})
    values = dict(_rob(view).values)
    assert values['refused: deadline_missed'] == '6'
    assert values['refused: engine_unavailable'] == '181'
    assert values['refused: malformed_image'] == '0'


def test_a_reason_this_version_does_not_know_still_gets_its_key():
    data = _rob(_robot(refused_by_reason={'brand_new': 2}))
    keys = [k for k, _ in data.values]
    assert dict(data.values)['refused: brand_new'] == '2'
    assert keys.index('refused: brand_new') == keys.index('refused in last 5 s') - 1


def test_windows_and_units_are_in_the_keys():
    keys = ROBOT_KEYS
    assert 'action rate over 5 s (Hz)' in keys and 'image input rate over 5 s (Hz)' in keys
    assert 'refused in last 5 s' in keys
    assert k.E2E_P99_KEY == 'latency (image stamp to publish) p99 over last 256 chunks (ms)'
    assert k.robot_keys(2.5)[0] == 'action rate over 2.5 s (Hz)'
    for key in (*k.SCHEDULER_KEYS, *keys):
        if {'rate', 'latency', 'time', 'age', 'uptime'} & set(key.split()):
            assert key.endswith(('(Hz)', '(ms)', '(s)', '(%)')), key


def test_the_stated_engine_windows_are_the_engines():
    from vla_sched.core.scheduling.scheduler_config import SchedulerConfig

    config = SchedulerConfig()
    assert config.latency_window_size == k.ENGINE_LATENCY_WINDOW
    assert config.retract_window_ms == k.ENGINE_RETRACT_WINDOW_S * 1000


def test_retracts_in_the_window_turn_the_scheduler_warn():
    data = _sched(_engine(stats=_stats(num_retracts_window=2)))
    assert data.level == d.WARN and data.message.startswith('KV pool full: 2 retracts')


def test_a_queue_above_its_threshold_turns_the_scheduler_warn():
    data = _sched(_engine(stats=_stats(num_waiting=5)))
    assert data.level == d.WARN and '5 steps waiting' in data.message
    assert _sched(_engine(stats=_stats(num_waiting=4))).level == d.OK


def test_dead_engine_is_error_and_reports_no_stale_statistics():
    view = _engine(
        DEAD,
        last_error='no heartbeat for 1.02 s',
        restart_in_s=0.5,
        restart_attempt=3,
        uptime_s=NAN,
    )
    data = _sched(view)
    assert data.level == d.ERROR
    assert data.message == 'engine dead: no heartbeat for 1.02 s; restart in 0.5 s (attempt 3)'
    values = dict(data.values)
    assert values['engine state'] == 'dead' and values['engine uptime (s)'] == 'n/a'
    assert values['waiting queue depth'] == 'n/a' and values['stats age (s)'] == 'n/a'
    assert [k for k, _ in data.values] == list(k.SCHEDULER_KEYS)


def test_starting_engine_is_warn():
    data = _sched(_engine(STARTING, stats=None, uptime_s=NAN))
    assert data.level == d.WARN and data.message.startswith('engine starting')


def test_after_a_crash_the_scheduler_stays_warn_for_a_window_and_shows_when():
    crashed = dict(num_restarts=1, since_restart_s=3.0, last_error='process exited (-9)')
    data = _sched(_engine(STARTING, stats=None, uptime_s=NAN, **crashed))
    assert data.level == d.WARN and 'after a crash: process exited (-9)' in data.message
    data = _sched(_engine(uptime_s=1.5, **crashed))
    assert data.level == d.WARN
    assert data.message.startswith('engine back for 1.5 s after a crash: process exited')
    values = dict(data.values)
    assert values['time since last engine restart (s)'] == '3.0'
    assert values['engine uptime (s)'] == '1.5' and values['engine restarts'] == '1'
    assert _sched(_engine(uptime_s=CFG.window_s, **crashed)).level == d.OK


def test_a_node_without_an_engine_says_which_lifecycle_state_keeps_it_idle():
    for state, until in (
        ('unconfigured', 'configured and activated'),
        ('finalized', 'serves no more steps'),
    ):
        data = _sched(d.stopped_engine('process'), lifecycle_state=state)
        assert data.level == d.WARN and data.message.startswith(f'{state}: ')
        assert until in data.message and data.message.endswith('; no engine')
        assert [k for k, _ in data.values] == list(k.SCHEDULER_KEYS)
        values = dict(data.values)
        assert values[k.LIFECYCLE_STATE_KEY] == state and values[k.ENGINE_STATE_KEY] == 'stopped'
        assert values['engine pid'] == 'n/a' and values['waiting queue depth'] == 'n/a'
    failed = d.stopped_engine('process', last_error="engine.model_path '/m': no config.json")
    data = _sched(failed, lifecycle_state='unconfigured')
    assert data.message.endswith("; no engine (engine.model_path '/m': no config.json)")
    assert dict(data.values)['engine last error'].startswith('engine.model_path')


def test_an_inactive_node_is_warn_with_its_engine_and_a_dead_engine_stays_error():
    data = _sched(_engine(), lifecycle_state='inactive')
    assert data.level == d.WARN
    assert data.message == (
        'inactive: every step is refused until the node is activated; engine ready'
    )
    assert dict(data.values)[k.LIFECYCLE_STATE_KEY] == 'inactive'
    assert dict(data.values)['waiting queue depth'] == '2'  # the engine still reports
    dead = _engine(DEAD, last_error='process exited (-9)', uptime_s=NAN)
    assert _sched(dead, lifecycle_state='inactive').level == d.ERROR
    assert dict(_sched(_engine()).values)[k.LIFECYCLE_STATE_KEY] == 'active'


def test_a_robot_of_a_node_that_is_not_active_is_not_served():
    view = _robot(num_refused_window=4, last_error='inactive: node inactive', action_rate_hz=0)
    data = d.robot_data(view, None, CFG, node_name=NODE, lifecycle_state='inactive')
    assert data.level == d.WARN
    assert data.message == 'not served: node inactive (4 refused in the last 5 s)'
    silent = _robot(silent_s=10.0)  # what the robot itself lacks comes first
    assert d.robot_data(silent, None, CFG, node_name=NODE, lifecycle_state='inactive').level == (
        d.ERROR
    )


def test_the_worst_robot_is_named_with_its_latency_and_misses():
    stats = _stats(robots={'r1': _robot_stats(), 'r2': RobotStats(itl_ms_p99=30.0)})
    robots = [_robot(robot_id='r1'), _robot(robot_id='r2', num_deadline_misses=9)]
    values = dict(_sched(_engine(stats=stats), robots=robots).values)
    assert values['worst robot'] == 'r2'
    assert values['worst robot inter-token latency p99 (ms)'] == '30.00'
    assert values['worst robot deadline misses'] == '9'
    values = dict(_sched(_engine(stats=_stats(robots={}))).values)
    assert values['worst robot'] == 'n/a'


def test_healthy_robot_is_ok_with_every_key_and_a_unique_hardware_id():
    data = _rob(_robot(), _robot_stats())
    assert data.name == '/gpu0/vla_sched: robot r1' and data.hardware_id == '/gpu0/vla_sched/r1'
    assert data.level == d.OK
    assert [k for k, _ in data.values] == list(ROBOT_KEYS)
    values = dict(data.values)
    assert values['action rate over 5 s (Hz)'] == '9.50' and values['target rate (Hz)'] == '10.00'
    assert values['image input rate over 5 s (Hz)'] == '10.00'
    assert values['time since last chunk (s)'] == '0.05'
    assert values[k.E2E_P50_KEY] == '40.0' and values[k.E2E_P99_KEY] == '80.0'
    assert values[k.E2E_P95_KEY] == '70.0' and values[k.PUBLISH_JITTER_KEY] == '4.5'
    assert values[k.all_past_window_key(5.0)] == '0'
    assert values['deadline misses'] == '1' and values['superseded observations'] == '7'
    assert values[k.STATE_AGE_KEY] == '0.02' and values[k.ALL_PAST_KEY] == '2'
    assert values['refused: stale_state'] == '0'
    # what only the engine knows about the robot
    assert values['cached session prefix tokens'] == '40' and values['retracts'] == '3'
    assert values[k.TTFT_P50_KEY] == '21.50'
    assert values[k.ITL_P50_KEY] == '2.25' and values[k.ITL_P99_KEY] == '6.50'
    assert values['last error'] == 'n/a' and values['time since last error (s)'] == 'n/a'


def test_a_robot_refused_for_a_stale_state_warns_with_the_cause_first():
    data = _rob(
        _robot(
            num_refused_window=3,
            refused_by_reason={'stale_state': 3},
            last_error='stale_state: joint state is 2.000 s old',
            last_error_age_s=0.1,
            state_age_s=2.0,
        )
    )
    assert data.level == d.WARN
    assert data.message.startswith('stale_state: joint state is 2.000 s old (3 refused')
    values = dict(data.values)
    assert values['refused: stale_state'] == '3' and values[k.STATE_AGE_KEY] == '2.00'


def test_a_robot_without_a_state_shows_no_state_age():
    assert dict(_rob(_robot(state_age_s=NAN)).values)[k.STATE_AGE_KEY] == 'n/a'


def test_step_latency_and_publish_jitter_keys_say_their_ends_statistic_and_units():
    assert ROBOT_KEYS.index(k.E2E_P50_KEY) + 1 == ROBOT_KEYS.index(k.E2E_P95_KEY)
    assert ROBOT_KEYS.index(k.E2E_P95_KEY) + 1 == ROBOT_KEYS.index(k.E2E_P99_KEY)
    assert k.E2E_P95_KEY == 'latency (image stamp to publish) p95 over last 256 chunks (ms)'
    assert k.PUBLISH_JITTER_KEY == (
        'chunk publish jitter (p99 of |interval between chunks - period_s|) over last 256 '
        'chunks (ms)'
    )
    values = dict(_rob(_robot(publish_jitter_ms_p99=NAN)).values)
    assert values[k.PUBLISH_JITTER_KEY] == 'n/a'  # fewer than two chunks


def test_chunks_arriving_with_nothing_left_turn_the_robot_warn_with_the_cause():
    view = _robot(
        num_chunks_all_past=422,
        num_all_past_window=50,
        all_past_cause='latency 118.0 ms > horizon x dt 100 ms',
    )
    data = _rob(view)
    assert data.level == d.WARN
    assert data.message == (
        'latency 118.0 ms > horizon x dt 100 ms: 50 chunks with no action left to execute in '
        'the last 5 s'
    )
    values = dict(data.values)
    assert values[k.ALL_PAST_KEY] == '422' and values[k.all_past_window_key(5.0)] == '50'
    # the same total long ago, none in the window: OK again
    assert _rob(_robot(num_chunks_all_past=422)).level == d.OK


def test_placeholder_joint_names_sent_to_a_trajectory_controller_are_warn():
    data = _rob(_robot(placeholder_joint_names=('a0', 'a1', 'a2')))
    assert data.level == d.WARN
    assert data.message == (
        'joint names a0..a2 sent to a JointTrajectoryController are placeholders: set '
        'robots.r1.action_joint_names to its joints'
    )


def test_silent_robot_is_error():
    data = _rob(_robot(silent_s=3.5))
    assert data.level == d.ERROR and data.message == 'silent: no image for 3.5 s'


def test_a_robot_that_never_sent_an_image_is_stale_not_error():
    data = _rob(_robot(silent_s=40.0, seen_image=False, num_chunks=0))
    assert data.level == d.STALE and data.message.startswith('waiting for first image')
    assert dict(data.values)['time since last image (s)'] == 'n/a'


def test_rate_below_target_is_warn_only_once_judged():
    slow = _robot(action_rate_hz=7.9)
    assert _rob(slow).level == d.WARN
    assert _rob(dataclasses.replace(slow, rate_judged=False)).level == d.OK
    assert _rob(_robot(action_rate_hz=8.0)).level == d.OK


def test_a_slow_camera_and_a_slow_node_read_differently():
    camera = _rob(_robot(action_rate_hz=2.0, image_rate_hz=2.0))
    node = _rob(_robot(action_rate_hz=3.0, image_rate_hz=10.0, since_last_chunk_s=0.9))
    assert camera.message.startswith('camera too slow: actions 2.00 Hz, images 2.00 Hz')
    assert node.message.startswith('node too slow: actions 3.00 Hz, images 10.00 Hz')
    assert 'last chunk 0.9 s ago' in node.message


def test_recent_refusal_is_warn_with_the_cause_first():
    view = _robot(
        num_refused_window=8, last_error="malformed_image: encoding '16UC1'", last_error_age_s=1.25
    )
    data = _rob(view)
    assert data.level == d.WARN
    assert data.message == "malformed_image: encoding '16UC1' (8 refused in the last 5 s)"
    values = dict(data.values)
    assert values['last error'] == "malformed_image: encoding '16UC1'"
    assert values['time since last error (s)'] == '1.25'


def test_an_over_long_error_is_bounded_in_the_values_and_the_message():
    error = 'invalid_state: joint_states lacks configured joints; it has unknown joints '
    error += str([f'joint_{i}' for i in range(10_000)])
    data = _rob(_robot(num_refused_window=1, last_error=error, last_error_age_s=0.1))
    values = dict(data.values)
    assert len(values['last error']) <= MAX_VALUE_CHARS and 'chars in all' in values['last error']
    assert values['last error'].startswith('invalid_state: joint_states lacks')
    assert len(data.message) <= MAX_VALUE_CHARS
    msg = d.to_message(data)
    assert sum(len(kv.key) + len(kv.value) for kv in msg.values) < 10_000


def test_diagnostic_array_holds_the_scheduler_then_each_robot():
    robots = [_robot(robot_id='r1'), _robot(robot_id='r2', silent_s=9.0)]
    msg = d.diagnostic_array(_engine(), robots, CFG, stamp=Time(sec=5), node_name=NODE)
    assert [s.name for s in msg.status] == k.status_names(NODE, ['r1', 'r2'])
    assert [s.level for s in msg.status] == [b'\x00', b'\x00', b'\x02']
    assert msg.header.stamp.sec == 5
    assert len({s.hardware_id for s in msg.status}) == 3
    # the engine's per-robot counters reach the robot they belong to
    r1 = {kv.key: kv.value for kv in msg.status[1].values}
    r2 = {kv.key: kv.value for kv in msg.status[2].values}
    assert (r1['retracts'], r2['retracts']) == ('3', 'n/a')
    assert (r1[k.ITL_P99_KEY], r2[k.ITL_P99_KEY]) == ('6.50', 'n/a')


def test_without_engine_stats_a_robots_engine_numbers_are_unknown():
    data = _rob(_robot())
    assert [k for k, _ in data.values] == list(ROBOT_KEYS)
    values = dict(data.values)
    assert all(values[key] == 'n/a' for key in k.ENGINE_ROBOT_KEYS)
    assert values[k.E2E_P99_KEY] == '80.0'


@pytest.mark.parametrize('node', ['/vla_sched', '/gpu0/vla_sched'])
@pytest.mark.parametrize('robot_id', ['robot_0', 'arm_left', 'R2', 'scheduler'])
def test_status_names_carry_the_node_and_the_robot(node, robot_id):
    assert k.robot_status_name(node, robot_id) == f'{node}: robot {robot_id}'
    assert k.is_scheduler_status(k.scheduler_status_name(node))
    assert not k.is_scheduler_status(k.robot_status_name(node, robot_id))


def test_scheduler_status_says_what_the_prompt_layout_lets_the_cache_share():
    values = dict(_sched(_engine()).values)
    assert values['prompt layout'] == 'image first: frames share only BOS'
    values = dict(_sched(_engine(prompt_layout='')).values)
    assert values['prompt layout'] == 'n/a'


def test_a_dead_engine_shows_its_next_restart_and_attempt_and_a_running_one_none():
    dead = _sched(_engine(DEAD, restart_in_s=4.0, restart_attempt=3, stats=None, uptime_s=NAN))
    values = dict(dead.values)
    assert values[k.NEXT_RESTART_KEY] == '4.0' and values[k.RESTART_ATTEMPT_KEY] == '3'
    values = dict(_sched(_engine()).values)
    assert values[k.NEXT_RESTART_KEY] == 'n/a' and values[k.RESTART_ATTEMPT_KEY] == '0'


def test_bad_frames_are_shown_both_ways_and_unknown_without_engine_stats():
    view = _engine(num_bad_frames=2, stats=_stats(num_bad_frames_received=3))
    values = dict(_sched(view).values)
    assert values['bad frames from the engine'] == '2'
    assert values['bad frames from the node'] == '3'
    values = dict(_sched(_engine(STARTING, num_bad_frames=2, stats=None)).values)
    assert values['bad frames from the engine'] == '2'
    assert values['bad frames from the node'] == 'n/a'


def test_steps_the_engine_never_answered_are_named_as_the_cause_not_the_node():
    view = _robot(
        action_rate_hz=1.0,
        num_refused_window=3,
        refused_by_reason={'engine_timeout': 3},
        last_error='engine_timeout: the engine did not answer this step 0.20 s past its deadline',
        last_error_age_s=0.5,
    )
    data = _rob(view)
    assert data.level == d.WARN
    assert data.message.startswith('engine_timeout: the engine did not answer')
    assert 'engine not answering: actions 1.00 Hz' in data.message
    assert 'node too slow' not in data.message
    assert dict(data.values)['refused: engine_timeout'] == '3'
