"""The node's ROS parameters, derived from the settings of its config dataclasses.

Every parameter but ``robot_ids`` and ``autostart`` is a setting (``vla_sched.settings``) of a
config dataclass: a field of ``FrontendConfig`` or of a config it holds (``EngineLinkConfig``,
``EngineConfig``, ``DiagnosticsConfig``) is the parameter ``<group>.<name>``, its group one of
``engine``, ``scheduler``, ``deadlines``, ``limits``, ``diagnostics``; a setting without a
group is filled in by the node and is no parameter. ``autostart`` says whether the node
configures and activates itself at start-up (the node reads it; no config holds it). Robots
are listed in ``robot_ids``; each robot's settings (``RobotConfig``) are
``robots.<id>.<name>``, and each one that is not set falls back to ``robot_defaults.<name>``
(all but ``namespace``: two robots cannot share one). A parameter's default, description,
choices or range, and read-only flag come from its setting; ``config/vla_sched.yaml``
documents every parameter declared here (a test checks that the two agree).

Only the robot settings marked ``runtime`` (``RUNTIME_ROBOT_PARAMS``: a robot's
``instruction`` and ``period_s``) may change while the node runs; every other parameter is
read-only after start-up, and a robot's instruction cannot be set to an empty one.

ROS drops a value that names no declared parameter, so ``declare_and_read`` refuses them: a
misspelled name or a ``robots.<id>`` section for an id missing from ``robot_ids`` fails
start-up with the closest declared names, and so does a ``--params-file`` that gives this
node nothing (keyed by another node's name; ``/**:`` applies under any name and namespace).
The names given are read from the node's command line and overrides (``given_parameters``);
the values only through rclpy's public ``declare_parameter``.
An empty string list is declared as an empty array, never as "not set", so that what
``ros2 param dump`` writes loads back as a params file.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rcl_interfaces.msg import (
    FloatingPointRange,
    IntegerRange,
    ParameterDescriptor,
    SetParametersResult,
)

from vla_sched.engine.config import EngineConfigError
from vla_sched.ros.conversions import ConversionError, check_instruction
from vla_sched.ros.given_parameters import (
    given_names,
    load_params_file,
    ros_arguments,
    rule_target,
)
from vla_sched.ros.node_config import ConfigError, FrontendConfig, RobotConfig
from vla_sched.settings import Setting, settings_of
from vla_sched.settings import check_value as check_setting_value

if TYPE_CHECKING:
    from rclpy.node import Node
    from rclpy.parameter import Parameter

ROBOT_DEFAULTS = 'robot_defaults'
ROBOT_IDS = Setting('robot_ids', ('robot_0',), 'the robots this node serves')
AUTOSTART = Setting(
    'autostart',
    True,
    'configure and activate the node at start-up; false: it stays unconfigured until its '
    'lifecycle services are called (ros2 lifecycle set, a launch file, a lifecycle manager)',
)
PER_ROBOT_ONLY = ('namespace',)  # no robot_defaults entry: two robots cannot share one
RUNTIME_ROBOT_PARAMS = tuple(s.name for s in settings_of(RobotConfig) if s.runtime)
# Declared by rclpy on demand (QoS overriding options), never by this module.
FOREIGN_PREFIXES = ('qos_overrides.',)


@dataclass(frozen=True, slots=True)
class ParamSpec:
    """One ROS parameter: its full name and the setting it sets."""

    name: str
    setting: Setting

    @property
    def default(self) -> Any:
        return self.setting.default


def _grouped_settings(cls: type) -> Iterator[Setting]:
    """The settings of ``cls`` that have a group, after those of the configs it holds (its
    fields whose ``default_factory`` is a config dataclass)."""
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(f.default_factory):
            yield from _grouped_settings(f.default_factory)
    yield from (s for s in settings_of(cls) if s.group)


def node_specs() -> list[ParamSpec]:
    """Every parameter that does not depend on the robot list."""
    specs = [ParamSpec(ROBOT_IDS.name, ROBOT_IDS), ParamSpec(AUTOSTART.name, AUTOSTART)]
    # A default is read once, when the robots' parameters are declared: changing one later
    # would change nothing, so every robot_defaults.* parameter is read-only.
    specs += [
        ParamSpec(f'{ROBOT_DEFAULTS}.{s.name}', dataclasses.replace(s, runtime=False))
        for s in settings_of(RobotConfig)
        if s.name not in PER_ROBOT_ONLY
    ]
    specs += [ParamSpec(s.label, s) for s in _grouped_settings(FrontendConfig)]
    return specs


def robot_specs(robot_id: str, defaults: dict[str, Any]) -> list[ParamSpec]:
    """``robots.<robot_id>.*``, with defaults taken from ``robot_defaults.*``.

    ``defaults`` maps a setting name to its ``robot_defaults`` value (checked here).
    """
    specs = []
    for s in settings_of(RobotConfig):
        default = s.default
        if s.name in defaults:
            default = check_value(ParamSpec(f'{ROBOT_DEFAULTS}.{s.name}', s), defaults[s.name])
        specs.append(
            ParamSpec(f'robots.{robot_id}.{s.name}', dataclasses.replace(s, default=default))
        )
    return specs


def descriptor(spec: ParamSpec) -> ParameterDescriptor:
    """The ``rcl_interfaces/ParameterDescriptor`` of a spec (ranges, choices, read-only)."""
    setting = spec.setting
    desc = ParameterDescriptor(description=setting.description, read_only=not setting.runtime)
    if setting.choices:
        desc.additional_constraints = 'one of: ' + ', '.join(setting.choices)
    if setting.is_string_list:
        desc.dynamic_typing = True
        desc.additional_constraints = 'a list of strings'
    elif setting.min_value is not None and isinstance(setting.default, float):
        desc.floating_point_range = [
            FloatingPointRange(
                from_value=float(setting.min_value), to_value=float(setting.max_value)
            )
        ]
    elif setting.min_value is not None and isinstance(setting.default, int):
        desc.integer_range = [
            IntegerRange(
                from_value=int(setting.min_value), to_value=int(setting.max_value), step=1
            )
        ]
    return desc


def check_value(spec: ParamSpec, value: Any) -> Any:
    """The value normalised (string lists become tuples), or ConfigError naming the spec."""
    if spec.setting.is_string_list:
        if value is None or (isinstance(value, list | tuple) and len(value) == 0):
            return ()
        if isinstance(value, list):
            value = tuple(value)
    elif (
        isinstance(spec.default, float) and isinstance(value, int) and not isinstance(value, bool)
    ):
        value = float(value)
    check_setting_value(spec.setting, value, label=spec.name, error=ConfigError)
    return value


def _build(cls: type, values: dict[str, Any], **given: Any) -> Any:
    """``cls`` from the values of its grouped settings and of the configs it holds."""
    kwargs = dict(given)
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(f.default_factory):
            kwargs[f.name] = _build(f.default_factory, values)
    kwargs.update({s.name: values[s.label] for s in settings_of(cls) if s.group})
    return cls(**kwargs)


def config_from_values(values: dict[str, Any]) -> FrontendConfig:
    """Build the validated config from a full ``{parameter name: value}`` mapping.

    Raises:
        ConfigError: a value is out of range, or values are inconsistent.
    """
    robots = tuple(
        RobotConfig(
            robot_id=robot_id,
            **{s.name: values[f'robots.{robot_id}.{s.name}'] for s in settings_of(RobotConfig)},
        )
        for robot_id in values['robot_ids']
    )
    try:
        return _build(FrontendConfig, values, robots=robots)
    except EngineConfigError as exc:
        raise ConfigError(str(exc)) from exc


def all_specs(robot_ids: Iterable[str], defaults: dict[str, Any]) -> list[ParamSpec]:
    """The node's specs followed by each robot's."""
    specs = node_specs()
    for robot_id in robot_ids:
        specs.extend(robot_specs(robot_id, defaults))
    return specs


def declare_and_read(
    node: Node, *, command_line: Sequence[str] = (), overrides: Iterable[Parameter] = ()
) -> FrontendConfig:
    """Declare every parameter on ``node`` and return the validated config.

    ``command_line`` is the process's arguments (those given to ``rclpy.init``, then the
    node's own ``cli_args``) and ``overrides`` the ``parameter_overrides`` the node was built
    with: they tell which names were given (``given_parameters``) and which came from a file.

    Raises:
        ConfigError: a value is of the wrong type, out of range, or inconsistent; a value
            names no declared parameter; or the params files give this node nothing.
    """
    node_fqn = node.get_fully_qualified_name()
    given = given_names(node_fqn, command_line, (p.name for p in overrides))
    check_params_files_reach(node_fqn, given, command_line)
    values: dict[str, Any] = {}
    base = node_specs()
    for spec in base:
        values[spec.name] = _declare(node, spec)
    prefix = f'{ROBOT_DEFAULTS}.'
    defaults = {
        spec.name[len(prefix) :]: values[spec.name]
        for spec in base
        if spec.name.startswith(prefix)
    }
    for robot_id in values['robot_ids']:
        RobotConfig(robot_id=robot_id)  # a bad id fails before its parameters are declared
        for spec in robot_specs(robot_id, defaults):
            values[spec.name] = _declare(node, spec)
    declared = node.get_parameters_by_prefix('')  # every declared parameter, by full name
    check_no_unknown(given, declared, values['robot_ids'])
    return config_from_values(values)


def _declare(node: Node, spec: ParamSpec) -> Any:
    if not spec.setting.is_string_list:
        param = node.declare_parameter(spec.name, spec.default, descriptor(spec))
        return check_value(spec, param.value)
    # Dynamically typed, and always declared with a list: '[]' in a params file arrives as
    # "not set", and a parameter left "not set" would be dumped as null, which loads back
    # as the string 'null'. The given value is read as rcl resolved it (any type, or "not
    # set") through a writable probe, then the parameter is declared again with its
    # descriptor and that value as a list; an empty list is declared as rclpy types it (an
    # empty byte array), which ros2 param dump writes as [].
    probe = ParameterDescriptor(dynamic_typing=True)
    value = node.declare_parameter(spec.name, list(spec.default), probe).value
    node.undeclare_parameter(spec.name)
    if value is None:
        value = []
    node.declare_parameter(spec.name, value, descriptor(spec), ignore_override=True)
    return check_value(spec, value)


def ros_command_line(argv: Sequence[str]) -> tuple[list[str], set[str]]:
    """The ``--params-file`` paths and the names set with ``-p``/``--param`` in ``argv``.

    Only arguments inside ``--ros-args`` ... (``--`` ends them) count, as rcl reads them.
    """
    files, rules = ros_arguments(argv)
    return files, {rule_target(rule)[1] for rule in rules}


def check_params_files_reach(
    node_name: str, overrides: Iterable[str], command_line: Sequence[str]
) -> None:
    """ConfigError when ``--params-file`` was given but no value of a file reached the node
    called ``node_name`` (its fully qualified name), naming the files' top-level keys."""
    files, cli_names = ros_command_line(command_line)
    if not files or set(overrides) - cli_names:
        return
    keys = []
    for path in files:
        data = load_params_file(path)
        keys += list(data) if isinstance(data, dict) else []
    raise ConfigError(
        f'the params file(s) {files} give {node_name} no parameters: they are keyed by '
        f'{keys}; key them "/**:" (any node name and namespace) or "{node_name}:"'
    )


