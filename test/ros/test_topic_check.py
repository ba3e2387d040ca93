"""Publishers that can never reach the node's subscriptions are found in the ROS graph: a
wrong message type or an incompatible QoS, each publisher reported once, good ones never."""

from __future__ import annotations

import time

import pytest
import rclpy
from rclpy.qos import qos_profile_sensor_data as sensor_qos
from sensor_msgs.msg import Image
from std_msgs.msg import String

from vla_sched.ros.robot_topics import LATCHED, quiet_subscription
from vla_sched.ros.topic_check import PublisherCheck, WatchedTopic, type_name

pytestmark = pytest.mark.ros
WAIT_S = 30.0  # only a graph that never updates reaches this
CAMERA = '/checked_robot/camera/image_raw'
INSTRUCTION = '/checked_robot/vla/instruction'


@pytest.fixture
def graph():
    """The node and two robots, each in a context of its own as in processes of their own
    (one process cannot publish two types on a topic): ``(node, robot, other_robot)``."""
    contexts = [rclpy.Context() for _ in range(3)]
    for context in contexts:
        rclpy.init(args=[], context=context)
    names = ('checked_node', 'checked_robot', 'other_robot')
    nodes = [rclpy.create_node(n, context=c) for n, c in zip(names, contexts, strict=True)]
    try:
        yield tuple(nodes)
    finally:
        for node in nodes:
            node.destroy_node()
        for context in contexts:
            context.try_shutdown()


def _check(node) -> PublisherCheck:
    watched = []
    for topic, msg_type, qos in ((CAMERA, Image, sensor_qos), (INSTRUCTION, String, LATCHED)):
        sub = node.create_subscription(
            msg_type, topic, lambda msg: None, qos, event_callbacks=quiet_subscription()
        )
        watched.append(WatchedTopic(sub.topic_name, type_name(sub.msg_type), qos))
    return PublisherCheck(
        watched,
        count_publishers=node.count_publishers,
        publishers_info=node.get_publishers_info_by_topic,
    )


def _wait_publishers(node, topic: str, count: int) -> None:
    end = time.monotonic() + WAIT_S
    while node.count_publishers(topic) != count and time.monotonic() < end:
        time.sleep(0.02)  # the graph has no event to wait for from Python
    assert node.count_publishers(topic) == count


def test_type_names_are_the_graphs():
    assert type_name(Image) == 'sensor_msgs/msg/Image'
    assert type_name(String) == 'std_msgs/msg/String'


def test_a_wrong_type_and_a_volatile_instruction_are_reported_once_each(graph):
    node, robot, _ = graph
    check = _check(node)
    assert check.new_problems() == []
    robot.create_publisher(String, CAMERA, sensor_qos)  # a camera of the wrong type
    robot.create_publisher(String, INSTRUCTION, 10)  # volatile: never reaches a latched sub
    _wait_publishers(node, CAMERA, 1)
    _wait_publishers(node, INSTRUCTION, 1)
    problems = check.new_problems()
    assert len(problems) == 2, problems
    camera, instruction = problems
    # The publisher's node is named once the graph has discovered it.
    assert camera.startswith(f'{CAMERA}: publisher ')
    assert 'offers type std_msgs/msg/String, the node subscribes sensor_msgs/msg/Image' in camera
    assert instruction.startswith(f'{INSTRUCTION}: publisher ')
    assert 'has a QoS the node cannot receive' in instruction
    assert 'transient local' in instruction.lower()
    assert check.new_problems() == []


def test_publishers_that_reach_the_node_are_never_reported(graph):
    node, robot, other_robot = graph
    check = _check(node)
    robot.create_publisher(Image, CAMERA, sensor_qos)
    robot.create_publisher(String, INSTRUCTION, LATCHED)
    _wait_publishers(node, CAMERA, 1)
    _wait_publishers(node, INSTRUCTION, 1)
    assert check.new_problems() == []
    other_robot.create_publisher(String, CAMERA, sensor_qos)  # a wrong one comes later
    _wait_publishers(node, CAMERA, 2)
    problems = check.new_problems()
    assert len(problems) == 1 and 'offers type std_msgs/msg/String' in problems[0]
