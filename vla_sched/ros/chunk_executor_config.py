"""Settings of the chunk executor node (``vla_chunk_executor``), one parameter each.

Every field is a setting (``vla_sched.settings``) and the executor's parameter of the same
name, declared read-only with its descriptor; ``config/chunk_executor.yaml`` documents them
all (a test checks that the two agree). Topic names are relative: the executor runs in its
robot's namespace, next to the robot's controllers.

Which chunks a sink can play: ``joint_trajectory`` takes ``joint_position`` chunks (the
actions are positions to reach); ``twist`` and the gripper take ``ee_delta`` chunks (the
deltas over dt, and the gripper column); ``none`` sends no arm command (the gripper alone).
A twist reads an ee_delta action's first 6 columns, the gripper its 7th (``min_columns``).

The safety gate (``safety_gate``, joint_position chunks only) takes each joint's limits from
``robot_description`` (a URDF string) and ``joint_limits`` (entries laid over it;
``urdf_limits``); a chunk joint named by neither is refused. Both are parsed here, without
I/O, so a bad one is a configuration error at start-up.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from vla_sched.ros.merge import MERGE_MODES, is_gripper
from vla_sched.ros.node_config import GRIPPER_COLUMN, NUM_TWIST_COLUMNS, ConfigError
from vla_sched.ros.safety_gate import GATE_MODES
from vla_sched.ros.urdf_limits import (
    JointLimits,
    combined_limits,
    limit_entries,
    urdf_joint_limits,
)
from vla_sched.settings import check_settings, setting

SINKS = ('joint_trajectory', 'twist', 'none')
BLENDING = MERGE_MODES
STARVATION_ACTIONS = ('hold', 'safe_position')
TRAJECTORY_POINTS = ('current', 'remaining')
TRAJECTORY_STARTS = ('now', 'on_receipt')
# The action space each sink plays (ActionChunk.ACTION_SPACE_* values).
SINK_ACTION_SPACES = {
    'joint_trajectory': ('joint_position',),
    'twist': ('ee_delta',),
    'none': ('ee_delta',),
}


@dataclass(frozen=True, slots=True)
class ChunkExecutorConfig:
    """What the executor plays, how it blends, and where it sends it (see the module
    docstring)."""

    sink: str = setting(
        'joint_trajectory',
        'where actions go: joint_trajectory (a JointTrajectoryController, joint_position '
        'chunks), twist (MoveIt Servo, ee_delta chunks) or none (only the gripper)',
        choices=SINKS,
    )
    publish_gripper: bool = setting(
        False,
        'also send the gripper column of ee_delta actions (std_msgs/Float64) on gripper_topic',
    )
    blending: str = setting(
        'aligned',
        'how a new chunk meets the one playing: latest (the new chunk from its start, now), '
        'aligned (by action timestamps, the past dropped; off is its former name), blend '
        '(a cross-fade over the overlap of the blend_joints), temporal_ensemble (ACT: every '
        'chunk that covers the time, weights exp(-m * i)), rtc (the new chunk after its frozen '
        'prefix); a gripper is never averaged',
        choices=BLENDING,
    )
    blend_joints: tuple[str, ...] = setting(
        (),
        'the joints (action columns) blend cross-fades; the others switch to the new chunk '
        'at once; no gripper',
    )
    ensemble_m: float = setting(
        0.01,
        "ACT's m of temporal_ensemble (larger: older chunks count less relative to the "
        'oldest; 0: a plain average)',
        min_value=0.0,
        max_value=100.0,
    )
    trajectory_points: str = setting(
        'current',
        'current: one point per tick (the current action, reached at the end of its '
        'interval); remaining: that point and every later action of the newest chunk',
        choices=TRAJECTORY_POINTS,
    )
    trajectory_start: str = setting(
        'now',
        'now: header.stamp is the tick time (executor and controller clocks must agree); '
        'on_receipt: header.stamp is zero and the controller starts on receipt',
        choices=TRAJECTORY_STARTS,
    )
    chunk_topic: str = setting('vla/action_chunk', 'the ActionChunk topic to play')
    trajectory_topic: str = setting(
        'joint_trajectory_controller/joint_trajectory',
        'trajectory_msgs/JointTrajectory topic of the controller (sink joint_trajectory)',
    )
    twist_topic: str = setting(
        'servo_node/delta_twist_cmds',
        'geometry_msgs/TwistStamped topic of MoveIt Servo (sink twist)',
    )
    gripper_topic: str = setting(
        'gripper/command', 'std_msgs/Float64 topic of the gripper (publish_gripper)'
    )
    min_chunk_dt_s: float = setting(
        1e-4,
        'skip a chunk whose dt (rounded to whole microseconds) is below this (s)',
        min_value=1e-6,
        max_value=10.0,
    )
    max_chunk_dt_s: float = setting(
        10.0,
        'skip a chunk whose dt is above this (s)',
        min_value=1e-6,
        max_value=3600.0,
    )
    max_stamp_skew_s: float = setting(
        1.0,
        'skip a chunk stamped further ahead of the executor clock than this (s): the clock '
        'skew tolerated between the robot, the vla_sched node and the executor',
        min_value=0.0,
        max_value=3600.0,
    )
    min_lead_s: float = setting(
        0.015,
        'no point is sent to be reached less than this after its tick (s): transport to the '
        'controller and one controller period; a closer action is dropped, the next one sent',
        min_value=0.0,
        max_value=1.0,
    )
    starvation_timeout_s: float = setting(
        1.0,
        'after holding this long with no action left (s), do what starvation_action says',
        min_value=0.0,
        max_value=3600.0,
    )
    starvation_action: str = setting(
        'hold',
        'hold: keep holding the last position; safe_position: move to safe_position in '
        'safe_position_time_s (sink joint_trajectory, checked by the safety gate when on)',
        choices=STARVATION_ACTIONS,
    )
    safe_position: tuple[str, ...] = setting(
        (), "the safe position, one 'joint=value' entry per joint (starvation_action)"
    )
    safe_position_time_s: float = setting(
        3.0,
        'the time given to reach the safe position (s)',
        min_value=0.01,
        max_value=600.0,
    )
    safety_gate: str = setting(
        'off',
        'check each joint_position chunk against the measured joint state and the limits '
        'before keeping it: off, clip (move it within them, refuse it if that fails) or '
        'refuse',
        choices=GATE_MODES,
    )
    joint_limits: tuple[str, ...] = setting(
        (),
        "per joint: 'name lower=.. upper=.. velocity=.. acceleration=..' (any of the four; "
        'laid over robot_description; a field given nowhere is unlimited)',
    )
    robot_description: str = setting(
        '', "the robot's URDF (its joint limits: position and velocity); empty: none"
    )
    joint_state_topic: str = setting(
        'joint_states', 'sensor_msgs/JointState topic of the measured positions (safety_gate)'
    )
    max_joint_state_age_s: float = setting(
        0.5,
        'the safety gate refuses a chunk when the joint state is older than this (s, on receipt)',
        min_value=0.001,
        max_value=60.0,
    )
    diagnostics_period_s: float = setting(
        1.0, 'seconds between two /diagnostics reports', min_value=0.05, max_value=60.0
    )

    def __post_init__(self) -> None:
        check_settings(self, error=ConfigError)
        if self.publish_gripper and 'ee_delta' not in SINK_ACTION_SPACES[self.sink]:
            raise ConfigError(
                f'publish_gripper needs ee_delta chunks, which sink {self.sink} does not play'
            )
        if self.min_chunk_dt_s > self.max_chunk_dt_s:
            raise ConfigError(
                f'min_chunk_dt_s {self.min_chunk_dt_s} is above max_chunk_dt_s '
                f'{self.max_chunk_dt_s}'
            )
        topics = ('chunk_topic', 'trajectory_topic', 'twist_topic', 'gripper_topic')
        for name in (*topics, 'joint_state_topic'):
            if not getattr(self, name).strip():
                raise ConfigError(f'{name} is empty')
        grippers = [name for name in self.blend_joints if is_gripper(name)]
        if grippers:
            raise ConfigError(f'blend_joints {grippers}: a gripper is never blended')
        limits = self.limits()
        if self.safety_gate != 'off' and self.sink != 'joint_trajectory':
            raise ConfigError(
                f'safety_gate {self.safety_gate} checks joint_position chunks: sink '
                f'{self.sink} plays ee_delta'
            )
        if self.starvation_action == 'safe_position':
            self._check_safe_position(limits)

    def _check_safe_position(self, limits: dict[str, JointLimits]) -> None:
        if self.sink != 'joint_trajectory':
            raise ConfigError('starvation_action safe_position needs sink joint_trajectory')
        position = self.safe_joint_position()
        if not position:
            raise ConfigError('starvation_action safe_position needs safe_position entries')
        for name, value in position:
            lim = limits.get(name)
            if lim is not None and not lim.lower <= value <= lim.upper:
                raise ConfigError(
                    f'safe_position {name}={value} is outside its limits '
                    f'[{lim.lower}, {lim.upper}]'
                )

    def limits(self) -> dict[str, JointLimits]:
        """Each joint's limits: ``robot_description``'s with ``joint_limits`` laid over them.

        Raises:
            ConfigError: either cannot be read, or a joint's limits do not make sense.
        """
        try:
            urdf = urdf_joint_limits(self.robot_description) if self.robot_description else {}
            return combined_limits(urdf, limit_entries(self.joint_limits))
        except ValueError as exc:
            raise ConfigError(str(exc)) from None

    def safe_joint_position(self) -> tuple[tuple[str, float], ...]:
        """``safe_position`` as (joint, value) pairs.

        Raises:
            ConfigError: an entry is not 'joint=value' with a finite value, or a joint repeats.
        """
        pairs = []
        for entry in self.safe_position:
            name, sep, text = entry.partition('=')
            try:
                value = float(text)
            except ValueError:
                value = math.nan
            if not sep or not name.strip() or not math.isfinite(value):
                raise ConfigError(f"safe_position entry {entry!r} is not 'joint=<number>'")
            pairs.append((name.strip(), value))
        names = [name for name, _ in pairs]
        if len(set(names)) != len(names):
            raise ConfigError(f'safe_position repeats a joint: {names}')
        return tuple(pairs)

    @property
    def action_spaces(self) -> tuple[str, ...]:
        """The action spaces of the chunks this configuration plays."""
        return SINK_ACTION_SPACES[self.sink]

    @property
    def min_columns(self) -> int:
        """The action columns the sink and the gripper read: 6 for a twist, 7 with the
        gripper, 1 otherwise."""
        columns = NUM_TWIST_COLUMNS if self.sink == 'twist' else 1
        if self.publish_gripper:
            columns = max(columns, GRIPPER_COLUMN + 1)
        return columns
