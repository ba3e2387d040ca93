"""Parameters: validation, the documented YAML file, and declaring them on a real node."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import rclpy
import yaml
from rclpy.parameter import Parameter

from vla_sched.ipc.engine_config import EngineConfig
from vla_sched.ros import params
from vla_sched.ros.config import (
    ConfigError,
    DiagnosticsConfig,
    EngineLinkConfig,
    FrontendConfig,
    RobotConfig,
)

ROOT = Path(__file__).resolve().parents[2]
PARAMS_FILE = ROOT / 'config' / 'vla_sched.yaml'


def _flatten(tree: dict, prefix: str = '') -> dict:
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(_flatten(value, f'{prefix}{key}.'))
        else:
            out[f'{prefix}{key}'] = value
    return out


def _file_values() -> dict:
    return _flatten(yaml.safe_load(PARAMS_FILE.read_text())['vla_sched']['ros__parameters'])


def test_the_params_file_lists_every_declared_parameter_and_nothing_else():
    declared = {s.name for s in params.node_specs()}
    declared |= {s.name for s in params.robot_specs('robot_0', {})}
    assert set(_file_values()) == declared


def test_every_parameter_in_the_params_file_has_a_comment():
    lines = PARAMS_FILE.read_text().splitlines()
    undocumented = []
    for i, line in enumerate(lines):
        stripped = line.strip()
        if not stripped or stripped.startswith('#') or stripped.endswith(':'):
            continue  # blank, comment, or a section
        # Keys on consecutive lines may share the comment block above the first of them.
        j = i - 1
        while j >= 0 and lines[j].strip() and not lines[j].strip().startswith('#'):
            if lines[j].strip().endswith(':'):
                break  # reached the section header: no comment in between
            j -= 1
        if j < 0 or not lines[j].strip().startswith('#'):
            undocumented.append(stripped)
    assert undocumented == []


def test_the_params_file_builds_a_valid_config_and_engine_settings():
    values = {s.name: s.default for s in params.node_specs()}
    values.update(_file_values())
    defaults = {
        k.split('.', 1)[1]: v for k, v in values.items() if k.startswith('robot_defaults.')
    }
    for spec in params.all_specs(values['robot_ids'], defaults):
        values.setdefault(spec.name, spec.default)
    values = {
        name: params.check_value(spec, values[name])
        for spec in params.all_specs(values['robot_ids'], defaults)
        for name in [spec.name]
    }
    config = params.config_from_values(values)
    assert [r.robot_id for r in config.robots] == ['robot_0', 'robot_1', 'robot_2', 'robot_3']
    assert config.robot('robot_0').priority == 1
    assert config.robot('robot_1').state_joint_names == ()
    engine = EngineConfig.from_mapping(config.engine_config())
    assert engine.robots == {}  # priorities travel only when priority scheduling is on
    assert engine.stats_period_s == config.diagnostics.period_s
    link = dataclasses.replace(config.link, engine={**config.link.engine, 'enable_priority': True})
    engine = EngineConfig.from_mapping(dataclasses.replace(config, link=link).engine_config())
    assert engine.robots == {
        'robot_0': {'priority': 1},
        **{f'robot_{i}': {'priority': 0} for i in (1, 2, 3)},
    }


@pytest.mark.parametrize(
    ('fields', 'message'),
    [
        ({'robot_id': '0bad'}, 'must start with a letter'),
        ({'robot_id': 'a', 'trigger': 'sometimes'}, 'robots.a.trigger'),
        ({'robot_id': 'a', 'period_s': 0.0}, 'robots.a.period_s must be > 0'),
        ({'robot_id': 'a', 'state_joint_names': ('j', 'j')}, 'lists a name twice'),
        ({'robot_id': 'a', 'namespace': 'has space'}, 'not a valid namespace'),
        (
            {'robot_id': 'a', 'publish_joint_trajectory': True, 'action_joint_names': ('j',)},
            'needs action_space joint_position',
        ),
        (
            {'robot_id': 'a', 'publish_joint_trajectory': True, 'action_space': 'joint_position'},
            'needs action_joint_names',
        ),
    ],
)
def test_bad_robot_settings_are_refused_by_name(fields, message):
    with pytest.raises(ConfigError, match=message):
        RobotConfig(**fields)


def test_node_level_settings_are_checked_as_a_whole():
    with pytest.raises(ConfigError, match='robot_ids is empty'):
        FrontendConfig(robots=())
    with pytest.raises(ConfigError, match='lists a robot twice'):
        FrontendConfig(robots=(RobotConfig('a'), RobotConfig('a')))
    with pytest.raises(ConfigError, match='share a namespace'):
        FrontendConfig(robots=(RobotConfig('a'), RobotConfig('b', namespace='a')))
    with pytest.raises(ConfigError, match='below heartbeat_timeout_s'):
        EngineLinkConfig(heartbeat_period_s=1.0, heartbeat_timeout_s=1.0)
    with pytest.raises(ConfigError, match='set by the node'):
        EngineLinkConfig(engine={'robots': {}})
    with pytest.raises(ConfigError, match='fcfs or lof'):
        EngineLinkConfig(engine={'enable_priority': True, 'policy': 'lpm'})
    with pytest.raises(ConfigError, match='rate_warn_fraction must be <= 1'):
        DiagnosticsConfig(rate_warn_fraction=1.5)


def test_action_names_default_to_ee_delta_names_and_must_match_the_checkpoint():
    assert RobotConfig('a').action_names(7)[0] == 'x'
    assert RobotConfig('a', action_space='joint_delta').action_names(2) == ('a0', 'a1')
    with pytest.raises(ConfigError, match='has 1 names but the checkpoint returns 7'):
        RobotConfig('a', action_joint_names=('j',)).action_names(7)


def test_check_value_normalises_lists_and_refuses_wrong_types_and_ranges():
    specs = {s.name: s for s in params.node_specs()}
    assert params.check_value(specs['robot_defaults.state_joint_names'], None) == ()
    assert params.check_value(specs['robot_defaults.state_joint_names'], ['a']) == ('a',)
    assert params.check_value(specs['deadlines.step_budget_s'], 2) == 2.0
    with pytest.raises(ConfigError, match='must be a list of strings'):
        params.check_value(specs['robot_defaults.action_joint_names'], [1, 2])
    with pytest.raises(ConfigError, match=r'scheduler\.policy must be one of'):
        params.check_value(specs['scheduler.policy'], 'random')
    with pytest.raises(ConfigError, match=r'diagnostics.period_s must be in \[0.05'):
        params.check_value(specs['diagnostics.period_s'], 0.0)
    with pytest.raises(ConfigError, match=r'scheduler\.page_size must be int'):
        params.check_value(specs['scheduler.page_size'], 1.5)


@pytest.fixture
def context():
    ctx = rclpy.Context()
    yield ctx
    ctx.try_shutdown()


def _node(context, args=(), overrides=()):
    rclpy.init(args=['test', '--ros-args', *args], context=context)
    return rclpy.create_node('vla_sched', context=context, parameter_overrides=list(overrides))


def test_the_shipped_params_file_loads_on_a_node(context):
    node = _node(context, ['--params-file', str(PARAMS_FILE)])
    config = params.declare_and_read(node)
    assert config.robot('robot_0').state_joint_names[0] == 'joint_1'
    assert config.robot('robot_2').action_joint_names == ()  # '[]' in YAML
    assert config.link.mode == 'process'
    desc = node.describe_parameter('robots.robot_0.period_s')
    assert desc.floating_point_range[0].from_value == pytest.approx(0.001)
    assert desc.description and not desc.read_only
    assert node.describe_parameter('scheduler.page_size').read_only
    node.destroy_node()


def test_robots_inherit_robot_defaults_unless_they_override(context):
    node = _node(
        context,
        overrides=[
            Parameter('robot_ids', value=['a', 'b']),
            Parameter('robot_defaults.period_s', value=0.25),
            Parameter('robot_defaults.state_joint_names', value=['j1', 'j2']),
            Parameter('robots.b.period_s', value=0.5),
            Parameter('robots.b.trigger', value='on_image'),
        ],
    )
    config = params.declare_and_read(node)
    a, b = config.robot('a'), config.robot('b')
    assert (a.period_s, b.period_s) == (0.25, 0.5)
    assert (a.trigger, b.trigger) == ('periodic', 'on_image')
    assert a.state_joint_names == b.state_joint_names == ('j1', 'j2')
    node.destroy_node()


def test_a_bad_parameter_value_fails_start_up_naming_it(context):
    node = _node(context, overrides=[Parameter('robots.robot_0.trigger', value='never')])
    with pytest.raises(ConfigError, match=r'robots\.robot_0\.trigger must be one of'):
        params.declare_and_read(node)
    node.destroy_node()


def test_runtime_changes_are_validated_then_applied(context):
    node = _node(context)
    config = params.declare_and_read(node)
    applied = []
    node.add_on_set_parameters_callback(
        params.runtime_validator(config, lambda *change: applied.append(change))
    )
    ok = node.set_parameters([Parameter('robots.robot_0.instruction', value=' wave ')])
    assert ok[0].successful and applied == [('robot_0', 'instruction', 'wave')]
    too_long = 'x' * (config.max_instruction_bytes + 1)
    bad = node.set_parameters([Parameter('robots.robot_0.instruction', value=too_long)])
    assert not bad[0].successful and 'bytes' in bad[0].reason
    bad = node.set_parameters([Parameter('robots.robot_0.period_s', value=-1.0)])
    assert not bad[0].successful
    frozen = node.set_parameters([Parameter('scheduler.page_size', value=32)])
    assert not frozen[0].successful
    assert len(applied) == 1
    node.destroy_node()
