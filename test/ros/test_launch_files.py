"""The launch files parse, agree with each other, name only installed things, and check
their arguments before any process starts.

launch_ros is not installable here, so the XML file is parsed and the Python files are read
with ``ast``; the argument check itself is tested in test_launch_args.py, and the vla_sched
node's lifecycle bring-up by running vla_sched.launch.py's ``_bring_up`` against stand-ins
for launch and launch_ros that record what they are given. What the package installs is
read from CMakeLists.txt's install rules:
``nodes/*`` to ``lib/vla_sched`` and the ``launch`` and ``config`` folders to
``share/vla_sched``.
"""

from __future__ import annotations

import ast
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml
from launch_stand_ins import bring_up
from lifecycle_msgs.msg import Transition

from vla_sched.ros.launch_args import (
    MANAGED_FLAG,
    LaunchArgumentError,
    check_launch_arguments,
    log_level_arguments,
    sim_robots,
)

ROOT = Path(__file__).resolve().parents[2]
LAUNCH = ROOT / 'launch'
XML_FILE = LAUNCH / 'vla_sched.launch.xml'
PY_FILE = LAUNCH / 'vla_sched.launch.py'
SIM_FILE = LAUNCH / 'sim_robots.launch.py'
EXECUTOR_FILE = LAUNCH / 'chunk_executor.launch.py'
PY_FILES = (PY_FILE, SIM_FILE, EXECUTOR_FILE)
OUR_NODES = {'vla_sched_node': 'vla_sched', 'vla_sim_robot': None}


def installed_share() -> set[str]:
    """Paths under share/vla_sched that the CMake install rules produce."""
    cmake = (ROOT / 'CMakeLists.txt').read_text()
    assert re.search(r'foreach\(share_dir launch config\)', cmake)
    assert 'install(DIRECTORY ${share_dir} DESTINATION share/${PROJECT_NAME})' in cmake
    return {
        str(p.relative_to(ROOT))
        for folder in ('launch', 'config')
        for p in (ROOT / folder).rglob('*')
        if p.is_file()
    }


def installed_executables() -> set[str]:
    cmake = (ROOT / 'CMakeLists.txt').read_text()
    assert 'file(GLOB VLA_SCHED_EXECUTABLES "${CMAKE_CURRENT_SOURCE_DIR}/nodes/*")' in cmake
    assert 'install(PROGRAMS ${VLA_SCHED_EXECUTABLES} DESTINATION lib/${PROJECT_NAME})' in cmake
    return {p.name for p in (ROOT / 'nodes').iterdir() if p.is_file()}


def _share_path(text: str) -> str:
    match = re.fullmatch(r'\$\(find-pkg-share vla_sched\)/(.+)', text)
    assert match, f'not a path in the vla_sched share folder: {text}'
    return match.group(1)


def _py_calls(path: Path, func: str) -> list[ast.Call]:
    tree = ast.parse(path.read_text())
    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and getattr(node.func, 'id', None) == func
    ]


def _node_calls(path: Path) -> list[ast.Call]:
    """The ``Node`` and ``LifecycleNode`` actions of a launch file."""
    return [*_py_calls(path, 'Node'), *_py_calls(path, 'LifecycleNode')]


def _kwargs(call: ast.Call) -> dict[str, ast.expr]:
    return {kw.arg: kw.value for kw in call.keywords}


def _py_share_paths(path: Path) -> set[str]:
    """Paths built as PathJoinSubstitution([share, 'a', 'b'])."""
    out = set()
    for call in _py_calls(path, 'PathJoinSubstitution'):
        parts = call.args[0].elts
        assert isinstance(parts[0], ast.Name) and parts[0].id == 'share'
        out.add('/'.join(p.value for p in parts[1:]))
    return out


def _py_arguments(path: Path) -> dict[str, str]:
    out = {}
    for call in _py_calls(path, 'DeclareLaunchArgument'):
        default = _kwargs(call)['default_value']
        out[call.args[0].value] = default.value if isinstance(default, ast.Constant) else None
    return out


def test_the_xml_launch_file_parses_with_documented_arguments():
    root = ET.parse(XML_FILE).getroot()
    assert root.tag == 'launch'
    args = {el.get('name'): el for el in root.iter('arg') if el.get('default') is not None}
    assert set(args) == {
        'params_file',
        'namespace',
        'num_sim_robots',
        'sim_rate',
        'start_aggregator',
        'analyzers_file',
        'use_sim_time',
        'log_level',
        'autostart',
    }
    assert all(el.get('description') for el in args.values())


def _py_choices(path: Path) -> dict[str, list[str] | None]:
    """Each declared argument's ``choices`` as written (``list(NAME)`` is looked up in
    launch_args), None when it declares none."""
    import vla_sched.ros.launch_args as launch_args

    out = {}
    for call in _py_calls(path, 'DeclareLaunchArgument'):
        choices = _kwargs(call).get('choices')
        if choices is None:
            out[call.args[0].value] = None
            continue
        assert ast.unparse(choices).startswith('list('), ast.unparse(choices)
        out[call.args[0].value] = list(getattr(launch_args, choices.args[0].id))
    return out


