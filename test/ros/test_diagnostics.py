"""/diagnostics statuses: names, keys, levels and hardware ids, without a node."""

from __future__ import annotations

import dataclasses

import pytest
from builtin_interfaces.msg import Time

from vla_sched.ipc.messages import EngineStats, RobotStats
from vla_sched.ros import diagnostics as d
from vla_sched.ros.engine_link import DEAD, READY, STARTING, EngineView
from vla_sched.ros.node_config import DiagnosticsConfig
from vla_sched.ros.robot_slot import RobotView

CFG = DiagnosticsConfig(queue_warn_threshold=4, rate_warn_fraction=0.8, silent_robot_s=3.0)


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
        target_rate_hz=10.0,
        action_rate_hz=9.5,
        rate_judged=True,
        stamp_to_publish_ms_p50=40.0,
        stamp_to_publish_ms_p99=80.0,
        num_chunks=100,
        num_deadline_misses=1,
        num_superseded=7,
        num_refused_window=0,
        refused_by_reason={'deadline_missed': 1},
        last_error='',
        silent_s=0.1,
        seen_image=True,
    )
    fields.update(overrides)
    return RobotView(**fields)


def test_healthy_scheduler_is_ok_with_every_key_in_order():
    data = d.scheduler_data(_engine(), CFG, hardware_id='/vla_sched')
    assert data.name == 'vla_sched: scheduler' and data.level == d.OK
    assert data.hardware_id == '/vla_sched'
    values = dict(data.values)
    assert [k for k, _ in data.values] == list(d.SCHEDULER_KEYS)
    assert values['waiting queue depth'] == '2'
    assert values['running batch size'] == '3'
    assert values['chunked request'] == 'robot_1#7'
    assert values['retracts total'] == '5' and values['retracts in window'] == '0'
    assert values['aborts by reason'] == 'deadline_missed=1, kv_pool_full=2'
    assert values['delayed prefills'] == '4'
    assert values['KV pool use (%)'] == '37.5'
    assert values['radix cache hit rate'] == '0.625'
    assert values['engine step latency (arrival to finish) p50 (ms)'] == '11.00'
    assert values['engine step latency (arrival to finish) p99 (ms)'] == '19.50'
    assert values['inter-token latency p50 (ms)'] == '3.25'
    assert values['inter-token latency p99 (ms)'] == '7.75'
    assert values['engine heartbeat age (s)'] == '0.10'
    assert values['engine pid'] == '4242'
    assert 'random weights' in values['model']


def test_retracts_in_the_window_turn_the_scheduler_warn():
    data = d.scheduler_data(_engine(stats=_stats(num_retracts_window=2)), CFG, hardware_id='x')
    assert data.level == d.WARN and '2 retracts' in data.message


def test_a_queue_above_its_threshold_turns_the_scheduler_warn():
    data = d.scheduler_data(_engine(stats=_stats(num_waiting=5)), CFG, hardware_id='x')
    assert data.level == d.WARN and '5 steps waiting' in data.message
    data = d.scheduler_data(_engine(stats=_stats(num_waiting=4)), CFG, hardware_id='x')
    assert data.level == d.OK


def test_dead_engine_is_error_and_reports_no_stale_statistics():
    view = _engine(DEAD, last_error='no heartbeat for 1.02 s', restart_in_s=0.5)
    data = d.scheduler_data(view, CFG, hardware_id='x')
    assert data.level == d.ERROR
    assert 'no heartbeat for 1.02 s' in data.message and 'restart in 0.5 s' in data.message
    values = dict(data.values)
    assert values['engine state'] == 'dead'
    assert values['waiting queue depth'] == 'n/a' and values['stats age (s)'] == 'n/a'
    assert [k for k, _ in data.values] == list(d.SCHEDULER_KEYS)


def test_starting_engine_is_warn():
    data = d.scheduler_data(_engine(STARTING, stats=None), CFG, hardware_id='x')
    assert data.level == d.WARN and 'starting' in data.message


