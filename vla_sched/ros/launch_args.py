"""The launch files' arguments, checked before any process starts.

``launch/vla_sched.launch.py``, ``launch/sim_robots.launch.py`` and
``launch/chunk_executor.launch.py`` call ``check_launch_arguments`` from an ``OpaqueFunction``
that returns their ``Node`` actions only after it passed: a bad value raises
``LaunchArgumentError`` naming the argument, launch exits having started nothing, and nothing
can outlive it. Plain Python (no launch import), so the tests call it directly;
``sim_robots`` and ``chunk_executors`` say which processes to start as plain data.

The launch files declare ``log_level`` with ``LOG_LEVELS`` (``DeclareLaunchArgument(choices=
...)``), so that ``ros2 launch ... --show-args`` lists them and launch itself refuses another
value. Their boolean arguments have no ``choices``: launch compares choices exactly, while
its own boolean handling (``IfCondition``) takes true, false, 1 and 0 in any case, and so
does ``check_launch_arguments`` (``use_sim_time:=True`` is what a ROS user types); another
word is refused there before any process starts.

``log_level`` sets the level of each started node's own logger, not rcl's: a node gets
``--ros-args --log-level <its logger>:=<level>`` (``log_level_arguments``; a node's logger is
named after its namespace and name, ``gpu0.vla_sched``, and the loggers under it follow it),
so ``log_level:=debug`` shows the package's debug lines without rcl's and the middleware's
thousands. The vla_sched node forwards its Python loggers (``vla_sched.*``) to its node
logger at that level (``ros.ros_logging``).

The launch files start the vla_sched node with ``MANAGED_FLAG`` on its command line (not a
parameter): it then waits for its transitions, which the launch file drives, whatever its
``autostart`` parameter says, so ``ros2 param dump`` of a launched node carries the
parameter as given (true by default) and starts a node on its own that serves.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml

TRUE_WORDS = ('true', '1')  # what launch's IfCondition takes, in any case
FALSE_WORDS = ('false', '0')
LOG_LEVELS = ('debug', 'info', 'warn', 'error', 'fatal')  # --ros-args --log-level
MANAGED_FLAG = '--managed'  # the node waits for its transitions (a launch file drives them)
AGGREGATOR_PACKAGE = 'diagnostic_aggregator'
EXECUTOR_NODE_NAME = 'vla_chunk_executor'
_ROBOT_ID = re.compile(r'[A-Za-z][A-Za-z0-9_]*')


class LaunchArgumentError(ValueError):
    """One or more launch arguments are unusable; the message names each."""


@dataclass(frozen=True, slots=True)
class LaunchArguments:
    """Checked launch arguments; ``None`` where the launch file has no such argument."""

    namespace: str = ''
    num_sim_robots: int | None = None
    sim_rate_hz: float | None = None
    start_aggregator: bool | None = None
    params_file: Path | None = None
    analyzers_file: Path | None = None
    use_sim_time: bool | None = None
    log_level: str | None = None
    robot_ids: tuple[str, ...] | None = None
    autostart: bool | None = None


@dataclass(frozen=True, slots=True)
class RobotProcess:
    """One process of a robot (a simulated robot, a chunk executor): its node name, namespace
    and command-line arguments."""

    robot_id: str
    node_name: str
    namespace: str
    arguments: tuple[str, ...]


def ros_package_installed(name: str) -> bool:
    """Whether the ament index (AMENT_PREFIX_PATH) lists the package ``name``."""
    from ament_index_python.packages import PackageNotFoundError, get_package_prefix

    try:
        get_package_prefix(name)
    except PackageNotFoundError:
        return False
    return True


def check_launch_arguments(
    values: Mapping[str, str],
    *,
    package_installed: Callable[[str], bool] = ros_package_installed,
) -> LaunchArguments:
    """Check the launch arguments in ``values`` (name to the text launch gives) and convert
    them; an argument that is absent is not checked.

    - ``num_sim_robots``: a non-negative integer.
    - ``sim_rate``: a positive, finite number (Hz).
    - ``start_aggregator``: true or false (or 1 / 0); when true, ``diagnostic_aggregator``
      must be installed (``package_installed``) and ``analyzers_file`` readable.
    - ``params_file``: a readable YAML file holding a mapping.
    - ``use_sim_time``: true or false (or 1 / 0).
    - ``log_level``: one of ``LOG_LEVELS``, in any case.
    - ``robot_ids``: one or more robot ids (a letter, then letters, digits or underscores),
      separated by commas or spaces, each once.
    - ``autostart``: true or false (or 1 / 0).

    Raises:
        LaunchArgumentError: naming every unusable argument and its value.
    """
    problems: list[str] = []
    fields: dict[str, object] = {'namespace': values.get('namespace', '').strip('/')}
    if 'num_sim_robots' in values:
        fields['num_sim_robots'] = _count(values['num_sim_robots'], problems)
    if 'sim_rate' in values:
        fields['sim_rate_hz'] = _rate(values['sim_rate'], problems)
    if 'start_aggregator' in values:
        start = _flag('start_aggregator', values['start_aggregator'], problems)
        fields['start_aggregator'] = start
        if start and not package_installed(AGGREGATOR_PACKAGE):
            problems.append(
                f'start_aggregator:=true needs the {AGGREGATOR_PACKAGE} package, which is not '
                f'installed (apt install ros-<distro>-diagnostic-aggregator)'
            )
        if start and 'analyzers_file' in values:
            fields['analyzers_file'] = _yaml_file('analyzers_file', values, problems)
    if 'params_file' in values:
        fields['params_file'] = _yaml_file('params_file', values, problems)
    if 'use_sim_time' in values:
        fields['use_sim_time'] = _flag('use_sim_time', values['use_sim_time'], problems)
    if 'log_level' in values:
        fields['log_level'] = _log_level(values['log_level'], problems)
    if 'robot_ids' in values:
        fields['robot_ids'] = _robot_ids(values['robot_ids'], problems)
    if 'autostart' in values:
        fields['autostart'] = _flag('autostart', values['autostart'], problems)
    if problems:
        raise LaunchArgumentError('bad launch arguments: ' + '; '.join(problems))
    return LaunchArguments(**fields)


def sim_robots(args: LaunchArguments) -> list[RobotProcess]:
    """robot_0 .. robot_<N-1>, each under ``/<namespace>/<robot id>`` (``/<robot id>``
    without a namespace), as the node's default topic namespaces expect."""
    count = args.num_sim_robots or 0
    rate = f'{args.sim_rate_hz if args.sim_rate_hz is not None else 10.0:g}'
    robots = []
    for index in range(count):
        robot_id = f'robot_{index}'
        namespace = _robot_namespace(args, robot_id)
        arguments = ('--robot-id', robot_id, '--rate', rate, '--report-period', '5')
        robots.append(RobotProcess(robot_id, f'sim_{robot_id}', namespace, arguments))
    return robots


