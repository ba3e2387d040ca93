"""Every step in flight ends: a step the engine never answers (lost, or taken by another
process) is refused with ENGINE_TIMEOUT once its deadline plus the margin has passed, its
robot sends its next step, and /diagnostics names the cause."""

from __future__ import annotations

import time
from collections import defaultdict

import numpy as np
import pytest
import rclpy
from diagnostic_msgs.msg import DiagnosticArray
from rclpy.executors import SingleThreadedExecutor
from rclpy.parameter import Parameter
from rclpy.qos import qos_profile_sensor_data as sensor_qos
from sensor_msgs.msg import Image

from vla_sched.ipc.messages import EngineInfo, StepRequest
from vla_sched.msg import StepRejected
from vla_sched.ros.conversions import ns_to_stamp, rgb_to_image, stamp_to_ns
from vla_sched.ros.node import VlaSchedNode

pytestmark = pytest.mark.ros

WAIT_S = 30.0  # only a hang reaches this
ROBOT = '/vla_sched: robot robot_0'


class SilentClient:
    """An engine client (the node's ``client_factory`` seam) that is ready and alive but
    never answers a step, as when another process took the steps off the socket."""

    alive = True
    heartbeat_age_s = 0.0
    pid = None
    failure = ''
    num_bad_frames = 0

    def __init__(self) -> None:
        self.info = EngineInfo('fake', 0, 4, 7, 32, 64, True)
        self.on_arrival = lambda: None
        self.steps: list[StepRequest] = []

    def start(self) -> None:
        pass

    def restart(self) -> None:
        pass

    def close(self) -> None:
        pass

    def send(self, msg) -> None:
        if isinstance(msg, StepRequest):
            self.steps.append(msg)

    def poll(self, timeout_s: float = 0.0) -> list:
        return []


@pytest.fixture
def silent():
    context = rclpy.Context()
    rclpy.init(args=[], context=context)
    client = SilentClient()
    params = {
        'robot_ids': ['robot_0'],
        'robot_defaults.trigger': 'on_image',
        'robot_defaults.instruction': 'pick up the red block',
        'deadlines.step_budget_s': 0.3,
        'deadlines.engine_timeout_margin_s': 0.2,
        'diagnostics.period_s': 0.2,
    }
    node = VlaSchedNode(
        client_factory=lambda config: client,
        parameter_overrides=[Parameter(k, value=v) for k, v in params.items()],
        context=context,
    )
    robot = rclpy.create_node('fake_robot', context=context)
    executor = SingleThreadedExecutor(context=context)
    executor.add_node(node)
    executor.add_node(robot)
    got: dict[str, list] = defaultdict(list)
    robot.create_subscription(
        StepRejected, '/robot_0/vla/step_rejected', got['rejected'].append, 10
    )
    robot.create_subscription(DiagnosticArray, '/diagnostics', got['diagnostics'].append, 10)
    camera = robot.create_publisher(Image, '/robot_0/camera/image_raw', sensor_qos)

    def spin_until(predicate) -> bool:
        end = time.monotonic() + WAIT_S
        while not predicate() and time.monotonic() < end:
            executor.spin_once(timeout_sec=0.05)
        return bool(predicate())

    def send_image() -> int:
        stamp_ns = time.time_ns()
        camera.publish(rgb_to_image(np.zeros((8, 8, 3), np.uint8), stamp=ns_to_stamp(stamp_ns)))
        return stamp_ns

    try:
        assert spin_until(lambda: camera.get_subscription_count() > 0)
        assert spin_until(lambda: node.lifecycle_state == 'active' and node.link.ready)
        yield client, got, spin_until, send_image
    finally:
        node.close()
        executor.shutdown()
        node.destroy_node()
        robot.destroy_node()
        context.try_shutdown()


def test_an_unanswered_step_is_refused_with_engine_timeout_and_the_robot_sends_its_next(silent):
    client, got, spin_until, send_image = silent
    first = send_image()
    assert spin_until(lambda: len(client.steps) == 1)

    def timed_out() -> list[StepRejected]:
        return [r for r in got['rejected'] if r.reason == StepRejected.REASON_ENGINE_TIMEOUT]

    assert spin_until(timed_out), [(r.reason, r.detail) for r in got['rejected']]
    (refusal,) = timed_out()
    assert stamp_to_ns(refusal.header.stamp) == first and refusal.step_seq == 1
    assert 'deadlines.engine_timeout_margin_s = 0.2 s' in refusal.detail
    # the robot is free: its next image becomes its next step
    second = send_image()
    assert spin_until(lambda: len(client.steps) == 2)
    assert client.steps[1].stamp_ns == second and client.steps[1].step_seq == 2

    def robot_values() -> dict[str, str] | None:
        for array in reversed(got['diagnostics']):
            for status in array.status:
                if status.name == ROBOT:
                    return {kv.key: kv.value for kv in status.values}
        return None

    assert spin_until(lambda: (robot_values() or {}).get('refused: engine_timeout') == '1')
    assert robot_values()['last error'].startswith('engine_timeout: the engine did not answer')
