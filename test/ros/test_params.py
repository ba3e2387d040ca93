"""Parameters: validation, the documented YAML file, and declaring them on a real node."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import rclpy
import yaml
from rclpy.parameter import Parameter

from vla_sched.engine.config import EngineConfig, EngineConfigError, EngineLinkConfig
from vla_sched.ros import given_parameters, parameters
from vla_sched.ros.node_config import (
    ConfigError,
    DiagnosticsConfig,
    FrontendConfig,
    RobotConfig,
)
from vla_sched.settings import settings_of

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


def _file_tree() -> dict:
    return yaml.safe_load(PARAMS_FILE.read_text())['/**']['ros__parameters']


def _file_values() -> dict:
    return _flatten(_file_tree())


def _as_declared(value):
    """A YAML value as the parameters hold it (lists become tuples)."""
    return tuple(value) if isinstance(value, list) else value


# The file serves four robots as an example; its robots.<id> sections are examples too.
EXAMPLE_PARAMS = {'robot_ids'}


def test_the_params_file_documents_every_node_parameter_with_its_default():
    file_values = {k: v for k, v in _file_values().items() if not k.startswith('robots.')}
    specs = {s.name: s for s in parameters.node_specs()}
    assert set(file_values) == set(specs)
    wrong = {}
    for name, spec in specs.items():
        value = _as_declared(file_values[name])
        if name not in EXAMPLE_PARAMS and (
            value != spec.default or type(value) is not type(spec.default)
        ):
            wrong[name] = (file_values[name], spec.default)
    assert wrong == {}


def test_each_robot_section_of_the_params_file_lists_exactly_the_robot_parameters():
    robots = _file_tree()['robots']
    assert robots, 'the file should show at least one robots.<id> section'
    for robot_id, section in robots.items():
        expected = {s.name for s in parameters.robot_specs(robot_id, {})}
        assert {f'robots.{robot_id}.{key}' for key in section} == expected, robot_id


def test_every_dataclass_setting_is_declared_with_its_default():
    specs = {s.name: s for s in parameters.all_specs(['r'], {})}
    config = FrontendConfig(robots=(RobotConfig('r'),))
    for holder in (config, config.engine, config.link, config.diagnostics):
        for setting in settings_of(type(holder)):
            if setting.group:  # the others are filled in by the node
                assert specs.pop(setting.label).default == getattr(holder, setting.name)
    for setting in settings_of(RobotConfig):
        default = getattr(config.robot('r'), setting.name)
        assert specs.pop(f'robots.r.{setting.name}').default == default
        if setting.name != 'namespace':  # each robot has its own
            assert specs.pop(f'robot_defaults.{setting.name}').default == default
    assert set(specs) == {'robot_ids', 'autostart'}  # the parameters no dataclass holds


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
    values = {s.name: s.default for s in parameters.node_specs()}
    values.update(_file_values())
    defaults = {
        k.split('.', 1)[1]: v for k, v in values.items() if k.startswith('robot_defaults.')
    }
    for spec in parameters.all_specs(values['robot_ids'], defaults):
        values.setdefault(spec.name, spec.default)
    values = {
        name: parameters.check_value(spec, values[name])
        for spec in parameters.all_specs(values['robot_ids'], defaults)
        for name in [spec.name]
    }
    config = parameters.config_from_values(values)
    assert [r.robot_id for r in config.robots] == ['robot_0', 'robot_1', 'robot_2', 'robot_3']
    assert config.robot('robot_0').priority == 1
    assert config.robot('robot_1').state_joint_names == ()
    engine = config.engine_config()
    assert EngineConfig.from_mapping(engine.to_mapping()) == engine  # as the link carries it
    assert engine.robots == {}  # priorities travel only when priority scheduling is on
    assert engine.stats_period_s == config.diagnostics.period_s
    assert engine.max_instruction_bytes == config.max_instruction_bytes
    assert engine.late_policy == config.late_policy
    with_priority = dataclasses.replace(config.engine, enable_priority=True)
    engine = dataclasses.replace(config, engine=with_priority).engine_config()
    assert engine.robots == {
        'robot_0': {'priority': 1},
        **{f'robot_{i}': {'priority': 0} for i in (1, 2, 3)},
    }
    cropping = dataclasses.replace(config.robot('robot_2'), center_crop=True)
    robots = tuple(cropping if r.robot_id == 'robot_2' else r for r in config.robots)
    engine = dataclasses.replace(config, robots=robots).engine_config()
    assert engine.robots == {'robot_2': {'center_crop': True}}  # crops travel on their own
    assert engine.robot_center_crop('robot_2') and not engine.robot_center_crop('robot_0')


@pytest.mark.parametrize(
    ('fields', 'message'),
    [
        ({'robot_id': '0bad'}, 'must start with a letter'),
        ({'robot_id': 'a', 'trigger': 'sometimes'}, 'robots.a.trigger'),
        ({'robot_id': 'a', 'period_s': 0.0}, r'robots\.a\.period_s must be in \[0\.001, 60'),
        ({'robot_id': 'a', 'priority': 1.5}, r'robots\.a\.priority must be int'),
        ({'robot_id': 'a', 'state_joint_names': ['j']}, 'must be a list of strings'),
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
        (
            {'robot_id': 'a', 'publish_twist': True, 'action_space': 'joint_position'},
            r'robots\.a\.publish_twist needs action_space ee_delta',
        ),
        (
            {'robot_id': 'a', 'publish_gripper': True, 'action_space': 'joint_delta'},
            r'robots\.a\.publish_gripper needs action_space ee_delta',
        ),
        ({'robot_id': 'a', 'joint_trajectory_start': 'later'}, 'robots.a.joint_trajectory_start'),
        (
            {'robot_id': 'a', 'max_state_age_s': -0.1},
            r'robots\.a\.max_state_age_s must be in \[0\.0, 60',
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
    with pytest.raises(EngineConfigError, match=r'below engine\.heartbeat_timeout_s'):
        EngineLinkConfig(heartbeat_period_s=1.0, heartbeat_timeout_s=1.0)
    with pytest.raises(
        ConfigError, match=r"engine settings \['late_policy'\] are set by the node"
    ):
        FrontendConfig(robots=(RobotConfig('a'),), engine=EngineConfig(late_policy='deliver_late'))
    with pytest.raises(ConfigError, match=r"\['robots'\] are set by the node"):
        FrontendConfig(robots=(RobotConfig('a'),), engine=EngineConfig(robots={'a': {}}))
    with pytest.raises(EngineConfigError, match='fcfs or lof'):
        EngineConfig(enable_priority=True, policy='lpm')
    with pytest.raises(
        ConfigError, match=r'diagnostics\.rate_warn_fraction must be in \[0\.01, 1\.0\]'
    ):
        DiagnosticsConfig(rate_warn_fraction=1.5)
    with pytest.raises(ConfigError, match=r'deadlines\.late_policy must be one of'):
        FrontendConfig(robots=(RobotConfig('a'),), late_policy='never')


def _default_values(robot_ids=('robot_0',)) -> dict:
    return {s.name: s.default for s in parameters.all_specs(robot_ids, {})}


def _other_value(setting):
    """A valid value of ``setting`` other than its default."""
    if isinstance(setting.default, bool):
        return not setting.default
    if setting.choices:
        return next(c for c in reversed(setting.choices) if c != setting.default)
    if setting.min_value is not None:
        return type(setting.default)(setting.max_value)
    return setting.default + 1 if isinstance(setting.default, int) else f'{setting.default}x'


def test_every_parameter_reaches_its_field_of_the_config():
    specs = parameters.node_specs()
    values = _default_values()
    values.update({s.name: _other_value(s.setting) for s in specs if s.name != 'robot_ids'})
    values.update({s.name: _other_value(s.setting) for s in parameters.robot_specs('robot_0', {})})
    # the largest image and the longest instruction do not fit one transport frame together
    values['limits.max_image_pixels'] = 5120 * 4096
    values['robots.robot_0.namespace'] = 'ns_0'
    values['robots.robot_0.state_joint_names'] = ('j0',)
    values['robots.robot_0.action_joint_names'] = ('a0',)
    values['robots.robot_0.camera_topics'] = ('camera/image_raw', 'wrist/image_raw')
    values['robots.robot_0.action_space'] = 'joint_position'  # publish_joint_trajectory is on
    for name in EE_DELTA_OUTPUTS:  # they need ee_delta: reached on their own below
        values[f'robots.robot_0.{name}'] = False
    config = parameters.config_from_values(values)
    for holder in (config, config.engine, config.link, config.diagnostics):
        for setting in settings_of(type(holder)):
            if setting.group:
                assert getattr(holder, setting.name) == values[setting.label], setting.label
    robot = config.robot('robot_0')
    for setting in settings_of(RobotConfig):
        assert getattr(robot, setting.name) == values[f'robots.robot_0.{setting.name}']
    values = _default_values()
    values.update({f'robots.robot_0.{name}': True for name in EE_DELTA_OUTPUTS})
    robot = parameters.config_from_values(values).robot('robot_0')
    assert all(getattr(robot, name) is True for name in EE_DELTA_OUTPUTS)


EE_DELTA_OUTPUTS = ('publish_twist', 'publish_gripper')


def test_inconsistent_engine_parameters_fail_as_config_errors_naming_them():
    values = _default_values()
    values.update({'scheduler.enable_priority': True, 'scheduler.policy': 'lpm'})
    with pytest.raises(ConfigError, match=r'scheduler\.enable_priority works with policy fcfs'):
        parameters.config_from_values(values)


def test_action_names_default_to_ee_delta_names_and_must_match_the_checkpoint():
    assert RobotConfig('a').action_names(7)[0] == 'x'
    assert RobotConfig('a', action_space='joint_delta').action_names(2) == ('a0', 'a1')
    with pytest.raises(ConfigError, match='has 1 names but the checkpoint returns 7'):
        RobotConfig('a', action_joint_names=('j',)).action_names(7)


def test_the_arms_outputs_need_their_columns_of_the_actions():
    assert RobotConfig('a', publish_twist=True).action_names(6) == tuple(f'a{j}' for j in range(6))
    with pytest.raises(ConfigError, match=r'publish_twist needs at least 6 values .* returns 5'):
        RobotConfig('a', publish_twist=True).action_names(5)
    assert RobotConfig('a', publish_gripper=True).action_names(7)[6] == 'gripper'
    with pytest.raises(ConfigError, match=r'publish_gripper needs the gripper in column 6'):
        RobotConfig('a', publish_gripper=True).action_names(6)


def test_check_value_normalises_lists_and_refuses_wrong_types_and_ranges():
    specs = {s.name: s for s in parameters.node_specs()}
    assert parameters.check_value(specs['robot_defaults.state_joint_names'], None) == ()
    assert parameters.check_value(specs['robot_defaults.state_joint_names'], ['a']) == ('a',)
    assert parameters.check_value(specs['deadlines.step_budget_s'], 2) == 2.0
    with pytest.raises(ConfigError, match='must be a list of strings'):
        parameters.check_value(specs['robot_defaults.action_joint_names'], [1, 2])
    with pytest.raises(ConfigError, match=r'scheduler\.policy must be one of'):
        parameters.check_value(specs['scheduler.policy'], 'random')
    with pytest.raises(ConfigError, match=r'diagnostics.period_s must be in \[0.05'):
        parameters.check_value(specs['diagnostics.period_s'], 0.0)
    with pytest.raises(ConfigError, match=r'scheduler\.page_size must be int'):
        parameters.check_value(specs['scheduler.page_size'], 1.5)


def test_descriptors_carry_the_range_choices_and_read_only_flag_of_their_setting():
    specs = {s.name: s for s in parameters.all_specs(['r'], {})}
    for name, spec in specs.items():
        setting, desc = spec.setting, parameters.descriptor(spec)
        assert desc.description == setting.description, name
        assert desc.read_only == (not setting.runtime), name
        assert all(choice in desc.additional_constraints for choice in setting.choices), name
        ranges = [(r.from_value, r.to_value) for r in desc.floating_point_range]
        ranges += [(r.from_value, r.to_value) for r in desc.integer_range]
        expected = [] if setting.min_value is None else [(setting.min_value, setting.max_value)]
        assert ranges == expected, name
    page = parameters.descriptor(specs['scheduler.page_size'])
    assert (page.integer_range[0].from_value, page.integer_range[0].to_value) == (1, 1024)
    assert page.read_only
    period = parameters.descriptor(specs['robots.r.period_s'])
    assert period.floating_point_range[0].from_value == pytest.approx(0.001)
    assert not period.read_only
    late = parameters.descriptor(specs['deadlines.late_policy'])
    assert late.additional_constraints == 'one of: drop, deliver_late'
    assert parameters.descriptor(specs['robot_ids']).dynamic_typing


def test_only_a_robots_instruction_and_period_may_change_at_run_time():
    assert set(parameters.RUNTIME_ROBOT_PARAMS) == {'instruction', 'period_s'}
    specs = parameters.all_specs(['r'], {})
    writable = {s.name for s in specs if not parameters.descriptor(s).read_only}
    assert {n for n in writable if n.startswith('robots.')} == {
        'robots.r.instruction',
        'robots.r.period_s',
    }
    assert all(n.startswith(('robots.', 'robot_defaults.')) for n in writable)


@pytest.fixture
def context():
    ctx = rclpy.Context()
    yield ctx
    ctx.try_shutdown()


def _node(context, args=(), overrides=()):
    rclpy.init(args=['test', '--ros-args', *args], context=context)
    return rclpy.create_node('vla_sched', context=context, parameter_overrides=list(overrides))


def _declare_and_read(node, args=(), overrides=()):
    """``declare_and_read`` told what the node was given, as the node tells it."""
    return parameters.declare_and_read(
        node, command_line=['test', '--ros-args', *args], overrides=overrides
    )


def test_the_shipped_params_file_loads_on_a_node(context):
    node = _node(context, ['--params-file', str(PARAMS_FILE)])
    config = parameters.declare_and_read(node)
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
    config = parameters.declare_and_read(node)
    a, b = config.robot('a'), config.robot('b')
    assert (a.period_s, b.period_s) == (0.25, 0.5)
    assert (a.trigger, b.trigger) == ('periodic', 'on_image')
    assert a.state_joint_names == b.state_joint_names == ('j1', 'j2')
    node.destroy_node()


def test_a_bad_parameter_value_fails_start_up_naming_it(context):
    node = _node(context, overrides=[Parameter('robots.robot_0.trigger', value='never')])
    with pytest.raises(ConfigError, match=r'robots\.robot_0\.trigger must be one of'):
        parameters.declare_and_read(node)
    node.destroy_node()


def test_runtime_changes_are_validated_then_applied(context):
    node = _node(context)
    config = parameters.declare_and_read(node)
    applied = []
    node.add_on_set_parameters_callback(
        parameters.runtime_validator(config, lambda *change: applied.append(change))
    )
    ok = node.set_parameters([Parameter('robots.robot_0.instruction', value=' wave ')])
    assert ok[0].successful and applied == [('robot_0', 'instruction', 'wave')]
    too_long = 'x' * (config.max_instruction_bytes + 1)
    bad = node.set_parameters([Parameter('robots.robot_0.instruction', value=too_long)])
    assert not bad[0].successful and 'bytes' in bad[0].reason
    bad = node.set_parameters([Parameter('robots.robot_0.period_s', value=-1.0)])
    assert not bad[0].successful
    for empty in ('', '   '):
        bad = node.set_parameters([Parameter('robots.robot_0.instruction', value=empty)])
        assert not bad[0].successful
        assert bad[0].reason == 'robots.robot_0.instruction: instruction is empty'
    assert node.get_parameter('robots.robot_0.instruction').value == ' wave '
    frozen = node.set_parameters([Parameter('scheduler.page_size', value=32)])
    assert not frozen[0].successful
    assert len(applied) == 1
    node.destroy_node()


def test_a_misspelled_parameter_fails_start_up_naming_the_closest_names(context):
    args = ['-p', 'engine.modle_path:=/m', '-p', 'scheduler.page_sise:=8']
    node = _node(context, args)
    with pytest.raises(ConfigError) as info:
        _declare_and_read(node, args)
    message = str(info.value)
    assert message.startswith('unknown parameters: ')
    assert 'engine.modle_path (closest: engine.model_path' in message
    assert 'scheduler.page_sise (closest: scheduler.page_size' in message
    node.destroy_node()


def test_a_section_for_a_robot_not_in_robot_ids_fails_start_up(context):
    overrides = [
        Parameter('robot_ids', value=['arm_a']),
        Parameter('robots.arm_b.period_s', value=0.2),
    ]
    node = _node(context, overrides=overrides)
    with pytest.raises(ConfigError) as info:
        _declare_and_read(node, overrides=overrides)
    assert (
        "robots.arm_b.period_s (arm_b is not in robot_ids ['arm_a']; "
        'closest: robots.arm_a.period_s'
    ) in str(info.value)
    node.destroy_node()


def test_a_params_file_keyed_by_another_node_fails_start_up(context, tmp_path):
    path = tmp_path / 'other.yaml'
    path.write_text(yaml.safe_dump({'other_node': {'ros__parameters': {'robot_ids': ['a']}}}))
    args = ['--params-file', str(path), '-p', 'engine.device:=cpu']
    node = _node(context, args)
    with pytest.raises(ConfigError) as info:
        parameters.declare_and_read(node, command_line=['vla_sched', '--ros-args', *args])
    message = str(info.value)
    assert f"params file(s) ['{path}'] give /vla_sched no parameters" in message
    assert "keyed by ['other_node']" in message and '"/**:"' in message
    node.destroy_node()


def test_the_shipped_params_file_applies_under_a_namespace(context):
    args = ['-r', '__ns:=/gpu0', '--params-file', str(PARAMS_FILE)]
    node = _node(context, args)
    assert node.get_fully_qualified_name() == '/gpu0/vla_sched'
    config = parameters.declare_and_read(node, command_line=['vla_sched', '--ros-args', *args])
    assert [r.robot_id for r in config.robots] == ['robot_0', 'robot_1', 'robot_2', 'robot_3']
    node.destroy_node()


def test_empty_string_lists_are_declared_as_empty_arrays_never_unset(context):
    node = _node(context, ['--params-file', str(PARAMS_FILE)])
    parameters.declare_and_read(node)
    for name in ('robot_defaults.state_joint_names', 'robots.robot_2.action_joint_names'):
        param = node.get_parameter(name)
        assert param.type_ is not Parameter.Type.NOT_SET and list(param.value) == [], name
    assert node.get_parameter('robots.robot_0.state_joint_names').value[0] == 'joint_1'
    node.destroy_node()


def test_the_command_line_reader_finds_params_files_and_set_names():
    argv = ['node', '--params-file', 'outside.yaml', '--ros-args', '--params-file', 'a.yaml']
    argv += ['-p', 'x.y:=1', '--param', 'vla_sched:z:=[a]', '-r', '__ns:=/g', '--', '-p', 'w:=2']
    assert parameters.ros_command_line(argv) == (['a.yaml'], {'x.y', 'z'})
    assert parameters.ros_command_line(['node']) == ([], set())


def test_unknown_names_are_listed_with_close_declared_ones():
    declared = ['engine.model_path', 'robots.a.period_s', 'robot_ids']
    parameters.check_no_unknown(['robot_ids', 'qos_overrides./x.publisher.depth'], declared, ['a'])
    with pytest.raises(ConfigError) as info:
        parameters.check_no_unknown(['zzz', 'robots.b.period_s'], declared, ['a'])
    assert str(info.value) == (
        "unknown parameters: robots.b.period_s (b is not in robot_ids ['a']; closest: "
        'robots.a.period_s); zzz (no declared name is close)'
    )


@pytest.mark.parametrize(
    ('topics', 'match'),
    [
        ((), r'camera_topics must list 1 to 8 topics'),
        (tuple(f'cam_{i}/image_raw' for i in range(9)), r'camera_topics must list 1 to 8'),
        (('camera/image_raw', 'camera/image_raw'), r'camera_topics lists a name twice'),
        (('/camera/image_raw',), r"camera_topics: '/camera/image_raw' is not a topic name"),
        (('camera//image_raw',), r"camera_topics: 'camera//image_raw' is not a topic name"),
    ],
)
def test_camera_topics_must_be_one_to_eight_distinct_relative_names(topics, match):
    with pytest.raises(ConfigError, match=rf'robots\.arm\.{match}'):
        RobotConfig('arm', camera_topics=topics)
    assert RobotConfig('arm').camera_topics == ('camera/image_raw',)


@pytest.mark.parametrize(
    ('key', 'fqn', 'applies'),
    [
        ('/**', '/vla_sched', True),
        ('/**', '/gpu0/vla_sched', True),
        ('vla_sched', '/vla_sched', True),
        ('vla_sched', '/gpu0/vla_sched', False),
        ('/gpu0/vla_sched', '/gpu0/vla_sched', True),
        ('/**/vla_sched', '/vla_sched', True),
        ('/**/vla_sched', '/a/b/vla_sched', True),
        ('/*/vla_sched', '/gpu1/vla_sched', True),
        ('/*/vla_sched', '/vla_sched', False),
        ('other_node', '/vla_sched', False),
    ],
)
def test_a_params_file_section_applies_to_the_nodes_its_key_matches(key, fqn, applies):
    assert given_parameters.node_key_matches(key, fqn) is applies


def test_the_given_names_are_read_from_files_rules_and_overrides(tmp_path):
    path = tmp_path / 'p.yaml'
    path.write_text(
        yaml.safe_dump(
            {
                '/**': {'ros__parameters': {'robots': {'a': {'period_s': 0.5}}}},
                'gpu0': {'vla_sched': {'ros__parameters': {'engine.device': 'cpu'}}},
                'other': {'ros__parameters': {'not_ours': 1}},
            }
        )
    )
    argv = ['n', '--ros-args', '--params-file', str(path), '-p', 'x:=1', '-p', 'other:y:=2']
    argv += ['-p', 'vla_sched:z:=3']
    names = given_parameters.given_names('/gpu0/vla_sched', argv, ['robot_ids'])
    assert names == {'robots.a.period_s', 'engine.device', 'x', 'z', 'robot_ids'}
