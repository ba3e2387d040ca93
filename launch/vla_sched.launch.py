"""Bring up the vla_sched node, optionally with simulated robots and diagnostic_aggregator.

    ros2 launch vla_sched vla_sched.launch.py
    ros2 launch vla_sched vla_sched.launch.py num_sim_robots:=4 start_aggregator:=true
    ros2 launch vla_sched vla_sched.launch.py params_file:=/path/to/params.yaml namespace:=gpu0
    ros2 launch vla_sched vla_sched.launch.py use_sim_time:=true log_level:=debug
    ros2 launch vla_sched vla_sched.launch.py autostart:=false
    ros2 launch vla_sched vla_sched.launch.py --show-args

Every argument is checked (vla_sched.ros.launch_args) before any process starts: a bad one
ends the launch with a message naming it, and nothing is left running. vla_sched.launch.xml
includes this file.

The vla_sched node is a lifecycle node, started with ``--managed`` on its command line (not
a parameter, so that ``ros2 param dump`` of it starts a node on its own that serves): it
waits for its transitions, and this file configures it once it runs (the engine starts and
loads the model) and activates it once it is configured; ``autostart:=false`` leaves it
configured but inactive, refusing every step, until ``ros2 lifecycle set /vla_sched
activate`` (``/<namespace>/vla_sched`` under a namespace).

``log_level`` sets each started node's own loggers (the vla_sched node's Python loggers
too); rcl and the middleware stay at info.
"""

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, EmitEvent, OpaqueFunction, RegisterEventHandler
from launch.events import matches_action
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import LifecycleNode, Node
from launch_ros.event_handlers import OnStateTransition
from launch_ros.events.lifecycle import ChangeState
from launch_ros.substitutions import FindPackageShare
from lifecycle_msgs.msg import Transition

from vla_sched.ros.launch_args import (
    LOG_LEVELS,
    MANAGED_FLAG,
    check_launch_arguments,
    log_level_arguments,
    sim_robots,
)


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
            description='start diagnostic_aggregator (/diagnostics_agg for rqt_robot_monitor; '
            'true or false, in any case)',
        ),
        DeclareLaunchArgument(
            'analyzers_file',
            default_value=PathJoinSubstitution([share, 'config', 'diagnostics_analyzers.yaml']),
            description='analyzers of diagnostic_aggregator',
        ),
        DeclareLaunchArgument(
            'use_sim_time',
            default_value='false',
            description='every node started here follows /clock (true or false, in any case)',
        ),
        DeclareLaunchArgument(
            'log_level',
            default_value='info',
            description="log level of each node started here (its own loggers; rcl's stay "
            'at info)',
            choices=list(LOG_LEVELS),
        ),
        DeclareLaunchArgument(
            'autostart',
            default_value='true',
            description='true: take the vla_sched node to active; false: configure it only '
            '(inactive, every step refused until ros2 lifecycle set <node> activate; true or '
            'false, in any case)',
        ),
    ]


def _bring_up(context) -> list:
    """The processes, returned only once every argument passed its check."""
    names = ('params_file', 'namespace', 'num_sim_robots', 'sim_rate', 'start_aggregator')
    names += ('analyzers_file', 'use_sim_time', 'log_level', 'autostart')
    values = {name: LaunchConfiguration(name).perform(context) for name in names}
    args = check_launch_arguments(values)
    sim_time = {'use_sim_time': args.use_sim_time}
    node = LifecycleNode(
        package='vla_sched',
        executable='vla_sched_node',
        name='vla_sched',
        namespace=args.namespace,
        # Managed: it waits for the transitions this file drives (_lifecycle); its autostart
        # parameter stays as given, so a dump of its parameters starts a node that serves.
        arguments=[MANAGED_FLAG],
        parameters=[str(args.params_file), sim_time],
        ros_arguments=log_level_arguments(args.log_level, args.namespace, 'vla_sched'),
        output='screen',
    )
    actions = _lifecycle(node, activate=args.autostart)
    if args.start_aggregator:
        actions.append(
            Node(
                package='diagnostic_aggregator',
                executable='aggregator_node',
                name='analyzers',
                parameters=[str(args.analyzers_file), sim_time],
                ros_arguments=log_level_arguments(args.log_level, '', 'analyzers'),
                output='screen',
            )
        )
    for robot in sim_robots(args):
        actions.append(
            Node(
                package='vla_sched',
                executable='vla_sim_robot',
                name=robot.node_name,
                namespace=robot.namespace,
                arguments=list(robot.arguments),
                parameters=[sim_time],
                ros_arguments=log_level_arguments(
                    args.log_level, robot.namespace, robot.node_name
                ),
                output='screen',
            )
        )
    return actions


def _lifecycle(node: LifecycleNode, *, activate: bool) -> list:
    """Start ``node`` and configure it once it runs; with ``activate``, activate it once a
    configure has brought it to inactive (the handler is registered before the node starts).
    Launch waits for the node's lifecycle services and logs a transition that fails."""
    configure = _change(node, Transition.TRANSITION_CONFIGURE)
    if not activate:
        return [node, configure]
    activate_once_configured = RegisterEventHandler(
        OnStateTransition(
            target_lifecycle_node=node,
            start_state='configuring',
            goal_state='inactive',
            entities=[_change(node, Transition.TRANSITION_ACTIVATE)],
            handle_once=True,
        )
    )
    return [activate_once_configured, node, configure]


def _change(node: LifecycleNode, transition_id: int) -> EmitEvent:
    """Ask ``node`` to take a transition, as ``ros2 lifecycle set`` does."""
    return EmitEvent(
        event=ChangeState(lifecycle_node_matcher=matches_action(node), transition_id=transition_id)
    )


def generate_launch_description():
    share = FindPackageShare('vla_sched')
    return LaunchDescription([*_arguments(share), OpaqueFunction(function=_bring_up)])
