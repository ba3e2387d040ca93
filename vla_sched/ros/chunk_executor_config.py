"""Settings of the chunk executor node (``vla_chunk_executor``), one parameter each.

Every field is a setting (``vla_sched.settings``) and the executor's parameter of the same
name, declared read-only with its descriptor; ``config/chunk_executor.yaml`` documents them
all (a test checks that the two agree). Topic names are relative: the executor runs in its
robot's namespace, next to the robot's controllers.

Which chunks a sink can play: ``joint_trajectory`` takes ``joint_position`` chunks (the
actions are positions to reach); ``twist`` and the gripper take ``ee_delta`` chunks (the
deltas over dt, and the gripper column); ``none`` sends no arm command (the gripper alone).
A twist reads an ee_delta action's first 6 columns, the gripper its 7th (``min_columns``).
"""

from __future__ import annotations

from dataclasses import dataclass

from vla_sched.ros.node_config import GRIPPER_COLUMN, NUM_TWIST_COLUMNS, ConfigError
from vla_sched.settings import check_settings, setting

SINKS = ('joint_trajectory', 'twist', 'none')
BLENDING = ('off', 'temporal_ensemble')
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
        'off',
        'off: the newest chunk that covers the time is played alone; temporal_ensemble: '
        'every chunk that covers it is blended as ACT does, weights exp(-m * i), i = 0 for '
        'the oldest',
        choices=BLENDING,
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
        for name in ('chunk_topic', 'trajectory_topic', 'twist_topic', 'gripper_topic'):
            if not getattr(self, name).strip():
                raise ConfigError(f'{name} is empty')

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
