"""Start N simulated robots, robot_0 .. robot_<N-1>, each under its own namespace.

    ros2 launch vla_sched sim_robots.launch.py num_sim_robots:=4 namespace:=fleet

Their ids must be among the node's ``robot_ids`` (config/vla_sched.yaml lists robot_0 ..
robot_3). vla_sched.launch.py and vla_sched.launch.xml include this file.
"""

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, OpaqueFunction
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import Node


def _sim_robots(context):
    count = int(LaunchConfiguration('num_sim_robots').perform(context))
    if count < 0:
        raise ValueError(f'num_sim_robots must be >= 0, got {count}')
    namespace = LaunchConfiguration('namespace').perform(context).strip('/')
    rate = LaunchConfiguration('sim_rate').perform(context)
    robots = []
    for index in range(count):
        robot_id = f'robot_{index}'
        robots.append(
            Node(
                package='vla_sched',
                executable='vla_sim_robot',
                name=f'sim_{robot_id}',
                namespace=f'/{namespace}/{robot_id}' if namespace else f'/{robot_id}',
                arguments=['--robot-id', robot_id, '--rate', rate, '--report-period', '5'],
                output='screen',
            )
        )
    return robots


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
            OpaqueFunction(function=_sim_robots),
        ]
    )
