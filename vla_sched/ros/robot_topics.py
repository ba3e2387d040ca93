"""One robot's topics on the node: what it subscribes and what it publishes.

Under the robot's namespace the node subscribes each of its ``camera_topics`` (by default
``camera/image_raw``; sensor-data QoS; with the compressed transport ``<topic>/compressed``),
``joint_states`` (only for a robot with ``state_joint_names``: a robot that sends no state to
the checkpoint costs no wake-up per joint state) and ``vla/instruction`` (transient local),
and publishes ``vla/action_chunk``,
``vla/step_rejected`` and, if enabled, the arm's commands ``vla/joint_trajectory``,
``vla/twist`` and ``vla/gripper`` (see ``outputs``).

A chunk and the arm's commands are for control: the newest one wins and an old one is worth
nothing, so their publishers keep one message (depth 1, reliable, volatile) whose lifespan is
the step budget: DDS drops a chunk older than that instead of delivering it late (judged on
the publication's source time, so the hosts' clocks must agree). They are lifecycle
publishers: they publish only while the node is active. ``vla/step_rejected`` keeps the
default depth of 10 (each refusal is an event of its own) and publishes in every state, so a
robot is told why an inactive node refuses its steps.

No subscription or publisher has QoS event handlers: rclpy's executor walks every handler on
every wake-up, two per endpoint by default. A camera or instruction publisher that cannot
reach the node (wrong type, incompatible QoS) is found in the graph instead
(``topic_check.PublisherCheck`` over ``watched``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from geometry_msgs.msg import TwistStamped
from rclpy.duration import Duration
from rclpy.event_handler import PublisherEventCallbacks, SubscriptionEventCallbacks
from rclpy.lifecycle import LifecycleNode
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
from rclpy.qos import qos_profile_sensor_data as sensor_qos
from sensor_msgs.msg import CompressedImage, Image, JointState
from std_msgs.msg import Float64, String
from trajectory_msgs.msg import JointTrajectory

from vla_sched.msg import ActionChunk, StepRejected
from vla_sched.ros.outputs import ArmCommands
from vla_sched.ros.robot_slot import RobotSlot
from vla_sched.ros.topic_check import WatchedTopic, type_name

LATCHED = QoSProfile(
    depth=1, reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.TRANSIENT_LOCAL
)


def control_qos(lifespan_s: float | None = None) -> QoSProfile:
    """The QoS of the chunks and the arm's commands: the newest one, reliable, volatile,
    dropped once ``lifespan_s`` old (see the module docstring). Without ``lifespan_s``: a
    subscriber's or a controller's side, which needs no lifespan to match."""
    qos = QoSProfile(
        history=HistoryPolicy.KEEP_LAST,
        depth=1,
        reliability=ReliabilityPolicy.RELIABLE,
        durability=DurabilityPolicy.VOLATILE,
    )
    if lifespan_s is not None:
        qos.lifespan = Duration(nanoseconds=round(lifespan_s * 1e9))
    return qos


def quiet_publisher() -> PublisherEventCallbacks:
    """Publisher options without QoS event handlers (see the module docstring)."""
    return PublisherEventCallbacks(use_default_callbacks=False)


def quiet_subscription() -> SubscriptionEventCallbacks:
    """Subscription options without QoS event handlers (see the module docstring)."""
    return SubscriptionEventCallbacks(use_default_callbacks=False)


class RobotTopics:
    """One robot's subscriptions and publishers on ``node`` (see the module docstring).

    The callbacks get the robot's slot and the message; ``on_image`` also gets
    ``compressed`` (True for the compressed transport) and ``camera``, the camera's place in
    the robot's ``camera_topics`` (0: the primary). ``output_lifespan_s`` is the lifespan
    of the chunks and the arm's commands (the step budget).
    """

    def __init__(
        self,
        node: LifecycleNode,
        slot: RobotSlot,
        *,
        on_image: Callable[..., Any],
        on_joints: Callable[[RobotSlot, Any], Any],
        on_instruction: Callable[[RobotSlot, Any], Any],
        output_lifespan_s: float,
    ) -> None:
        config = slot.config
        ns = config.topic_namespace
        quiet = quiet_publisher()
        control = control_qos(output_lifespan_s)

        def control_publisher(msg_type: type, name: str, on: bool = True):
            if not on:
                return None
            return node.create_lifecycle_publisher(
                msg_type, f'{ns}/vla/{name}', control, event_callbacks=quiet
            )

        self.chunks = control_publisher(ActionChunk, 'action_chunk')
        self.rejected = node.create_publisher(
            StepRejected, f'{ns}/vla/step_rejected', 10, event_callbacks=quiet
        )
        self.trajectory = control_publisher(
            JointTrajectory, 'joint_trajectory', config.publish_joint_trajectory
        )
        self.twist = control_publisher(TwistStamped, 'twist', config.publish_twist)
        self.gripper = control_publisher(Float64, 'gripper', config.publish_gripper)
        compressed = slot.config.image_transport == 'compressed'
        cameras = [
            node.create_subscription(
                CompressedImage if compressed else Image,
                f'{ns}/{topic}/compressed' if compressed else f'{ns}/{topic}',
                functools.partial(on_image, slot, compressed=compressed, camera=camera),
                sensor_qos,
                event_callbacks=quiet_subscription(),
            )
            for camera, topic in enumerate(config.camera_topics)
        ]
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
            for sub, qos in (*((c, sensor_qos) for c in cameras), (instruction, LATCHED))
        )

    @property
    def drives_arm(self) -> bool:
        """Whether any of the arm's commands is published."""
        return any(pub is not None for pub in (self.trajectory, self.twist, self.gripper))

    def publish_arm(self, commands: ArmCommands) -> None:
        for pub, msg in (
            (self.trajectory, commands.trajectory),
            (self.twist, commands.twist),
            (self.gripper, commands.gripper),
        ):
            if pub is not None and msg is not None:
                pub.publish(msg)
