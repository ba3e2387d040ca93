"""The node's lifecycle in this process, with a stand-in engine client: started with
``autostart`` false it has no engine and refuses every step, naming its state; configure
builds and starts the engine client (or fails on a checkpoint it cannot serve, staying
unconfigured with the reason on /diagnostics); activate serves; deactivate refuses the step
in flight and never publishes its result; cleanup closes the engine. The same transitions
through the lifecycle services, against the node in its own process, are in
test_node_serving.py."""

from __future__ import annotations

import time
from collections import defaultdict

import numpy as np
import pytest
import rclpy
from diagnostic_msgs.msg import DiagnosticArray
from lifecycle_msgs.srv import GetState
from rclpy.executors import SingleThreadedExecutor
from rclpy.lifecycle import TransitionCallbackReturn
from rclpy.parameter import Parameter
from rclpy.qos import qos_profile_sensor_data as sensor_qos
from sensor_msgs.msg import Image

from vla_sched.ipc.messages import EngineInfo, StepRequest, StepResult
from vla_sched.msg import ActionChunk, StepRejected
from vla_sched.ros.conversions import ns_to_stamp, rgb_to_image, stamp_to_ns
from vla_sched.ros.diagnostic_keys import ENGINE_STATE_KEY, LIFECYCLE_STATE_KEY
from vla_sched.ros.node import VlaSchedNode

pytestmark = pytest.mark.ros

WAIT_S = 30.0  # only a hang reaches this
HORIZON, DOF = 4, 7
SCHEDULER = '/vla_sched: scheduler'
SUCCESS, FAILURE = TransitionCallbackReturn.SUCCESS, TransitionCallbackReturn.FAILURE


