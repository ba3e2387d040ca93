"""The node wakes on events, not on a polling timer: with every timer of the node cancelled,
an image is still sent as a step at once and its result is still published, because the
engine's messages wake the executor themselves; a periodic robot's early image is sent by the
one-shot timer the node arms for it."""

from __future__ import annotations

import time
from collections import defaultdict

import numpy as np
import pytest
import rclpy
from rclpy.executors import SingleThreadedExecutor
from rclpy.parameter import Parameter
from rclpy.qos import qos_profile_sensor_data as sensor_qos
from sensor_msgs.msg import Image

from vla_sched.msg import ActionChunk, StepRejected
from vla_sched.ros.conversions import ns_to_stamp, rgb_to_image, stamp_to_ns
from vla_sched.ros.node import VlaSchedNode

pytestmark = [pytest.mark.ros, pytest.mark.slow]
WAIT_S = 120.0  # only a hang (or a node that waits for a timer) reaches this


class Served:
    """A node with an in-process engine and one robot, on one executor in this process."""

    def __init__(self, trigger: str, period_s: float) -> None:
        self.context = rclpy.Context()
        rclpy.init(args=[], context=self.context)
        params = [
            Parameter('robot_ids', value=['robot_0']),
            Parameter('robot_defaults.trigger', value=trigger),
            Parameter('robot_defaults.period_s', value=period_s),
            Parameter('robot_defaults.instruction', value='pick up the red block'),
            Parameter('deadlines.step_budget_s', value=60.0),
            Parameter('engine.mode', value='inprocess'),
            Parameter('engine.device', value='cpu'),
            # Long enough that neither side gives the other up while the node's timers are off.
            Parameter('engine.heartbeat_period_s', value=10.0),
            Parameter('engine.heartbeat_timeout_s', value=60.0),
        ]
        self.node = VlaSchedNode(parameter_overrides=params, context=self.context)
        self.robot = rclpy.create_node('robot_0_sim', context=self.context)
        self.executor = SingleThreadedExecutor(context=self.context)
        self.executor.add_node(self.node)
        self.executor.add_node(self.robot)
        self.got: dict[str, list] = defaultdict(list)
        self.robot.create_subscription(
            ActionChunk, '/robot_0/vla/action_chunk', self.got['chunks'].append, 10
        )
        self.robot.create_subscription(
            StepRejected, '/robot_0/vla/step_rejected', self.got['rejected'].append, 10
        )
        self.camera = self.robot.create_publisher(Image, '/robot_0/camera/image_raw', sensor_qos)

    def spin_until(self, predicate) -> bool:
        end = time.monotonic() + WAIT_S
        while not predicate() and time.monotonic() < end:
            self.executor.spin_once(timeout_sec=0.05)
        return predicate()

    def send_image(self) -> int:
        stamp_ns = time.time_ns()
        image = rgb_to_image(np.zeros((24, 32, 3), np.uint8), stamp=ns_to_stamp(stamp_ns))
        self.camera.publish(image)
        return stamp_ns

    def cancel_node_timers(self) -> None:
        for timer in self.node.timers:
            timer.cancel()

    def close(self) -> None:
        self.node.close()
        self.executor.shutdown()
        self.node.destroy_node()
        self.robot.destroy_node()
        self.context.try_shutdown()


@pytest.fixture
def served(request):
    served = Served(*request.param)
    try:
        assert served.spin_until(lambda: served.camera.get_subscription_count() > 0)
        assert served.spin_until(lambda: served.node.link is not None and served.node.link.ready)
        yield served
    finally:
        served.close()


@pytest.mark.parametrize('served', [('on_image', 0.1)], indirect=True)
def test_results_are_published_with_every_node_timer_cancelled(served):
    served.cancel_node_timers()
    stamps = []
    for count in (1, 2):
        stamps.append(served.send_image())
        assert served.spin_until(lambda c=count: len(served.got['chunks']) >= c), served.got
    assert [stamp_to_ns(c.header.stamp) for c in served.got['chunks']] == stamps
    assert [c.step_seq for c in served.got['chunks']] == [1, 2]
    assert not served.got['rejected']


@pytest.mark.parametrize('served', [('periodic', 2.0)], indirect=True)
def test_a_periodic_robots_early_image_is_sent_when_its_period_comes(served):
    served.cancel_node_timers()
    first = served.send_image()
    assert served.spin_until(lambda: len(served.got['chunks']) >= 1), served.got
    # Well within the period that began when the first image was sent: this one waits for
    # the node's one-shot timer, the only timer it re-arms.
    second = served.send_image()
    assert served.spin_until(lambda: len(served.got['chunks']) >= 2), served.got
    assert [stamp_to_ns(c.header.stamp) for c in served.got['chunks']] == [first, second]
    assert not served.got['rejected']