def check_no_unknown(
    overrides: Iterable[str], declared: Iterable[str], robot_ids: Sequence[str]
) -> None:
    """ConfigError naming every override that is no declared parameter, with the closest
    declared names (and, for ``robots.<id>.*``, that the id is not in ``robot_ids``)."""
    declared = sorted(set(declared))
    problems = []
    for name in sorted(overrides):
        if name in declared or name.startswith(FOREIGN_PREFIXES):
            continue
        parts = name.split('.')
        why = ''
        if len(parts) == 3 and parts[0] == 'robots' and parts[1] not in robot_ids:
            why = f'{parts[1]} is not in robot_ids {list(robot_ids)}; '
        close = difflib.get_close_matches(name, declared, n=3, cutoff=0.6)
        hint = f'closest: {", ".join(close)}' if close else 'no declared name is close'
        problems.append(f'{name} ({why}{hint})')
    if problems:
        raise ConfigError('unknown parameters: ' + '; '.join(problems))


def runtime_validator(
    config: FrontendConfig, apply: Callable[[str, str, Any], None]
) -> Callable[[list], Any]:
    """An on-set-parameters callback: checks runtime-changeable robot parameters.

    ``apply(robot_id, name, value)`` is called for each accepted change. An instruction is
    checked as one arriving on the topic: an empty or over-long one is refused.
    """
    specs = {s.name: s for s in all_specs([r.robot_id for r in config.robots], {})}

    def validate(params: list) -> SetParametersResult:
        accepted = []
        for param in params:
            parts = param.name.split('.')
            spec = specs.get(param.name)
            if spec is None or len(parts) != 3 or parts[0] != 'robots':
                continue  # read-only or unknown parameters are rclpy's business
            if parts[2] not in RUNTIME_ROBOT_PARAMS:
                continue
            try:
                value = check_value(spec, param.value)
                if parts[2] == 'instruction':
                    value = check_instruction(value, max_bytes=config.max_instruction_bytes)
            except ConfigError as exc:
                return SetParametersResult(successful=False, reason=str(exc))
            except ConversionError as exc:
                return SetParametersResult(successful=False, reason=f'{param.name}: {exc}')
            accepted.append((parts[1], parts[2], value))
        for robot_id, name, value in accepted:
            apply(robot_id, name, value)
        return SetParametersResult(successful=True)

    return validate
