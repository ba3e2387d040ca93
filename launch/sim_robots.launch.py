"""Start N simulated robots, robot_0 .. robot_<N-1>, each under its own namespace.

    ros2 launch vla_sched sim_robots.launch.py num_sim_robots:=4 namespace:=fleet

Their ids must be among the node's ``robot_ids`` (config/vla_sched.yaml lists robot_0 ..
robot_3). The arguments are checked (vla_sched.ros.launch_args) before any robot starts.
vla_sched.launch.py starts the same robots itself, after checking all of its arguments.
"""

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, OpaqueFunction
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import Node

from vla_sched.ros.launch_args import (
    LOG_LEVELS,
    check_launch_arguments,
    log_level_arguments,
    sim_robots,
)


def _sim_robots(context) -> list:
    """The robot processes, returned only once the arguments passed their check."""
    names = ('num_sim_robots', 'namespace', 'sim_rate', 'use_sim_time', 'log_level')
    args = check_launch_arguments(
        {name: LaunchConfiguration(name).perform(context) for name in names}
    )
    return [
        Node(
            package='vla_sched',
            executable='vla_sim_robot',
            name=robot.node_name,
            namespace=robot.namespace,
            arguments=list(robot.arguments),
            parameters=[{'use_sim_time': args.use_sim_time}],
            ros_arguments=log_level_arguments(args.log_level, robot.namespace, robot.node_name),
            output='screen',
        )
        for robot in sim_robots(args)
    ]


def generate_launch_description():
    return LaunchDescription(
        [
            DeclareLaunchArgument(
                'num_sim_robots', default_value='0', description='simulated robots to start'
            ),
            DeclareLaunchArgument(
                'namespace', default_value='', description='namespace of the vla_sched node'
            ),
            DeclareLaunchArgument(
                'sim_rate', default_value='10.0', description='camera rate of each robot (Hz)'
            ),
            DeclareLaunchArgument(
                'use_sim_time',
                default_value='false',
                description='the robots follow /clock (true or false, in any case)',
            ),
            DeclareLaunchArgument(
                'log_level',
                default_value='info',
                description="log level of the robots (their own loggers; rcl's stay at info)",
                choices=list(LOG_LEVELS),
            ),
            OpaqueFunction(function=_sim_robots),
        ]
    )
