"""Autostart runs from a one-shot timer once the node spins, so a checkpoint that cannot be
served is a failed configure transition: the node is built, stays unconfigured, says why in
its log and on /diagnostics, and its process keeps running (and stops cleanly)."""

from __future__ import annotations

import errno
import json
import time
from collections import defaultdict

import pytest
import rclpy
from diagnostic_msgs.msg import DiagnosticArray
from lifecycle_msgs.srv import GetState
from rclpy.executors import SingleThreadedExecutor
from rclpy.lifecycle import TransitionCallbackReturn
from rclpy.parameter import Parameter
from ros_harness import Harness, NodeProcess, values_of

from vla_sched.model.config.presets import openvla_config, openvla_norm_stats
from vla_sched.ros.diagnostic_keys import ENGINE_STATE_KEY, LIFECYCLE_STATE_KEY
from vla_sched.ros.node import VlaSchedNode

pytestmark = [pytest.mark.ros, pytest.mark.slow]

WAIT_S = 60.0  # only a hang reaches this
SCHEDULER = '/vla_sched: scheduler'
FAILURE = TransitionCallbackReturn.FAILURE


@pytest.fixture
def two_dataset_checkpoint(tmp_path):
    """An OpenVLA folder with two datasets' statistics: without engine.unnorm_key it cannot
    be served, and configure says which keys it holds."""
    config = openvla_config('fused', tiny=True, norm_stats=openvla_norm_stats(('a', 'b')))
    (tmp_path / 'config.json').write_text(json.dumps(config))
    (tmp_path / 'tokenizer.json').write_text('{}')
    return tmp_path


class Spun:
    """A VlaSchedNode with autostart (the default) in this process, and its /diagnostics."""

    def __init__(self, model_path, *, client_factory=None) -> None:
        self.context = rclpy.Context()
        rclpy.init(args=[], context=self.context)
        params = {'robot_ids': ['robot_0'], 'engine.model_path': str(model_path)}
        self.node = VlaSchedNode(
            parameter_overrides=[Parameter(k, value=v) for k, v in params.items()],
            context=self.context,
            client_factory=client_factory,
        )
        self.probe = rclpy.create_node('probe', context=self.context)
        self.executor = SingleThreadedExecutor(context=self.context)
        self.executor.add_node(self.node)
        self.executor.add_node(self.probe)
        self.got: dict[str, list] = defaultdict(list)
        self.probe.create_subscription(
            DiagnosticArray, '/diagnostics', self.got['diagnostics'].append, 10
        )

    def spin_until(self, predicate) -> bool:
        end = time.monotonic() + WAIT_S
        while not predicate() and time.monotonic() < end:
            self.executor.spin_once(timeout_sec=0.05)
        return bool(predicate())

    def scheduler_values(self) -> list[dict[str, str]]:
        return [
            {kv.key: kv.value for kv in s.values}
            for array in self.got['diagnostics']
            for s in array.status
            if s.name == SCHEDULER
        ]

    def service_state(self) -> str:
        """The state the node's get_state service reports (as ``ros2 lifecycle get``)."""
        client = self.probe.create_client(GetState, '/vla_sched/get_state')
        assert self.spin_until(client.service_is_ready)
        future = client.call_async(GetState.Request())
        assert self.spin_until(future.done)
        self.probe.destroy_client(client)
        return future.result().current_state.label

    def close(self) -> None:
        self.node.close()
        self.executor.shutdown()
        self.node.destroy_node()
        self.probe.destroy_node()
        self.context.try_shutdown()


def test_a_configure_failure_under_autostart_is_a_failed_transition_not_an_exception(
    two_dataset_checkpoint,
):
    run = Spun(two_dataset_checkpoint)  # the constructor does not configure, so cannot raise
    try:
        assert run.node.lifecycle_state == 'unconfigured' and run.node.link is None

        def failure_reported() -> bool:
            return any(
                v['engine last error'].startswith('engine.unnorm_key')
                for v in run.scheduler_values()
            )

        assert run.spin_until(failure_reported), run.scheduler_values()
        values = run.scheduler_values()[-1]
        assert values[LIFECYCLE_STATE_KEY] == 'unconfigured'
        assert values[ENGINE_STATE_KEY] == 'stopped'
        assert "['a', 'b']" in values['engine last error']
        assert run.node.lifecycle_state == run.service_state() == 'unconfigured'
        # the node lives on: its lifecycle services can try again
        assert run.node.trigger_configure() == FAILURE
        assert run.node.lifecycle_state == run.service_state() == 'unconfigured'
    finally:
        run.close()


@pytest.mark.slow
def test_a_node_process_whose_configure_fails_under_autostart_keeps_running(
    two_dataset_checkpoint, tmp_path
):
    folder = tmp_path / 'node'
    folder.mkdir()
    node = NodeProcess(
        folder, {'robot_ids': ['robot_0'], 'engine': {'model_path': str(two_dataset_checkpoint)}}
    )
    harness = Harness(['robot_0'])
    try:
        status = harness.wait_status(
            SCHEDULER,
            lambda s: values_of(s)['engine last error'].startswith('engine.unnorm_key'),
            WAIT_S,
        )
        assert status is not None, node.log()[-3000:]
        assert values_of(status)[LIFECYCLE_STATE_KEY] == 'unconfigured'
        assert harness.lifecycle_state('/vla_sched') == 'unconfigured'
        assert node.proc.poll() is None, node.log()[-3000:]
    finally:
        harness.close()
        code = node.stop()
    log = node.log()
    assert code == 0, log[-3000:]
    assert 'configure failed: engine.unnorm_key' in log and "['a', 'b']" in log
    assert 'autostart stopped: the node is unconfigured' in log
    assert 'Traceback' not in log


def test_an_engine_that_cannot_start_on_a_full_disk_is_a_failed_configure(tmp_path):
    def full_disk(config):
        raise OSError(errno.ENOSPC, 'No space left on device', str(tmp_path))

    run = Spun('', client_factory=full_disk)  # the built-in checkpoint: the check passes
    try:

        def failure_reported() -> bool:
            return any(
                'No space left on device' in v['engine last error'] for v in run.scheduler_values()
            )

        assert run.spin_until(failure_reported), run.scheduler_values()
        assert run.node.lifecycle_state == 'unconfigured' and run.node.link is None
    finally:
        run.close()