def test_healthy_robot_is_ok_with_every_key_and_its_id_as_hardware_id():
    data = d.robot_data(_robot(), _robot_stats(), CFG)
    assert data.name == 'vla_sched: robot r1' and data.hardware_id == 'r1'
    assert data.level == d.OK
    assert [k for k, _ in data.values] == list(d.ROBOT_KEYS)
    values = dict(data.values)
    assert values['action rate (Hz)'] == '9.50' and values['target rate (Hz)'] == '10.00'
    assert values['latency (image stamp to publish) p50 (ms)'] == '40.0'
    assert values['latency (image stamp to publish) p99 (ms)'] == '80.0'
    assert values['deadline misses'] == '1' and values['superseded observations'] == '7'
    # what only the engine knows about the robot
    assert values['cached session prefix tokens'] == '40' and values['retracts'] == '3'
    assert values['engine time to first token (arrival to first token) p50 (ms)'] == '21.50'
    assert values['inter-token latency p50 (ms)'] == '2.25'
    assert values['inter-token latency p99 (ms)'] == '6.50'
    assert values['last error'] == 'none'


def test_silent_robot_is_error():
    data = d.robot_data(_robot(silent_s=3.5), None, CFG)
    assert data.level == d.ERROR and 'no image for 3.5 s' in data.message
    data = d.robot_data(_robot(silent_s=4.0, seen_image=False, num_chunks=0), None, CFG)
    assert data.level == d.ERROR and 'since start-up' in data.message
    assert dict(data.values)['seconds since last image'] == 'never'


def test_rate_below_target_is_warn_only_once_judged():
    slow = _robot(action_rate_hz=7.9)
    assert d.robot_data(slow, None, CFG).level == d.WARN
    assert d.robot_data(dataclasses.replace(slow, rate_judged=False), None, CFG).level == d.OK
    assert d.robot_data(_robot(action_rate_hz=8.0), None, CFG).level == d.OK


def test_recent_refusal_is_warn_with_the_last_error():
    view = _robot(num_refused_window=2, last_error="malformed_image: encoding '16UC1'")
    data = d.robot_data(view, None, CFG)
    assert data.level == d.WARN and "encoding '16UC1'" in data.message
    assert dict(data.values)['last error'] == "malformed_image: encoding '16UC1'"


def test_diagnostic_array_holds_the_scheduler_then_each_robot():
    robots = [_robot(robot_id='r1'), _robot(robot_id='r2', silent_s=9.0)]
    msg = d.diagnostic_array(_engine(), robots, CFG, stamp=Time(sec=5), hardware_id='/n')
    assert [s.name for s in msg.status] == d.status_names(['r1', 'r2'])
    assert [s.level for s in msg.status] == [b'\x00', b'\x00', b'\x02']
    assert msg.header.stamp.sec == 5
    assert all(s.hardware_id for s in msg.status)
    # the engine's per-robot counters reach the robot they belong to
    r1 = {kv.key: kv.value for kv in msg.status[1].values}
    r2 = {kv.key: kv.value for kv in msg.status[2].values}
    assert (r1['retracts'], r2['retracts']) == ('3', 'n/a')
    assert (r1['inter-token latency p99 (ms)'], r2['inter-token latency p99 (ms)']) == (
        '6.50',
        'n/a',
    )


def test_without_engine_stats_a_robots_engine_numbers_are_unknown():
    data = d.robot_data(_robot(), None, CFG)
    assert [k for k, _ in data.values] == list(d.ROBOT_KEYS)
    values = dict(data.values)
    assert all(values[key] == 'n/a' for key in d.ENGINE_ROBOT_KEYS)
    assert values['latency (image stamp to publish) p99 (ms)'] == '80.0'


@pytest.mark.parametrize('robot_id', ['robot_0', 'arm_left', 'R2'])
def test_robot_status_names_follow_the_documented_pattern(robot_id):
    assert d.robot_status_name(robot_id) == f'vla_sched: robot {robot_id}'


def test_scheduler_status_says_what_the_prompt_layout_lets_the_cache_share():
    values = dict(d.scheduler_data(_engine(), CFG, hardware_id='x').values)
    assert values['prompt layout'] == 'image first: frames share only BOS'
    values = dict(d.scheduler_data(_engine(prompt_layout=''), CFG, hardware_id='x').values)
    assert values['prompt layout'] == 'n/a'
