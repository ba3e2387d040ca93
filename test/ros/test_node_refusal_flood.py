"""The refusal flood is bounded: a robot that sends bad joint_states or images message after
message gets one StepRejected per reason per period, not one per message, and /diagnostics
counts every refused message."""

from __future__ import annotations

import math
import time
from collections import defaultdict

import numpy as np
import pytest
import rclpy
from diagnostic_msgs.msg import DiagnosticArray
from rclpy.executors import SingleThreadedExecutor
from rclpy.parameter import Parameter
from rclpy.qos import qos_profile_sensor_data as sensor_qos
from sensor_msgs.msg import Image, JointState

from vla_sched.msg import StepRejected
from vla_sched.ros.conversions import ns_to_stamp, rgb_to_image
from vla_sched.ros.node import VlaSchedNode

pytestmark = pytest.mark.ros

WAIT_S = 30.0  # only a hang reaches this
NUM_BAD = 60
ROBOT = '/vla_sched: robot robot_0'


class Flooded:
    """A node (autostart off: no engine is needed to refuse inputs) with one robot whose
    period is a minute, and a fake robot that sends it bad messages one at a time."""

    def __init__(self) -> None:
        self.context = rclpy.Context()
        rclpy.init(args=[], context=self.context)
        params = {
            'autostart': False,
            'robot_ids': ['robot_0'],
            'robot_defaults.period_s': 60.0,
            'robot_defaults.state_joint_names': ['j1', 'j2'],
            'robot_defaults.instruction': 'pick up the red block',
        }
        self.node = VlaSchedNode(
            parameter_overrides=[Parameter(k, value=v) for k, v in params.items()],
            context=self.context,
        )
        self.slot = self.node.slots['robot_0']
        self.robot = rclpy.create_node('fake_robot', context=self.context)
        self.executor = SingleThreadedExecutor(context=self.context)
        self.executor.add_node(self.node)
        self.executor.add_node(self.robot)
        self.got: dict[str, list] = defaultdict(list)
        self.robot.create_subscription(
            StepRejected, '/robot_0/vla/step_rejected', self.got['rejected'].append, 100
        )
        self.robot.create_subscription(
            DiagnosticArray, '/diagnostics', self.got['diagnostics'].append, 10
        )
        self.joints = self.robot.create_publisher(JointState, '/robot_0/joint_states', 10)
        self.camera = self.robot.create_publisher(Image, '/robot_0/camera/image_raw', sensor_qos)
        assert self.spin_until(
            lambda: self.joints.get_subscription_count() and self.camera.get_subscription_count()
        )

    def spin_until(self, predicate, timeout_s: float = WAIT_S) -> bool:
        end = time.monotonic() + timeout_s
        while not predicate() and time.monotonic() < end:
            self.executor.spin_once(timeout_sec=0.02)
        return bool(predicate())

    def refused(self, reason: str) -> int:
        return self.slot.refused_by_reason[reason]

    def send_until_refused(self, publish, reason: str, count: int) -> None:
        """Publish bad messages until the node has refused ``count`` of them (one at a time:
        a message lost on the way is sent again)."""
        while self.refused(reason) < count:
            before = self.refused(reason)
            publish()
            self.spin_until(lambda n=before: self.refused(reason) > n, timeout_s=2.0)

    def close(self) -> None:
        self.node.close()
        self.executor.shutdown()
        self.node.destroy_node()
        self.robot.destroy_node()
        self.context.try_shutdown()


@pytest.fixture
def flooded():
    run = Flooded()
    yield run
    run.close()


def _nan_joints() -> JointState:
    msg = JointState(name=['j1', 'j2'], position=[math.nan, 0.0])
    msg.header.stamp = ns_to_stamp(time.time_ns())
    return msg


def _unknown_encoding() -> Image:
    msg = rgb_to_image(np.zeros((8, 8, 3), np.uint8), stamp=ns_to_stamp(time.time_ns()))
    msg.encoding = '32FC7'
    return msg


def test_bad_input_messages_yield_one_step_rejected_per_reason_and_are_all_counted(flooded):
    flooded.send_until_refused(
        lambda: flooded.joints.publish(_nan_joints()), 'invalid_state', NUM_BAD
    )
    flooded.send_until_refused(
        lambda: flooded.camera.publish(_unknown_encoding()), 'malformed_image', NUM_BAD
    )
    flooded.got['diagnostics'].clear()
    flooded.node.publish_diagnostics()
    assert flooded.spin_until(lambda: flooded.got['diagnostics'])
    reasons = [r.reason for r in flooded.got['rejected']]
    assert reasons.count(StepRejected.REASON_INVALID_STATE) == 1
    assert reasons.count(StepRejected.REASON_MALFORMED_IMAGE) == 1
    (first_state,) = [
        r for r in flooded.got['rejected'] if r.reason == StepRejected.REASON_INVALID_STATE
    ]
    assert 'non-finite positions' in first_state.detail and first_state.step_seq == 0
    status = next(s for s in flooded.got['diagnostics'][-1].status if s.name == ROBOT)
    values = {kv.key: kv.value for kv in status.values}
    assert values['refused: invalid_state'] == str(NUM_BAD)
    assert values['refused: malformed_image'] == str(NUM_BAD)