@pytest.mark.parametrize('path', PY_FILES)
def test_every_launch_file_offers_sim_time_and_log_level_and_declares_its_choices(path):
    arguments, choices = _py_arguments(path), _py_choices(path)
    assert arguments['use_sim_time'] == 'false' and arguments['log_level'] == 'info'
    assert choices['log_level'] == ['debug', 'info', 'warn', 'error', 'fatal']
    flags = [name for name, default in arguments.items() if default in ('true', 'false')]
    assert 'use_sim_time' in flags
    for name in flags:  # what launch's own boolean handling takes passes launch's choice check
        for word in ('true', 'false', 'True', 'False', 'TRUE', '1', '0'):
            assert choices[name] is None or word in choices[name], (name, word)
            assert check_launch_arguments({name: word}, package_installed=lambda _: True)
    for name, allowed in choices.items():  # every default is among its choices
        assert allowed is None or arguments[name] in allowed, name
    for call in _node_calls(path):
        kwargs = _kwargs(call)
        assert ast.unparse(kwargs['ros_arguments']).startswith(
            'log_level_arguments(args.log_level, '
        )
        params = ast.unparse(kwargs['parameters'])
        assert 'sim_time' in params, params


def test_the_xml_file_declares_the_same_choices():
    root = ET.parse(XML_FILE).getroot()
    xml_choices = {
        el.get('name'): [c.get('value') for c in el.findall('choice')] or None
        for el in root.findall('arg')
    }
    assert xml_choices == _py_choices(PY_FILE)


def test_xml_and_python_launch_files_declare_the_same_arguments_and_defaults():
    root = ET.parse(XML_FILE).getroot()
    xml_args = {el.get('name'): el.get('default') for el in root.findall('arg')}
    py_args = _py_arguments(PY_FILE)
    assert set(xml_args) == set(py_args)
    for name, default in py_args.items():
        if default is not None:  # substitutions are compared through the share paths
            assert xml_args[name] == default, name


def test_the_xml_file_includes_the_python_file_passing_every_argument():
    root = ET.parse(XML_FILE).getroot()
    share = installed_share()
    assert root.findall('node') == []  # its processes start only after the Python checks
    (include,) = root.findall('include')
    assert _share_path(include.get('file')) == 'launch/vla_sched.launch.py'
    passed = {el.get('name'): el.get('value') for el in include.findall('arg')}
    declared = {el.get('name') for el in root.findall('arg')}
    assert passed == {name: f'$(var {name})' for name in declared}
    defaults = [el.get('default') or '' for el in root.iter('arg')]
    paths = [p for p in defaults if p.startswith('$(find-pkg-share')]
    paths += [el.get('file') for el in root.iter('include')]
    assert paths and all(_share_path(p) in share for p in paths)


@pytest.mark.parametrize('path', PY_FILES)
def test_python_launch_files_name_installed_executables_and_files(path):
    share = installed_share()
    executables = installed_executables()
    for call in _node_calls(path):
        kwargs = _kwargs(call)
        if kwargs['package'].value == 'vla_sched':
            assert kwargs['executable'].value in executables
    assert _py_share_paths(path) <= share
    compile(path.read_text(), str(path), 'exec')


def _function(path: Path, name: str) -> ast.FunctionDef:
    tree = ast.parse(path.read_text())
    return next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name)


@pytest.mark.parametrize(
    ('path', 'opaque'),
    [(PY_FILE, '_bring_up'), (SIM_FILE, '_sim_robots'), (EXECUTOR_FILE, '_executors')],
)
def test_python_launch_files_check_their_arguments_before_any_node(path, opaque):
    generate = _function(path, 'generate_launch_description')
    calls = [n for n in ast.walk(generate) if isinstance(n, ast.Call)]
    top_calls = {getattr(n.func, 'id', None) for n in calls}
    assert 'Node' not in top_calls and 'IncludeLaunchDescription' not in top_calls
    assert 'OpaqueFunction' in top_calls
    body = _function(path, opaque).body
    statements = [ast.unparse(stmt) for stmt in body]
    check = next(i for i, text in enumerate(statements) if 'check_launch_arguments(' in text)
    first_node = next(i for i, text in enumerate(statements) if 'Node(' in text)
    assert check < first_node


