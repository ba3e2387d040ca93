"""One robot's topics on the node: what it subscribes and what it publishes.

Under the robot's namespace the node subscribes ``camera/image_raw`` (sensor-data QoS; or
``camera/image_raw/compressed``), ``joint_states`` (only for a robot with
``state_joint_names``: a robot that sends no state to the checkpoint costs no wake-up per
joint state) and ``vla/instruction`` (transient local), and publishes ``vla/action_chunk``,
``vla/step_rejected`` and, if enabled, ``vla/joint_trajectory``.

No subscription or publisher has QoS event handlers: rclpy's executor walks every handler on
every wake-up, two per endpoint by default. A camera or instruction publisher that cannot
reach the node (wrong type, incompatible QoS) is found in the graph instead
(``topic_check.PublisherCheck`` over ``watched``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rclpy.event_handler import PublisherEventCallbacks, SubscriptionEventCallbacks
from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
from rclpy.qos import qos_profile_sensor_data as sensor_qos
from sensor_msgs.msg import CompressedImage, Image, JointState
from std_msgs.msg import String
from trajectory_msgs.msg import JointTrajectory

from vla_sched.msg import ActionChunk, StepRejected
from vla_sched.ros.robot_slot import RobotSlot
from vla_sched.ros.topic_check import WatchedTopic, type_name

LATCHED = QoSProfile(
    depth=1, reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.TRANSIENT_LOCAL
)


def quiet_publisher() -> PublisherEventCallbacks:
    """Publisher options without QoS event handlers (see the module docstring)."""
    return PublisherEventCallbacks(use_default_callbacks=False)


def quiet_subscription() -> SubscriptionEventCallbacks:
    """Subscription options without QoS event handlers (see the module docstring)."""
    return SubscriptionEventCallbacks(use_default_callbacks=False)


class RobotTopics:
    """One robot's subscriptions and publishers on ``node`` (see the module docstring).

    The callbacks get the robot's slot and the message; ``on_image`` also gets
    ``compressed`` (True for the compressed transport).
    """

    def __init__(
        self,
        node: Node,
        slot: RobotSlot,
        *,
        on_image: Callable[..., Any],
        on_joints: Callable[[RobotSlot, Any], Any],
        on_instruction: Callable[[RobotSlot, Any], Any],
    ) -> None:
        ns = slot.config.topic_namespace
        quiet = quiet_publisher()
        self.chunks = node.create_publisher(
            ActionChunk, f'{ns}/vla/action_chunk', 10, event_callbacks=quiet
        )
        self.rejected = node.create_publisher(
            StepRejected, f'{ns}/vla/step_rejected', 10, event_callbacks=quiet
        )
        self.trajectory = None
        if slot.config.publish_joint_trajectory:
            self.trajectory = node.create_publisher(
                JointTrajectory, f'{ns}/vla/joint_trajectory', 10, event_callbacks=quiet
            )
        if slot.config.image_transport == 'compressed':
            camera = node.create_subscription(
                CompressedImage,
                f'{ns}/camera/image_raw/compressed',
                lambda msg: on_image(slot, msg, compressed=True),
                sensor_qos,
                event_callbacks=quiet_subscription(),
            )
        else:
            camera = node.create_subscription(
                Image,
                f'{ns}/camera/image_raw',
                lambda msg: on_image(slot, msg, compressed=False),
                sensor_qos,
                event_callbacks=quiet_subscription(),
            )
        if slot.config.state_joint_names:
            node.create_subscription(
                JointState,
                f'{ns}/joint_states',
                lambda msg: on_joints(slot, msg),
                sensor_qos,
                event_callbacks=quiet_subscription(),
            )
        instruction = node.create_subscription(
            String,
            f'{ns}/vla/instruction',
            lambda msg: on_instruction(slot, msg),
            LATCHED,
            event_callbacks=quiet_subscription(),
        )
        self.watched = tuple(
            WatchedTopic(sub.topic_name, type_name(sub.msg_type), qos)
            for sub, qos in ((camera, sensor_qos), (instruction, LATCHED))
        )
