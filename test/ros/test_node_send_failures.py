"""Every step is answered: limits that cannot fit a transport frame are refused at start-up,
and a step that cannot be sent is refused without blocking the robot's later steps."""

from __future__ import annotations

import subprocess
import sys
import time
from collections import defaultdict

import numpy as np
import pytest
import rclpy
import yaml
from rclpy.executors import SingleThreadedExecutor
from rclpy.parameter import Parameter
from rclpy.qos import qos_profile_sensor_data as sensor_qos
from sensor_msgs.msg import Image

from vla_sched.ipc.channel import DEFAULT_MAX_MESSAGE_BYTES
from vla_sched.ipc.codec import CodecError
from vla_sched.ipc.messages import EngineInfo, StepRequest, StepResult
from vla_sched.msg import ActionChunk, StepRejected
from vla_sched.ros.conversions import ns_to_stamp, rgb_to_image, stamp_to_ns
from vla_sched.ros.node import VlaSchedNode
from vla_sched.ros.node_config import ConfigError, FrontendConfig, RobotConfig

pytestmark = pytest.mark.slow  # seconds or more: not in the fast tier

WAIT_S = 30.0  # only a hang reaches this
HORIZON, DOF = 4, 7


def test_an_image_limit_past_the_frame_limit_is_refused_naming_both():
    robots = (RobotConfig('robot_0', state_joint_names=('j1', 'j2')),)
    largest_fitting = (DEFAULT_MAX_MESSAGE_BYTES - 4096) // 3
    assert FrontendConfig(robots=robots, max_image_pixels=largest_fitting)
    with pytest.raises(ConfigError) as refused:
        FrontendConfig(robots=robots, max_image_pixels=DEFAULT_MAX_MESSAGE_BYTES // 3)
    text = str(refused.value)
    assert 'limits.max_image_pixels = 22369621' in text
    assert 'limits.max_instruction_bytes = 1024' in text
    assert f'frame limit of {DEFAULT_MAX_MESSAGE_BYTES} bytes' in text


def test_a_longer_instruction_limit_lowers_the_image_limit_that_fits():
    robots = (RobotConfig('robot_0'),)
    pixels = (DEFAULT_MAX_MESSAGE_BYTES - 8192) // 3
    assert FrontendConfig(robots=robots, max_image_pixels=pixels)
    with pytest.raises(ConfigError, match=r'limits\.max_instruction_bytes = 1048576'):
        FrontendConfig(robots=robots, max_image_pixels=pixels, max_instruction_bytes=1 << 20)


@pytest.mark.ros
def test_the_node_process_refuses_to_start_with_an_image_limit_too_large(tmp_path):
    pixels = DEFAULT_MAX_MESSAGE_BYTES // 3  # the setting's top: no room for the header
    values = {'robot_ids': ['robot_0'], 'limits': {'max_image_pixels': pixels}}
    params = tmp_path / 'params.yaml'
    params.write_text(yaml.safe_dump({'vla_sched': {'ros__parameters': values}}))
    cmd = [sys.executable, '-m', 'vla_sched.ros.node', '--ros-args', '--params-file', str(params)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert f'limits.max_image_pixels = {pixels}' in done.stderr
    assert "engine transport's frame limit" in done.stderr


class FailingSendClient:
    """An engine client (the node's ``client_factory`` seam) that is ready at once and whose
    ``send`` raises the next queued error for each step; a step sent without one gets a
    result at the next poll, announced through ``on_arrival`` as the real client does."""

    def __init__(self, errors: list[Exception]) -> None:
        self.info = EngineInfo(
            model_name='fake',
            num_state=0,
            action_horizon=HORIZON,
            action_dim=DOF,
            image_size=32,
            max_instruction_bytes=64,
            random_weights=True,
        )
        self.errors = list(errors)
        self.on_arrival = lambda: None
        self.sent: list[StepRequest] = []
        self.attempts = 0
        self._results: list[StepResult] = []

    def start(self) -> None:
        pass

    def restart(self) -> None:
        pass

    def close(self) -> None:
        pass

    def send(self, msg) -> None:
        if not isinstance(msg, StepRequest):
            return
        self.attempts += 1
        if self.errors:
            raise self.errors.pop(0)
        self.sent.append(msg)
        actions = np.zeros((HORIZON, DOF), dtype=np.float32)
        self._results.append(
            StepResult(msg.robot_id, msg.step_seq, msg.stamp_ns, actions, 0.0, 0.0, 0.0, False, 0)
        )
        self.on_arrival()

    def poll(self, timeout_s: float = 0.0) -> list:
        results, self._results = self._results, []
        return results

    alive = True
    heartbeat_age_s = 0.0
    pid = None
    failure = ''


@pytest.mark.ros
def test_a_step_whose_send_fails_is_refused_and_the_robots_next_step_is_served():
    client = FailingSendClient(
        [RuntimeError('frame exceeds the transport limit'), CodecError('state: bad dtype')]
    )
    context = rclpy.Context()
    rclpy.init(args=[], context=context)
    params = [
        Parameter('robot_ids', value=['robot_0']),
        Parameter('robot_defaults.trigger', value='on_image'),
        Parameter('robot_defaults.instruction', value='pick up the red block'),
        Parameter('deadlines.step_budget_s', value=30.0),
    ]
    node = VlaSchedNode(
        client_factory=lambda config: client, parameter_overrides=params, context=context
    )
    robot = rclpy.create_node('fake_robot', context=context)
    executor = SingleThreadedExecutor(context=context)
    executor.add_node(node)
    executor.add_node(robot)
    got: dict[str, list] = defaultdict(list)
    robot.create_subscription(ActionChunk, '/robot_0/vla/action_chunk', got['chunks'].append, 10)
    robot.create_subscription(
        StepRejected, '/robot_0/vla/step_rejected', got['rejected'].append, 10
    )
    camera = robot.create_publisher(Image, '/robot_0/camera/image_raw', sensor_qos)

    def spin_until(predicate) -> bool:
        end = time.monotonic() + WAIT_S
        while not predicate() and time.monotonic() < end:
            executor.spin_once(timeout_sec=0.05)
        return predicate()

    def send_image() -> int:
        stamp_ns = time.time_ns()
        camera.publish(rgb_to_image(np.zeros((8, 8, 3), np.uint8), stamp=ns_to_stamp(stamp_ns)))
        return stamp_ns

    try:
        assert spin_until(lambda: camera.get_subscription_count() > 0)
        assert spin_until(lambda: node.link is not None and node.link.ready)
        stamps = []
        for count in (1, 2):
            stamps.append(send_image())
            assert spin_until(lambda c=count: len(got['rejected']) >= c), got
        stamps.append(send_image())
        assert spin_until(lambda: len(got['chunks']) >= 1), got
    finally:
        node.close()
        executor.shutdown()
        node.destroy_node()
        robot.destroy_node()
        context.try_shutdown()
    first, second = got['rejected']
    assert first.reason == StepRejected.REASON_ENGINE_UNAVAILABLE
    assert 'RuntimeError: frame exceeds the transport limit' in first.detail
    assert second.reason == StepRejected.REASON_MALFORMED_IMAGE
    assert 'cannot be encoded: state: bad dtype' in second.detail
    assert [stamp_to_ns(r.header.stamp) for r in got['rejected']] == stamps[:2]
    assert [stamp_to_ns(c.header.stamp) for c in got['chunks']] == stamps[2:]
    assert client.attempts == 3 and len(client.sent) == 1