class HeldClient:
    """An engine client (the node's ``client_factory`` seam) that is ready once started and
    holds each step until ``release`` answers it, announced through ``on_arrival`` as the
    real client does."""

    alive = True
    heartbeat_age_s = 0.0
    pid = None
    failure = ''
    num_bad_frames = 0

    def __init__(self) -> None:
        self.info = EngineInfo(
            model_name='fake',
            num_state=0,
            action_horizon=HORIZON,
            action_dim=DOF,
            image_size=32,
            max_instruction_bytes=64,
            random_weights=True,
        )
        self.on_arrival = lambda: None
        self.started = self.closed = False
        self.held: list[StepRequest] = []
        self._results: list[StepResult] = []

    def start(self) -> None:
        self.started = True

    def restart(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True

    def send(self, msg) -> None:
        if isinstance(msg, StepRequest):
            self.held.append(msg)

    def release(self) -> None:
        actions = np.zeros((HORIZON, DOF), dtype=np.float32)
        self._results += [
            StepResult(m.robot_id, m.step_seq, m.stamp_ns, actions, 0.0, 0.0, 0.0, False, 0)
            for m in self.held
        ]
        self.held = []
        self.on_arrival()

    def poll(self, timeout_s: float = 0.0) -> list:
        results, self._results = self._results, []
        return results


class Lifecycle:
    """A node started with ``autostart`` false, a fake robot, and what the robot got."""

    def __init__(self, **params) -> None:
        self.context = rclpy.Context()
        rclpy.init(args=[], context=self.context)
        values = {
            'autostart': False,
            'robot_ids': ['robot_0'],
            'robot_defaults.trigger': 'on_image',
            'robot_defaults.instruction': 'pick up the red block',
            'deadlines.step_budget_s': 30.0,
            **params,
        }
        self.clients: list[HeldClient] = []
        self.node = VlaSchedNode(
            client_factory=self._client,
            parameter_overrides=[Parameter(k, value=v) for k, v in values.items()],
            context=self.context,
        )
        self.robot = rclpy.create_node('fake_robot', context=self.context)
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
        self.robot.create_subscription(
            DiagnosticArray, '/diagnostics', self.got['diagnostics'].append, 10
        )
        self.camera = self.robot.create_publisher(Image, '/robot_0/camera/image_raw', sensor_qos)
        assert self.spin_until(lambda: self.camera.get_subscription_count() > 0)

    def _client(self, config) -> HeldClient:
        self.clients.append(HeldClient())
        return self.clients[-1]

    def spin_until(self, predicate) -> bool:
        end = time.monotonic() + WAIT_S
        while not predicate() and time.monotonic() < end:
            self.executor.spin_once(timeout_sec=0.05)
        return bool(predicate())

    def send_image(self) -> int:
        stamp_ns = time.time_ns()
        image = rgb_to_image(np.zeros((8, 8, 3), np.uint8), stamp=ns_to_stamp(stamp_ns))
        self.camera.publish(image)
        return stamp_ns

    def refusal_for(self, stamp_ns: int) -> StepRejected:
        def found():
            return [r for r in self.got['rejected'] if stamp_to_ns(r.header.stamp) == stamp_ns]

        assert self.spin_until(found), self.got['rejected']
        return found()[0]

    def scheduler(self) -> dict[str, str]:
        """The scheduler status's values on the next /diagnostics."""
        self.got['diagnostics'].clear()
        self.node.publish_diagnostics()
        assert self.spin_until(lambda: self.got['diagnostics'])
        status = next(s for s in self.got['diagnostics'][-1].status if s.name == SCHEDULER)
        return {kv.key: kv.value for kv in status.values}

    def close(self) -> None:
        self.node.close()
        self.executor.shutdown()
        self.node.destroy_node()
        self.robot.destroy_node()
        self.context.try_shutdown()


@pytest.fixture
def lifecycle():
    run = Lifecycle()
    yield run
    run.close()


def test_a_node_without_autostart_has_no_engine_and_refuses_naming_its_state(lifecycle):
    node = lifecycle.node
    assert node.lifecycle_state == 'unconfigured' and not lifecycle.clients
    refusal = lifecycle.refusal_for(lifecycle.send_image())
    assert refusal.reason == StepRejected.REASON_INACTIVE
    assert refusal.detail.startswith('node unconfigured: steps resume once it is configured')
    values = lifecycle.scheduler()
    assert values[LIFECYCLE_STATE_KEY] == 'unconfigured' and values[ENGINE_STATE_KEY] == 'stopped'
    # configure starts the engine; inactive still refuses
    assert node.trigger_configure() == SUCCESS
    (client,) = lifecycle.clients
    assert client.started and node.lifecycle_state == 'inactive'
    assert lifecycle.spin_until(lambda: node.link.ready)
    refusal = lifecycle.refusal_for(lifecycle.send_image())
    assert refusal.reason == StepRejected.REASON_INACTIVE
    assert refusal.detail.startswith('node inactive: steps resume once it is activated')
    values = lifecycle.scheduler()
    assert values[LIFECYCLE_STATE_KEY] == 'inactive' and values[ENGINE_STATE_KEY] == 'ready'
    assert not client.held and not lifecycle.got['chunks']


def test_activate_serves_and_deactivate_refuses_the_step_in_flight(lifecycle):
    node = lifecycle.node
    assert node.trigger_configure() == SUCCESS
    assert lifecycle.spin_until(lambda: node.link.ready)
    assert node.trigger_activate() == SUCCESS
    (client,) = lifecycle.clients
    served = lifecycle.send_image()
    assert lifecycle.spin_until(lambda: client.held)
    client.release()
    assert lifecycle.spin_until(lambda: lifecycle.got['chunks'])
    assert stamp_to_ns(lifecycle.got['chunks'][0].header.stamp) == served
    # a step in flight when the node is deactivated is refused, and its result never published
    in_flight = lifecycle.send_image()
    assert lifecycle.spin_until(lambda: client.held)
    assert node.trigger_deactivate() == SUCCESS
    refusal = lifecycle.refusal_for(in_flight)
    assert refusal.reason == StepRejected.REASON_INACTIVE and refusal.step_seq > 0
    assert refusal.detail == 'node deactivated'
    client.release()
    later = lifecycle.send_image()
    assert lifecycle.refusal_for(later).reason == StepRejected.REASON_INACTIVE
    assert [stamp_to_ns(c.header.stamp) for c in lifecycle.got['chunks']] == [served]
    # cleanup closes the engine; configure builds a new one
    assert node.trigger_cleanup() == SUCCESS
    assert client.closed and node.link is None and node.lifecycle_state == 'unconfigured'
    assert node.trigger_configure() == SUCCESS
    assert len(lifecycle.clients) == 2 and lifecycle.clients[1].started


def test_a_checkpoint_that_cannot_be_served_fails_configure_naming_why(tmp_path):
    run = Lifecycle(**{'engine.model_path': str(tmp_path)})  # no config.json there
    try:
        assert run.node.trigger_configure() == FAILURE
        assert run.node.lifecycle_state == 'unconfigured' and not run.clients
        values = run.scheduler()
        assert values[ENGINE_STATE_KEY] == 'stopped'
        assert values['engine last error'].startswith('engine.model_path')
    finally:
        run.close()


def test_the_reported_lifecycle_state_is_the_one_its_services_report(lifecycle):
    run, node = lifecycle, lifecycle.node

    def service_state() -> str:
        client = run.robot.create_client(GetState, '/vla_sched/get_state')
        assert run.spin_until(client.service_is_ready)
        future = client.call_async(GetState.Request())
        assert run.spin_until(future.done)
        run.robot.destroy_client(client)
        return future.result().current_state.label

    assert node.lifecycle_state == service_state() == 'unconfigured'
    for trigger, expected in (
        (node.trigger_configure, 'inactive'),
        (node.trigger_activate, 'active'),
        (node.trigger_deactivate, 'inactive'),
        (node.trigger_activate, 'active'),
        (node.trigger_deactivate, 'inactive'),
        (node.trigger_cleanup, 'unconfigured'),
        (node.trigger_activate, 'unconfigured'),  # not a transition from there: refused
        (node.trigger_shutdown, 'finalized'),
    ):
        trigger()
        assert node.lifecycle_state == service_state() == expected, trigger.__name__
