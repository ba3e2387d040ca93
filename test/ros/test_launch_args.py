"""The launch arguments are checked before any process starts: every bad value is refused
with a message naming its argument, good values pass converted."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from vla_sched.ros.launch_args import (
    LaunchArgumentError,
    check_launch_arguments,
    chunk_executors,
    ros_package_installed,
    sim_robots,
)

ROOT = Path(__file__).resolve().parents[2]
PARAMS = str(ROOT / 'config' / 'vla_sched.yaml')
ANALYZERS = str(ROOT / 'config' / 'diagnostics_analyzers.yaml')


def _values(**changes: str) -> dict[str, str]:
    values = {
        'params_file': PARAMS,
        'namespace': '',
        'num_sim_robots': '0',
        'sim_rate': '10.0',
        'start_aggregator': 'false',
        'analyzers_file': ANALYZERS,
        'use_sim_time': 'false',
        'log_level': 'info',
    }
    values.update(changes)
    return values


def _installed(name: str) -> bool:
    return name == 'diagnostic_aggregator'


def test_the_launch_files_defaults_pass():
    args = check_launch_arguments(_values(), package_installed=_installed)
    assert (args.num_sim_robots, args.sim_rate_hz, args.start_aggregator) == (0, 10.0, False)
    assert args.params_file == Path(PARAMS) and args.namespace == ''
    assert (args.use_sim_time, args.log_level) == (False, 'info')


def test_good_values_pass_converted():
    args = check_launch_arguments(
        _values(num_sim_robots='4', sim_rate='2.5', start_aggregator='True', namespace='/gpu0'),
        package_installed=_installed,
    )
    assert (args.num_sim_robots, args.sim_rate_hz, args.start_aggregator) == (4, 2.5, True)
    assert args.analyzers_file == Path(ANALYZERS) and args.namespace == 'gpu0'
    assert check_launch_arguments(_values(start_aggregator='0')).start_aggregator is False


@pytest.mark.parametrize(
    ('name', 'value', 'message'),
    [
        ('num_sim_robots', '-1', "num_sim_robots must be a non-negative integer, got '-1'"),
        ('num_sim_robots', 'two', "num_sim_robots must be a non-negative integer, got 'two'"),
        ('num_sim_robots', '1.5', 'num_sim_robots must be a non-negative integer'),
        ('num_sim_robots', '', 'num_sim_robots must be a non-negative integer'),
        ('sim_rate', '0', "sim_rate must be a positive number (Hz), got '0'"),
        ('sim_rate', '-3', 'sim_rate must be a positive number'),
        ('sim_rate', 'fast', 'sim_rate must be a positive number'),
        ('sim_rate', 'nan', 'sim_rate must be a positive number'),
        ('sim_rate', 'inf', 'sim_rate must be a positive number'),
        ('start_aggregator', 'yes', "start_aggregator must be true or false, got 'yes'"),
        ('use_sim_time', 'sim', "use_sim_time must be true or false, got 'sim'"),
        ('log_level', 'verbose', 'log_level must be one of debug, info, warn, error, fatal'),
        ('robot_ids', '', 'robot_ids must be distinct robot ids'),
        ('robot_ids', 'robot_0,0bad', "got 'robot_0,0bad'"),
        ('robot_ids', 'robot_0 robot_0', 'robot_ids must be distinct robot ids'),
        ('params_file', '/nonexistent/params.yaml', "params_file '/nonexistent/params.yaml'"),
        ('params_file', str(ROOT), 'is not a readable file'),
    ],
)
def test_each_bad_value_is_refused_naming_its_argument(name, value, message):
    with pytest.raises(LaunchArgumentError, match='bad launch arguments') as info:
        check_launch_arguments(_values(**{name: value}), package_installed=_installed)
    assert message in str(info.value)


def test_a_params_file_that_is_no_yaml_mapping_is_refused(tmp_path):
    broken = tmp_path / 'broken.yaml'
    broken.write_text('robot_ids: [a, b\n')
    listed = tmp_path / 'list.yaml'
    listed.write_text('- a\n- b\n')
    for path, message in ((broken, 'is not valid YAML'), (listed, 'holds no YAML mapping')):
        with pytest.raises(LaunchArgumentError, match=message):
            check_launch_arguments(_values(params_file=str(path)))


def test_the_aggregator_is_refused_when_its_package_is_missing():
    with pytest.raises(LaunchArgumentError) as info:
        check_launch_arguments(_values(start_aggregator='true'), package_installed=lambda _: False)
    assert 'start_aggregator:=true needs the diagnostic_aggregator package' in str(info.value)
    # not asked for: not looked up
    check_launch_arguments(_values(), package_installed=lambda _: pytest.fail('looked up'))


def test_the_aggregator_needs_a_readable_analyzers_file():
    with pytest.raises(LaunchArgumentError, match=r"analyzers_file '/nonexistent\.yaml'"):
        check_launch_arguments(
            _values(start_aggregator='true', analyzers_file='/nonexistent.yaml'),
            package_installed=_installed,
        )


def test_every_bad_argument_is_named_at_once():
    with pytest.raises(LaunchArgumentError) as info:
        check_launch_arguments(_values(num_sim_robots='-1', sim_rate='0'))
    assert 'num_sim_robots' in str(info.value) and 'sim_rate' in str(info.value)


def test_the_package_lookup_reads_the_ament_index(monkeypatch):
    monkeypatch.setenv('AMENT_PREFIX_PATH', sys.prefix)  # where this environment's ROS lives
    assert ros_package_installed('rclpy')
    assert not ros_package_installed('no_such_package_for_vla_sched')


def test_sim_robots_are_named_and_namespaced_per_robot():
    args = check_launch_arguments({'num_sim_robots': '2', 'sim_rate': '5', 'namespace': ''})
    robots = sim_robots(args)
    assert [(r.node_name, r.namespace) for r in robots] == [
        ('sim_robot_0', '/robot_0'),
        ('sim_robot_1', '/robot_1'),
    ]
    assert robots[1].arguments == ('--robot-id', 'robot_1', '--rate', '5', '--report-period', '5')
    assert sim_robots(check_launch_arguments({'num_sim_robots': '0'})) == []


def test_sim_time_and_log_level_pass_converted():
    args = check_launch_arguments(_values(use_sim_time='True', log_level='DEBUG'))
    assert (args.use_sim_time, args.log_level) == (True, 'debug')


def test_one_chunk_executor_per_robot_in_the_robots_namespace():
    args = check_launch_arguments({'robot_ids': '[robot_0, arm_2]', 'namespace': '/gpu0'})
    assert args.robot_ids == ('robot_0', 'arm_2')
    executors = chunk_executors(args)
    assert [(e.robot_id, e.node_name, e.namespace) for e in executors] == [
        ('robot_0', 'vla_chunk_executor', '/gpu0/robot_0'),
        ('arm_2', 'vla_chunk_executor', '/gpu0/arm_2'),
    ]
    alone = check_launch_arguments({'robot_ids': 'robot_1', 'namespace': ''})
    assert [e.namespace for e in chunk_executors(alone)] == ['/robot_1']