def node_logger_name(namespace: str, name: str) -> str:
    """The name of the logger of the node ``name`` in ``namespace``, as rcl names it: the
    namespace's parts and the name, joined by dots (``/gpu0/robot_0``, ``sim_robot_0``:
    ``gpu0.robot_0.sim_robot_0``)."""
    return '.'.join([*(part for part in namespace.split('/') if part), name])


def log_level_arguments(level: str, namespace: str, name: str) -> list[str]:
    """The ``ros_arguments`` that set the node's own logger (and those under it) to
    ``level``, leaving rcl's and the middleware's loggers at their default."""
    return ['--log-level', f'{node_logger_name(namespace, name)}:={level}']


def chunk_executors(args: LaunchArguments) -> list[RobotProcess]:
    """One chunk executor per robot of ``robot_ids``, in the robot's namespace
    (``/<namespace>/<robot id>``, ``/<robot id>`` without one), where its ``vla/action_chunk``
    and its controllers are."""
    return [
        RobotProcess(robot_id, EXECUTOR_NODE_NAME, _robot_namespace(args, robot_id), ())
        for robot_id in args.robot_ids or ()
    ]


def _robot_namespace(args: LaunchArguments, robot_id: str) -> str:
    return f'/{args.namespace}/{robot_id}' if args.namespace else f'/{robot_id}'


def _count(text: str, problems: list[str]) -> int | None:
    if re.fullmatch(r'[0-9]+', text.strip()):
        return int(text)
    problems.append(f'num_sim_robots must be a non-negative integer, got {text!r}')
    return None


def _rate(text: str, problems: list[str]) -> float | None:
    try:
        rate = float(text)
    except ValueError:
        rate = math.nan
    if math.isfinite(rate) and rate > 0:
        return rate
    problems.append(f'sim_rate must be a positive number (Hz), got {text!r}')
    return None


def _flag(name: str, text: str, problems: list[str]) -> bool | None:
    word = text.strip().lower()
    if word in TRUE_WORDS or word in FALSE_WORDS:
        return word in TRUE_WORDS
    problems.append(f'{name} must be true or false, got {text!r}')
    return None


def _log_level(text: str, problems: list[str]) -> str | None:
    level = text.strip().lower()
    if level in LOG_LEVELS:
        return level
    problems.append(f'log_level must be one of {", ".join(LOG_LEVELS)}, got {text!r}')
    return None


def _robot_ids(text: str, problems: list[str]) -> tuple[str, ...] | None:
    ids = tuple(word for word in re.split(r'[\s,]+', text.strip().strip('[]')) if word)
    bad = [i for i in ids if not _ROBOT_ID.fullmatch(i)]
    if not ids or bad or len(set(ids)) != len(ids):
        problems.append(
            'robot_ids must be distinct robot ids (a letter, then letters, digits or '
            f'underscores) separated by commas or spaces, got {text!r}'
        )
        return None
    return ids


def _yaml_file(name: str, values: Mapping[str, str], problems: list[str]) -> Path | None:
    path = Path(values[name]).expanduser()
    if not path.is_file() or not os.access(path, os.R_OK):
        problems.append(f'{name} {str(path)!r} is not a readable file')
        return None
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        problems.append(f'{name} {str(path)!r} is not valid YAML: {exc}')
        return None
    if not isinstance(data, dict):
        problems.append(f'{name} {str(path)!r} holds no YAML mapping of node names')
        return None
    return path
