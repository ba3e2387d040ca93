"""vla_sched.launch.py run against stand-ins for launch and launch_ros (not installable here).

``bring_up`` runs the launch file's ``_bring_up`` with its default arguments (and those
given) against stand-in classes that record what they are built with, and returns the
actions it made. ``node_command`` turns a recorded ``Node``/``LifecycleNode`` of this
package into the command line launch_ros gives its process (the executable, its
``arguments``, then ``--ros-args`` with the name and namespace remaps, a params file per
entry of ``parameters`` (a dict written to a file, as launch_ros does) and its
``ros_arguments``), run here as ``python -m <module>``.
"""

from __future__ import annotations

import ast
import runpy
import sys
import types
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
PY_FILE = ROOT / 'launch' / 'vla_sched.launch.py'
MODULES = {'vla_sched_node': 'vla_sched.ros.node', 'vla_sim_robot': 'vla_sched.ros.sim_robot'}


class Recorded:
    """A stand-in for a launch or launch_ros class: keeps what it was built with."""

    def __init__(self, *args, **kwargs) -> None:
        self.args, self.kwargs = args, kwargs


class _LaunchConfiguration(Recorded):
    def perform(self, context: dict) -> str:
        return context[self.args[0]]


def stand_ins() -> dict[str, types.ModuleType]:
    """Modules with the names vla_sched.launch.py imports from launch and launch_ros."""
    names = {
        'launch': ['LaunchDescription'],
        'launch.actions': [
            'DeclareLaunchArgument',
            'EmitEvent',
            'OpaqueFunction',
            'RegisterEventHandler',
        ],
        'launch.events': [],
        'launch.substitutions': ['PathJoinSubstitution'],
        'launch_ros': [],
        'launch_ros.actions': ['LifecycleNode', 'Node'],
        'launch_ros.event_handlers': ['OnStateTransition'],
        'launch_ros.events': [],
        'launch_ros.events.lifecycle': ['ChangeState'],
        'launch_ros.substitutions': ['FindPackageShare'],
    }
    modules = {}
    for module, classes in names.items():
        modules[module] = types.ModuleType(module)
        for name in classes:
            setattr(modules[module], name, type(name, (Recorded,), {}))
    modules['launch.substitutions'].LaunchConfiguration = _LaunchConfiguration
    modules['launch.events'].matches_action = lambda action: ('matches', action)
    return modules


def default_arguments() -> dict[str, str | None]:
    """The launch file's arguments and their defaults (None: a substitution)."""
    tree = ast.parse(PY_FILE.read_text())
    out = {}
    for call in ast.walk(tree):
        if (
            isinstance(call, ast.Call)
            and getattr(call.func, 'id', None) == 'DeclareLaunchArgument'
        ):
            default = {kw.arg: kw.value for kw in call.keywords}['default_value']
            out[call.args[0].value] = default.value if isinstance(default, ast.Constant) else None
    return out


def bring_up(monkeypatch, **arguments: str) -> list:
    """What vla_sched.launch.py's ``_bring_up`` returns for its default arguments (the
    shipped params and analyzers files) and ``arguments``."""
    for name, module in stand_ins().items():
        monkeypatch.setitem(sys.modules, name, module)
    context = dict(default_arguments())
    context.update(
        params_file=str(ROOT / 'config' / 'vla_sched.yaml'),
        analyzers_file=str(ROOT / 'config' / 'diagnostics_analyzers.yaml'),
    )
    context.update(arguments)
    return runpy.run_path(str(PY_FILE))['_bring_up'](context)


def node_command(node: Recorded, folder: Path) -> list[str]:
    """The command line launch_ros runs for ``node`` (params dicts written under ``folder``)."""
    kwargs = node.kwargs
    cmd = [sys.executable, '-m', MODULES[kwargs['executable']], *kwargs.get('arguments', ())]
    cmd += ['--ros-args', '-r', f'__node:={kwargs["name"]}']
    if kwargs.get('namespace'):
        cmd += ['-r', f'__ns:=/{kwargs["namespace"].strip("/")}']
    for index, entry in enumerate(kwargs.get('parameters', ())):
        if isinstance(entry, dict):
            path = folder / f'launch_params_{index}.yaml'
            path.write_text(yaml.safe_dump({'/**': {'ros__parameters': entry}}))
            entry = path
        cmd += ['--params-file', str(entry)]
    return [*cmd, *kwargs.get('ros_arguments', ())]
