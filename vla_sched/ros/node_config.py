"""The frontend node's settings as frozen dataclasses, validated without I/O.

Each setting is defined once, as a field made by ``vla_sched.settings.setting`` (its default,
meaning, choices or range, and whether it may change at run time); ``parameters`` derives the
node's ROS parameters from these fields and fills them in; tests and the demo build them
directly. Every check names the offending robot and field, so a bad parameter file fails at
start-up with a message that says what to fix.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field

import numpy as np

from vla_sched.engine.config import EngineConfig, EngineLinkConfig
from vla_sched.ipc import codec
from vla_sched.ipc.channel import DEFAULT_MAX_MESSAGE_BYTES
from vla_sched.ipc.messages import StepRequest
from vla_sched.settings import check_settings, setting, setting_like, settings_of

TRIGGERS = ('periodic', 'on_image')
ACTION_SPACES = ('joint_position', 'joint_delta', 'ee_delta')
IMAGE_TRANSPORTS = ('raw', 'compressed')
TRAJECTORY_STARTS = ('now', 'on_receipt')
EE_DELTA_NAMES = ('x', 'y', 'z', 'roll', 'pitch', 'yaw', 'gripper')
NUM_TWIST_COLUMNS = 6  # x y z roll pitch yaw: the columns an ee_delta twist is made of
GRIPPER_COLUMN = 6  # the gripper's column of a 7-value ee_delta action
PLACEHOLDER_ACTION_NAME = re.compile(r'a\d+')  # the names action_names makes: a0, a1, ...
_ROBOT_ID = re.compile(r'[A-Za-z][A-Za-z0-9_]*')
_NAMESPACE = re.compile(r'/?[A-Za-z][A-Za-z0-9_]*(/[A-Za-z][A-Za-z0-9_]*)*')
_RELATIVE_TOPIC = re.compile(r'[A-Za-z][A-Za-z0-9_]*(/[A-Za-z][A-Za-z0-9_]*)*')


class ConfigError(ValueError):
    """A setting is missing, malformed or out of range; the message names it."""


def _names(owner: str, name: str, values: tuple[str, ...]) -> None:
    if any(not v for v in values):
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

    The outputs beside ``vla/action_chunk`` (``publish_joint_trajectory``,
    ``publish_twist``, ``publish_gripper``) carry only what is still to come when the chunk is
    published, never an action reached less than ``min_lead_s`` after the publication; their
    timing is in ``outputs``. A step whose joint state is older than
    ``max_state_age_s``, or stamped further than ``max_state_image_skew_s`` from its image, is
    refused (0 turns either check off).

    ``center_crop`` gives each of the robot's images OpenVLA's LIBERO center crop (the
    central 90% of the area resized back to 224x224) before the model sees it: the LIBERO
    fine-tunes of OpenVLA were trained on such crops and need it.

    ``camera_topics`` are the robot's cameras, relative to its namespace, the primary
    (third-person) camera first, then the others (wrist cameras) in the order the checkpoint
    takes them; each step carries one image of each, stamped within ``max_camera_skew_s`` of
    the primary's, and waits at most that long after the primary's image for the others
    (``camera_sync``). With ``image_transport: compressed`` each is subscribed with
    ``/compressed`` appended.
    """

    robot_id: str
    namespace: str = setting('', 'topic namespace (empty: the id)')
    priority: int = setting(0, 'higher runs first when enable_priority is on')
    period_s: float = setting(
        0.1,
        'control period (s); the target rate is 1/period_s',
        min_value=0.001,
        max_value=60.0,
        runtime=True,
    )
    trigger: str = setting(
        'periodic',
        'periodic: a step per period with the newest image; on_image: a step per new image',
        choices=TRIGGERS,
    )
    instruction: str = setting(
        '', 'language instruction until one arrives on vla/instruction', runtime=True
    )
    state_joint_names: tuple[str, ...] = setting(
        (), "joint_states names in the checkpoint's state order"
    )
    action_joint_names: tuple[str, ...] = setting(
        (), "names of the action columns (empty: the checkpoint's defaults)"
    )
    action_space: str = setting('ee_delta', 'meaning of the actions', choices=ACTION_SPACES)
    dt: float = setting(
        0.1, 'seconds between the actions of one chunk', min_value=1e-4, max_value=10.0
    )
    rtc: bool = setting(
        False,
        "real-time chunking: each step carries the robot's previous chunk still to run and "
        'the inference delay, and a flow-matching checkpoint guides the new chunk towards it',
    )
    frame_id: str = setting('base_link', 'frame_id of the published chunks')
    publish_joint_trajectory: bool = setting(
        False, 'also publish vla/joint_trajectory (needs action_space joint_position)'
    )
    joint_trajectory_start: str = setting(
        'now',
        'now: header.stamp is the publication time; on_receipt: header.stamp is zero, the '
        'controller starts the trajectory when it receives it',
        choices=TRAJECTORY_STARTS,
    )
    publish_twist: bool = setting(
        False,
        'also publish vla/twist, the current action as a TwistStamped for MoveIt Servo '
        '(needs action_space ee_delta)',
    )
    publish_gripper: bool = setting(
        False,
        "also publish vla/gripper, the current action's gripper value as a Float64 "
        '(needs action_space ee_delta)',
    )
    min_lead_s: float = setting(
        0.015,
        'no arm command holds an action reached less than this after its publication (s): '
        'transport to the controller and one controller period; a closer action is dropped '
        'and the next one sent, not clamped',
        min_value=0.0,
        max_value=1.0,
    )
    max_state_age_s: float = setting(
        0.5,
        'refuse a step whose joint state is older than this (s; 0: no limit)',
        min_value=0.0,
        max_value=60.0,
    )
    max_state_image_skew_s: float = setting(
        0.5,
        'refuse a step whose joint state and image stamps are further apart than this (s; '
        '0: no limit)',
        min_value=0.0,
        max_value=60.0,
    )
    image_transport: str = setting(
        'raw',
        'raw: camera/image_raw; compressed: camera/image_raw/compressed',
        choices=IMAGE_TRANSPORTS,
    )
    center_crop: bool = setting(
        False,
        "center-crop each image to 90% of its area and resize it back to 224x224, as OpenVLA's "
        'LIBERO evaluation does (needed by the LIBERO fine-tunes)',
    )
    camera_topics: tuple[str, ...] = setting(
        ('camera/image_raw',),
        "image topics relative to the robot's namespace, the primary camera first, then the "
        'others (wrist cameras); a step carries one image of each',
    )
    max_camera_skew_s: float = setting(
        0.05,
        "with several cameras: the most another camera's image may be stamped from the "
        "primary's (s)",
        min_value=0.001,
        max_value=10.0,
    )
    max_camera_wait_s: float = setting(
        0.2,
        "with several cameras: the longest a step waits for the other cameras' images after "
        "the primary's image arrived (s)",
        min_value=0.001,
        max_value=10.0,
    )

    def __post_init__(self) -> None:
        owner = f'robots.{self.robot_id}'
        if not isinstance(self.robot_id, str) or not _ROBOT_ID.fullmatch(self.robot_id):
            raise ConfigError(
                f'robot id {self.robot_id!r} must start with a letter and hold only letters, '
                'digits and underscores'
            )
        check_settings(self, error=ConfigError, prefix=owner)
        if self.namespace and not _NAMESPACE.fullmatch(self.namespace):
            raise ConfigError(f'{owner}.namespace {self.namespace!r} is not a valid namespace')
        _names(owner, 'state_joint_names', self.state_joint_names)
        _names(owner, 'camera_topics', self.camera_topics)
        if not 1 <= len(self.camera_topics) <= codec.MAX_ARRAYS_PER_FIELD:
            raise ConfigError(
                f'{owner}.camera_topics must list 1 to {codec.MAX_ARRAYS_PER_FIELD} topics, got '
                f'{list(self.camera_topics)}'
            )
        for topic in self.camera_topics:
            if not _RELATIVE_TOPIC.fullmatch(topic):
                raise ConfigError(
                    f'{owner}.camera_topics: {topic!r} is not a topic name relative to the '
                    "robot's namespace (letters, digits, underscores and '/', no leading '/')"
                )
        _names(owner, 'action_joint_names', self.action_joint_names)
        if self.publish_joint_trajectory and self.action_space != 'joint_position':
            raise ConfigError(
                f'{owner}.publish_joint_trajectory needs action_space joint_position '
                f'(a JointTrajectory holds positions), got {self.action_space!r}'
            )
        if self.publish_joint_trajectory and not self.action_joint_names:
            raise ConfigError(f'{owner}.publish_joint_trajectory needs action_joint_names')
        for name in ('publish_twist', 'publish_gripper'):
            if getattr(self, name) and self.action_space != 'ee_delta':
                raise ConfigError(
                    f'{owner}.{name} needs action_space ee_delta (its columns are x y z roll '
                    f'pitch yaw gripper), got {self.action_space!r}'
                )

    @property
    def topic_namespace(self) -> str:
        return self.namespace or self.robot_id

    @property
    def num_cameras(self) -> int:
        return len(self.camera_topics)

    def action_names(self, action_dim: int) -> tuple[str, ...]:
        """Column names for a chunk with ``action_dim`` values per action.

        Raises:
            ConfigError: ``action_joint_names`` is set but has another length, or an output
                that is on needs columns the actions lack (a twist 6, the gripper 7).
        """
        owner = f'robots.{self.robot_id}'
        if self.publish_twist and action_dim < NUM_TWIST_COLUMNS:
            raise ConfigError(
                f'{owner}.publish_twist needs at least {NUM_TWIST_COLUMNS} values per action '
                f'(x y z roll pitch yaw); the checkpoint returns {action_dim}'
            )
        if self.publish_gripper and action_dim <= GRIPPER_COLUMN:
            raise ConfigError(
                f'{owner}.publish_gripper needs the gripper in column {GRIPPER_COLUMN} of each '
                f'action; the checkpoint returns {action_dim} values per action'
            )
        if self.action_joint_names:
            if len(self.action_joint_names) != action_dim:
                raise ConfigError(
                    f'{owner}.action_joint_names has '
                    f'{len(self.action_joint_names)} names but the checkpoint returns '
                    f'{action_dim} values per action'
                )
            return self.action_joint_names
        if self.action_space == 'ee_delta' and action_dim == len(EE_DELTA_NAMES):
            return EE_DELTA_NAMES
        return tuple(f'a{j}' for j in range(action_dim))

    @property
    def trajectory_names_are_placeholders(self) -> bool:
        """Whether ``vla/joint_trajectory`` is on with joint names ``a0``, ``a1``, ... (the
        names a checkpoint's action columns get without ``action_joint_names``), which no
        JointTrajectoryController's joints are called."""
        names = self.action_joint_names
        return (
            self.publish_joint_trajectory
            and bool(names)
            and all(PLACEHOLDER_ACTION_NAME.fullmatch(n) for n in names)
        )


