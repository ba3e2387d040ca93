"""Start one chunk executor per robot, each in its robot's namespace.

    ros2 launch vla_sched chunk_executor.launch.py robot_ids:=robot_0,robot_1
    ros2 launch vla_sched chunk_executor.launch.py robot_ids:=robot_0 namespace:=gpu0 \\
        params_file:=/path/to/chunk_executor.yaml use_sim_time:=true

Robot ``<id>``'s executor, ``/<namespace>/<id>/vla_chunk_executor``, plays
``/<namespace>/<id>/vla/action_chunk`` (as the vla_sched node under ``namespace`` publishes
it) to the controller topics of ``params_file`` (config/chunk_executor.yaml: a
JointTrajectoryController by default), relative to the robot's namespace. The arguments are
checked (vla_sched.ros.launch_args) before any executor starts.
"""

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, OpaqueFunction
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import Node
from launch_ros.substitutions import FindPackageShare

from vla_sched.ros.launch_args import (
    LOG_LEVELS,
    check_launch_arguments,
    chunk_executors,
    log_level_arguments,
)


def _executors(context) -> list:
    """The executor processes, returned only once the arguments passed their check."""
    names = ('robot_ids', 'namespace', 'params_file', 'use_sim_time', 'log_level')
    args = check_launch_arguments(
        {name: LaunchConfiguration(name).perform(context) for name in names}
    )
    return [
        Node(
            package='vla_sched',
            executable='vla_chunk_executor',
            name=executor.node_name,
            namespace=executor.namespace,
            parameters=[str(args.params_file), {'use_sim_time': args.use_sim_time}],
            ros_arguments=log_level_arguments(
                args.log_level, executor.namespace, executor.node_name
            ),
            output='screen',
        )
        for executor in chunk_executors(args)
    ]


def generate_launch_description():
    share = FindPackageShare('vla_sched')
    return LaunchDescription(
        [
            DeclareLaunchArgument(
                'robot_ids',
                default_value='robot_0',
                description='the robots to start an executor for (commas or spaces between)',
            ),
            DeclareLaunchArgument(
                'namespace', default_value='', description='namespace of the vla_sched node'
            ),
            DeclareLaunchArgument(
                'params_file',
                default_value=PathJoinSubstitution([share, 'config', 'chunk_executor.yaml']),
                description='parameters of every executor',
            ),
            DeclareLaunchArgument(
                'use_sim_time',
                default_value='false',
                description='the executors play on /clock (true or false, in any case)',
            ),
            DeclareLaunchArgument(
                'log_level',
                default_value='info',
                description="log level of the executors (their own loggers; rcl's stay at info)",
                choices=list(LOG_LEVELS),
            ),
            OpaqueFunction(function=_executors),
        ]
    )
