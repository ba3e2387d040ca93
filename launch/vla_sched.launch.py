"""Bring up the vla_sched node, optionally with simulated robots and diagnostic_aggregator.

    ros2 launch vla_sched vla_sched.launch.py
    ros2 launch vla_sched vla_sched.launch.py num_sim_robots:=4 start_aggregator:=true
    ros2 launch vla_sched vla_sched.launch.py params_file:=/path/to/params.yaml namespace:=gpu0

vla_sched.launch.xml does the same.
"""

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, IncludeLaunchDescription
from launch.conditions import IfCondition
from launch.launch_description_sources import PythonLaunchDescriptionSource
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import Node
from launch_ros.substitutions import FindPackageShare


def _arguments(share) -> list:
    return [
        DeclareLaunchArgument(
            'params_file',
            default_value=PathJoinSubstitution([share, 'config', 'vla_sched.yaml']),
            description='parameters of the vla_sched node',
        ),
        DeclareLaunchArgument(
            'namespace', default_value='', description='namespace of the node and robots'
        ),
        DeclareLaunchArgument(
            'num_sim_robots', default_value='0', description='simulated robots to start'
        ),
        DeclareLaunchArgument(
            'sim_rate', default_value='10.0', description='camera rate of each robot (Hz)'
        ),
        DeclareLaunchArgument(
            'start_aggregator',
            default_value='false',
            description='start diagnostic_aggregator (/diagnostics_agg for rqt_robot_monitor)',
        ),
        DeclareLaunchArgument(
            'analyzers_file',
            default_value=PathJoinSubstitution([share, 'config', 'diagnostics_analyzers.yaml']),
            description='analyzers of diagnostic_aggregator',
        ),
    ]


def generate_launch_description():
    share = FindPackageShare('vla_sched')
    namespace = LaunchConfiguration('namespace')
    node = Node(
        package='vla_sched',
        executable='vla_sched_node',
        name='vla_sched',
        namespace=namespace,
        parameters=[LaunchConfiguration('params_file')],
        output='screen',
    )
    aggregator = Node(
        package='diagnostic_aggregator',
        executable='aggregator_node',
        name='analyzers',
        parameters=[LaunchConfiguration('analyzers_file')],
        condition=IfCondition(LaunchConfiguration('start_aggregator')),
        output='screen',
    )
    sim_robots = IncludeLaunchDescription(
        PythonLaunchDescriptionSource(
            PathJoinSubstitution([share, 'launch', 'sim_robots.launch.py'])
        ),
        launch_arguments={
            'num_sim_robots': LaunchConfiguration('num_sim_robots'),
            'namespace': namespace,
            'sim_rate': LaunchConfiguration('sim_rate'),
        }.items(),
    )
    return LaunchDescription([*_arguments(share), node, aggregator, sim_robots])