@dataclass(frozen=True, slots=True)
class DiagnosticsConfig:
    """When /diagnostics is published and what turns a status WARN or ERROR.

    A robot is silent (ERROR) when no camera image arrived for ``silent_robot_s``; its rate is
    low (WARN) below ``rate_warn_fraction`` of ``1 / period_s`` over the last ``window_s``.
    The scheduler is WARN when more than ``queue_warn_threshold`` steps wait. The engine sends
    its statistics every ``period_s`` too, so ``period_s`` is defined as its stats period.
    """

    period_s: float = setting_like(
        EngineConfig, 'stats_period_s', group='diagnostics', description='/diagnostics period (s)'
    )
    window_s: float = setting(
        5.0,
        'window for rates and recent events (s)',
        min_value=0.1,
        max_value=3600.0,
        group='diagnostics',
    )
    queue_warn_threshold: int = setting(
        16,
        'WARN above this many waiting steps',
        min_value=0,
        max_value=1 << 20,
        group='diagnostics',
    )
    rate_warn_fraction: float = setting(
        0.8,
        'WARN below this share of the target',
        min_value=0.01,
        max_value=1.0,
        group='diagnostics',
    )
    silent_robot_s: float = setting(
        3.0,
        'ERROR when no image came for this (s)',
        min_value=0.1,
        max_value=3600.0,
        group='diagnostics',
    )

    def __post_init__(self) -> None:
        check_settings(self, error=ConfigError)


