"""The frontend node's settings as frozen dataclasses, validated without I/O.

``params.py`` fills them from ROS parameters; tests and the demo build them directly. Every
check names the offending robot and field, so a bad parameter file fails at start-up with a
message that says what to fix.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

TRIGGERS = ('periodic', 'on_image')
ACTION_SPACES = ('joint_position', 'joint_delta', 'ee_delta')
IMAGE_TRANSPORTS = ('raw', 'compressed')
ENGINE_MODES = ('process', 'inprocess')
LATE_POLICIES = ('drop', 'deliver_late')
EE_DELTA_NAMES = ('x', 'y', 'z', 'roll', 'pitch', 'yaw', 'gripper')
NODE_SET_ENGINE_KEYS = ('robots', 'stats_period_s', 'max_instruction_bytes', 'late_policy')
_ROBOT_ID = re.compile(r'[A-Za-z][A-Za-z0-9_]*')
_NAMESPACE = re.compile(r'/?[A-Za-z][A-Za-z0-9_]*(/[A-Za-z][A-Za-z0-9_]*)*')


class ConfigError(ValueError):
    """A setting is missing, malformed or out of range; the message names it."""


def _positive(owner: str, name: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f'{owner}.{name} must be a number, got {value!r}')
    if not (math.isfinite(value) and value > 0):
        raise ConfigError(f'{owner}.{name} must be > 0, got {value!r}')


def _choice(owner: str, name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f'{owner}.{name} must be one of {list(allowed)}, got {value!r}')


def _names(owner: str, name: str, values: tuple[str, ...]) -> None:
    if any(not isinstance(v, str) or not v for v in values):
        raise ConfigError(f'{owner}.{name} must hold non-empty strings, got {list(values)}')
    if len(set(values)) != len(values):
        raise ConfigError(f'{owner}.{name} lists a name twice: {list(values)}')


@dataclass(frozen=True, slots=True)
class RobotConfig:
    """One robot: where its topics are, when it is due, and what its actions mean.

    ``namespace`` empty means the robot id (relative to the node's namespace).
    ``state_joint_names`` gives the checkpoint's state order: entry i of the state vector is
    the position of that joint in ``joint_states``. ``action_joint_names`` names the action
    columns (empty: the checkpoint's defaults). ``dt`` is the time between the actions of one
    chunk. ``period_s`` is the control period, and for ``trigger='on_image'`` the target
    period that the action rate is judged against.
    """

    robot_id: str
    namespace: str = ''
    priority: int = 0
    period_s: float = 0.1
    trigger: str = 'periodic'
    instruction: str = ''
    state_joint_names: tuple[str, ...] = ()
    action_joint_names: tuple[str, ...] = ()
    action_space: str = 'ee_delta'
    dt: float = 0.1
    frame_id: str = 'base_link'
    publish_joint_trajectory: bool = False
    image_transport: str = 'raw'

    def __post_init__(self) -> None:
        owner = f'robots.{self.robot_id}'
        if not isinstance(self.robot_id, str) or not _ROBOT_ID.fullmatch(self.robot_id):
            raise ConfigError(
                f'robot id {self.robot_id!r} must start with a letter and hold only letters, '
                'digits and underscores'
            )
        if self.namespace and not _NAMESPACE.fullmatch(self.namespace):
            raise ConfigError(f'{owner}.namespace {self.namespace!r} is not a valid namespace')
        if isinstance(self.priority, bool) or not isinstance(self.priority, int):
            raise ConfigError(f'{owner}.priority must be an integer, got {self.priority!r}')
        _positive(owner, 'period_s', self.period_s)
        _positive(owner, 'dt', self.dt)
        _choice(owner, 'trigger', self.trigger, TRIGGERS)
        _choice(owner, 'action_space', self.action_space, ACTION_SPACES)
        _choice(owner, 'image_transport', self.image_transport, IMAGE_TRANSPORTS)
        _names(owner, 'state_joint_names', self.state_joint_names)
        _names(owner, 'action_joint_names', self.action_joint_names)
        if self.publish_joint_trajectory and self.action_space != 'joint_position':
            raise ConfigError(
                f'{owner}.publish_joint_trajectory needs action_space joint_position '
                f'(a JointTrajectory holds positions), got {self.action_space!r}'
            )
        if self.publish_joint_trajectory and not self.action_joint_names:
            raise ConfigError(f'{owner}.publish_joint_trajectory needs action_joint_names')

    @property
    def topic_namespace(self) -> str:
        return self.namespace or self.robot_id

    def action_names(self, action_dim: int) -> tuple[str, ...]:
        """Column names for a chunk with ``action_dim`` values per action.

        Raises:
            ConfigError: ``action_joint_names`` is set but has another length.
        """
        if self.action_joint_names:
            if len(self.action_joint_names) != action_dim:
                raise ConfigError(
                    f'robots.{self.robot_id}.action_joint_names has '
                    f'{len(self.action_joint_names)} names but the checkpoint returns '
                    f'{action_dim} values per action'
                )
            return self.action_joint_names
        if self.action_space == 'ee_delta' and action_dim == len(EE_DELTA_NAMES):
            return EE_DELTA_NAMES
        return tuple(f'a{j}' for j in range(action_dim))


@dataclass(frozen=True, slots=True)
class DiagnosticsConfig:
    """When /diagnostics is published and what turns a status WARN or ERROR.

    A robot is silent (ERROR) when no camera image arrived for ``silent_robot_s``; its rate is
    low (WARN) below ``rate_warn_fraction`` of ``1 / period_s`` over the last ``window_s``.
    The scheduler is WARN when more than ``queue_warn_threshold`` steps wait.
    """

    period_s: float = 1.0
    window_s: float = 5.0
    queue_warn_threshold: int = 16
    rate_warn_fraction: float = 0.8
    silent_robot_s: float = 3.0

    def __post_init__(self) -> None:
        for name in ('period_s', 'window_s', 'silent_robot_s', 'rate_warn_fraction'):
            _positive('diagnostics', name, getattr(self, name))
        if self.rate_warn_fraction > 1:
            raise ConfigError('diagnostics.rate_warn_fraction must be <= 1')
        if isinstance(self.queue_warn_threshold, bool) or self.queue_warn_threshold < 0:
            raise ConfigError('diagnostics.queue_warn_threshold must be an integer >= 0')


@dataclass(frozen=True, slots=True)
class EngineLinkConfig:
    """How the node runs and watches the engine.

    ``engine`` holds the engine's own settings (see ``vla_sched.ipc.engine_config``) minus
    those the node fills in (``NODE_SET_ENGINE_KEYS``).
    """

    mode: str = 'process'
    engine: Mapping[str, Any] = field(default_factory=dict)
    heartbeat_period_s: float = 0.2
    heartbeat_timeout_s: float = 1.0
    restart_delay_s: float = 1.0
    start_timeout_s: float = 120.0
    poll_period_s: float = 0.005

    def __post_init__(self) -> None:
        _choice('engine', 'mode', self.mode, ENGINE_MODES)
        for name in (
            'heartbeat_period_s',
            'heartbeat_timeout_s',
            'restart_delay_s',
            'start_timeout_s',
            'poll_period_s',
        ):
            _positive('engine', name, getattr(self, name))
        if self.heartbeat_period_s >= self.heartbeat_timeout_s:
            raise ConfigError('engine.heartbeat_period_s must be below heartbeat_timeout_s')
        reserved = set(NODE_SET_ENGINE_KEYS) & set(self.engine)
        if reserved:
            raise ConfigError(f'engine settings {sorted(reserved)} are set by the node')
        policy = self.engine.get('policy', 'fcfs')
        if self.engine.get('enable_priority') and policy not in ('fcfs', 'lof'):
            raise ConfigError(
                f'scheduler.enable_priority works with policy fcfs or lof, not {policy!r}'
            )


@dataclass(frozen=True, slots=True)
class FrontendConfig:
    """Everything the node needs, validated as a whole.

    ``late_policy`` 'drop' answers a step that ends after its deadline with StepRejected
    (DEADLINE_MISSED); 'deliver_late' publishes its chunk with ``late`` set.
    """

    robots: tuple[RobotConfig, ...]
    link: EngineLinkConfig = field(default_factory=EngineLinkConfig)
    diagnostics: DiagnosticsConfig = field(default_factory=DiagnosticsConfig)
    step_budget_s: float = 0.5
    late_policy: str = 'drop'
    max_instruction_bytes: int = 1024
    max_image_pixels: int = 4096 * 4096

    def __post_init__(self) -> None:
        if not self.robots:
            raise ConfigError('robot_ids is empty: configure at least one robot')
        ids = [r.robot_id for r in self.robots]
        if len(set(ids)) != len(ids):
            raise ConfigError(f'robot_ids lists a robot twice: {ids}')
        spaces = [r.topic_namespace for r in self.robots]
        if len(set(spaces)) != len(spaces):
            raise ConfigError(f'two robots share a namespace: {spaces}')
        _positive('deadlines', 'step_budget_s', self.step_budget_s)
        _choice('deadlines', 'late_policy', self.late_policy, LATE_POLICIES)
        for name in ('max_instruction_bytes', 'max_image_pixels'):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f'limits.{name} must be a positive integer, got {value!r}')

    def robot(self, robot_id: str) -> RobotConfig:
        for robot in self.robots:
            if robot.robot_id == robot_id:
                return robot
        raise KeyError(robot_id)

    def engine_config(self) -> dict[str, Any]:
        """The engine's settings mapping: the node's engine section plus robots and limits.

        Robot priorities are sent only when priority scheduling is on (the scheduler refuses
        priorities it would not use).
        """
        out = dict(self.link.engine)
        out['robots'] = {}
        if out.get('enable_priority'):
            out['robots'] = {r.robot_id: {'priority': r.priority} for r in self.robots}
        out['stats_period_s'] = self.diagnostics.period_s
        out['max_instruction_bytes'] = self.max_instruction_bytes
        out['late_policy'] = self.late_policy
        return out