def test_the_python_launch_file_starts_the_node_with_the_params_file_and_namespace():
    calls = {_kwargs(c)['executable'].value: _kwargs(c) for c in _node_calls(PY_FILE)}
    node = calls['vla_sched_node']
    assert node['name'].value == 'vla_sched'
    # Its autostart parameter stays as given: --managed on its command line makes it wait
    # for the transitions the launch file drives, so a dump of its parameters serves.
    assert [ast.unparse(e) for e in node['parameters'].elts] == [
        'str(args.params_file)',
        'sim_time',
    ]
    assert ast.unparse(node['arguments']) == '[MANAGED_FLAG]'
    assert ast.unparse(node['namespace']) == 'args.namespace'
    assert ast.unparse(calls['aggregator_node']['parameters']) == (
        '[str(args.analyzers_file), sim_time]'
    )
    assert 'if args.start_aggregator:' in ast.unparse(_function(PY_FILE, '_bring_up'))
    assert _py_share_paths(PY_FILE) == {
        'config/vla_sched.yaml',
        'config/diagnostics_analyzers.yaml',
    }


def test_parameter_files_are_keyed_for_the_nodes_the_launch_files_start():
    calls = {_kwargs(c)['executable'].value: _kwargs(c) for c in _node_calls(PY_FILE)}
    params = yaml.safe_load((ROOT / 'config' / 'vla_sched.yaml').read_text())
    analyzers = yaml.safe_load((ROOT / 'config' / 'diagnostics_analyzers.yaml').read_text())
    assert set(params) == {'/**'}  # any namespace and node name
    executor = yaml.safe_load((ROOT / 'config' / 'chunk_executor.yaml').read_text())
    assert set(executor) == {'/**'}  # one executor per robot namespace
    assert _py_share_paths(EXECUTOR_FILE) == {'config/chunk_executor.yaml'}
    assert set(analyzers) == {calls['aggregator_node']['name'].value}


def test_simulated_robot_ids_are_the_ones_the_default_params_file_serves():
    params = yaml.safe_load((ROOT / 'config' / 'vla_sched.yaml').read_text())
    robot_ids = params['/**']['ros__parameters']['robot_ids']
    args = check_launch_arguments({'num_sim_robots': str(len(robot_ids)), 'namespace': 'gpu0'})
    robots = sim_robots(args)
    assert [r.robot_id for r in robots] == robot_ids
    assert [r.namespace for r in robots] == [f'/gpu0/{rid}' for rid in robot_ids]


def _bring_up(monkeypatch, autostart: str) -> list:
    """What vla_sched.launch.py's ``_bring_up`` returns for its default arguments and
    ``autostart``."""
    return bring_up(monkeypatch, autostart=autostart)


def _transition(action, node) -> int:
    """The transition an ``EmitEvent(ChangeState(...))`` asks of ``node``."""
    assert type(action).__name__ == 'EmitEvent'
    change = action.kwargs['event']
    assert change.kwargs['lifecycle_node_matcher'] == ('matches', node)
    return change.kwargs['transition_id']


def test_the_launch_file_configures_the_lifecycle_node_and_activates_it_by_default(monkeypatch):
    handler, node, configure = _bring_up(monkeypatch, 'true')
    assert type(node).__name__ == 'LifecycleNode'
    assert node.kwargs['executable'] == 'vla_sched_node'
    assert node.kwargs['arguments'] == [MANAGED_FLAG]  # not on its own
    assert not [p for p in node.kwargs['parameters'] if isinstance(p, dict) and 'autostart' in p]
    assert _transition(configure, node) == Transition.TRANSITION_CONFIGURE
    (on_configured,) = handler.args
    assert on_configured.kwargs['target_lifecycle_node'] is node
    assert on_configured.kwargs['start_state'] == 'configuring'
    assert on_configured.kwargs['goal_state'] == 'inactive'
    (activate,) = on_configured.kwargs['entities']
    assert _transition(activate, node) == Transition.TRANSITION_ACTIVATE


def test_autostart_false_leaves_the_node_configured(monkeypatch):
    node, configure = _bring_up(monkeypatch, 'false')
    assert type(node).__name__ == 'LifecycleNode'
    assert _transition(configure, node) == Transition.TRANSITION_CONFIGURE
    with pytest.raises(LaunchArgumentError, match="autostart must be true or false, got 'yes'"):
        _bring_up(monkeypatch, 'yes')


def test_log_level_sets_each_nodes_own_logger_and_leaves_rcl_alone(monkeypatch):
    actions = bring_up(monkeypatch, log_level='debug', namespace='gpu0', num_sim_robots='2')
    nodes = [a for a in actions if type(a).__name__ in ('Node', 'LifecycleNode')]
    levels = {n.kwargs['name']: n.kwargs['ros_arguments'] for n in nodes}
    assert levels == {
        'vla_sched': ['--log-level', 'gpu0.vla_sched:=debug'],
        'sim_robot_0': ['--log-level', 'gpu0.robot_0.sim_robot_0:=debug'],
        'sim_robot_1': ['--log-level', 'gpu0.robot_1.sim_robot_1:=debug'],
    }
    assert log_level_arguments('warn', '', 'vla_sched') == ['--log-level', 'vla_sched:=warn']