@dataclass(frozen=True, slots=True)
class FrontendConfig:
    """Everything the node needs, validated as a whole.

    ``engine`` holds the engine's own settings; those without a parameter group
    (``late_policy``, ``max_instruction_bytes``, ``stats_period_s``, ``robots``) stay at their
    defaults here, since ``engine_config`` fills them in from this config. ``late_policy``
    'drop' answers a step that ends after its deadline with StepRejected (DEADLINE_MISSED);
    'deliver_late' publishes its chunk with ``late`` set. The node forwards ``late_policy``
    and ``max_instruction_bytes`` to the engine, so they are defined as the engine's.
    """

    robots: tuple[RobotConfig, ...]
    link: EngineLinkConfig = field(default_factory=EngineLinkConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    diagnostics: DiagnosticsConfig = field(default_factory=DiagnosticsConfig)
    step_budget_s: float = setting(
        0.5,
        'deadline = image stamp + this (s)',
        min_value=0.001,
        max_value=60.0,
        group='deadlines',
    )
    late_policy: str = setting_like(EngineConfig, 'late_policy', group='deadlines')
    engine_timeout_margin_s: float = setting(
        1.0,
        'a step the engine has not answered by its deadline plus this (s) is refused '
        '(ENGINE_TIMEOUT) and its robot sends its next one',
        min_value=0.001,
        max_value=60.0,
        group='deadlines',
    )
    max_instruction_bytes: int = setting_like(
        EngineConfig, 'max_instruction_bytes', group='limits'
    )
    # No image larger than a transport frame; the whole step (image, state, header) is
    # checked against the frame limit in __post_init__.
    max_image_pixels: int = setting(
        4096 * 4096,
        'largest accepted image (pixels; checked from compressed headers before decoding)',
        min_value=1,
        max_value=DEFAULT_MAX_MESSAGE_BYTES // 3,
        group='limits',
    )
    max_future_stamp_s: float = setting(
        1.0,
        'refuse an image stamped further ahead of the node clock than this (s)',
        min_value=0.0,
        max_value=3600.0,
        group='limits',
    )
    max_decode_s: float = setting(
        0.5,
        'abandon and refuse (MALFORMED_IMAGE) a compressed image whose decode runs longer '
        'than this (s)',
        min_value=0.001,
        max_value=60.0,
        group='limits',
    )

    def __post_init__(self) -> None:
        if not self.robots:
            raise ConfigError('robot_ids is empty: configure at least one robot')
        ids = [r.robot_id for r in self.robots]
        if len(set(ids)) != len(ids):
            raise ConfigError(f'robot_ids lists a robot twice: {ids}')
        spaces = [r.topic_namespace for r in self.robots]
        if len(set(spaces)) != len(spaces):
            raise ConfigError(f'two robots share a namespace: {spaces}')
        check_settings(self, error=ConfigError)
        set_by_node = [
            s.name
            for s in settings_of(EngineConfig)
            if not s.group and getattr(self.engine, s.name) != s.default
        ]
        if self.engine.robots:
            set_by_node.append('robots')
        if set_by_node:
            raise ConfigError(f'engine settings {sorted(set_by_node)} are set by the node')
        self._check_step_fits_a_frame()

    def largest_step_bytes(self) -> int:
        """Bytes of the largest step the node can send, counted as if it were one transport
        frame: an RGB image of ``max_image_pixels``, the longest configured state and the
        step header with an instruction of ``max_instruction_bytes`` and an image entry per
        camera of the robot with the most cameras (its array shapes counted at their widest).
        Each further camera's image travels in a frame of its own, which this bounds too."""
        num_state = max(len(r.state_joint_names) for r in self.robots)
        num_cameras = max(r.num_cameras for r in self.robots)
        return (
            self.max_image_pixels * 3
            + num_state * np.dtype(np.float32).itemsize
            + _step_header_bytes(self, num_images=num_cameras)
        )

    def _check_step_fits_a_frame(self) -> None:
        step_bytes = self.largest_step_bytes()
        if step_bytes <= DEFAULT_MAX_MESSAGE_BYTES:
            return
        spare = DEFAULT_MAX_MESSAGE_BYTES - (step_bytes - self.max_image_pixels * 3)
        raise ConfigError(
            f'limits.max_image_pixels = {self.max_image_pixels} ({self.max_image_pixels * 3} '
            f'bytes of RGB) with limits.max_instruction_bytes = {self.max_instruction_bytes} '
            f'and the longest state makes a step of {step_bytes} bytes, more than the '
            f"engine transport's frame limit of {DEFAULT_MAX_MESSAGE_BYTES} bytes; lower "
            f'limits.max_image_pixels to at most {max(0, spare // 3)}'
        )

    def robot(self, robot_id: str) -> RobotConfig:
        for robot in self.robots:
            if robot.robot_id == robot_id:
                return robot
        raise KeyError(robot_id)

    def engine_config(self) -> EngineConfig:
        """The engine's settings: ``engine`` plus what the node fills in.

        Robot priorities are sent only when priority scheduling is on (the scheduler refuses
        priorities it would not use), a robot's ``center_crop`` only when it is on; the
        engine's statistics come at the /diagnostics period.
        """
        robots = {}
        for robot in self.robots:
            settings: dict[str, int | bool] = {}
            if self.engine.enable_priority:
                settings['priority'] = robot.priority
            if robot.center_crop:
                settings['center_crop'] = True
            if settings:
                robots[robot.robot_id] = settings
        return dataclasses.replace(
            self.engine,
            robots=robots,
            stats_period_s=self.diagnostics.period_s,
            max_instruction_bytes=self.max_instruction_bytes,
            late_policy=self.late_policy,
        )


_SHAPE_SLACK_BYTES = 64  # msgpack ints of the widest image and state shapes, over zeros


def _step_header_bytes(config: FrontendConfig, *, num_images: int) -> int:
    """The encoded header of a step with ``num_images`` images, the longest robot id and
    instruction and the widest integers; its arrays are tiny here, so their shapes get
    ``_SHAPE_SLACK_BYTES`` per image."""
    widest = 2**63 - 1
    step = StepRequest(
        robot_id=max((r.robot_id for r in config.robots), key=len),
        step_seq=widest,
        stamp_ns=widest,
        deadline_ns=widest,
        received_ns=widest,
        images=(np.zeros((1, 1, 3), dtype=np.uint8),) * num_images,
        state=np.zeros(1, dtype=np.float32),
        instruction='x' * config.max_instruction_bytes,
        instruction_version=widest,
        priority=-widest,
    )
    header = codec.encode(step)[0]
    return len(header) + _SHAPE_SLACK_BYTES * num_images
