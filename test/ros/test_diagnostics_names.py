"""Two nodes in different namespaces over real DDS: their /diagnostics names and hardware ids
never collide, every one is claimed by the analyzers, and a robot that never sent an image is
STALE, not ERROR."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import rclpy
import yaml
from analyzer_rules import claims, rules_from_params
from diagnostic_msgs.msg import DiagnosticArray
from rclpy.executors import SingleThreadedExecutor

from vla_sched.ros.diagnostic_keys import status_names
from vla_sched.ros.diagnostics import STALE

pytestmark = [pytest.mark.ros, pytest.mark.slow]

ANALYZERS = Path(__file__).resolve().parents[2] / 'config' / 'diagnostics_analyzers.yaml'
NAMESPACES = ('gpu0', 'gpu1')
ROBOTS = ['robot_0', 'robot_1']


def _start(folder, namespace: str) -> subprocess.Popen:
    params = folder / f'{namespace}.yaml'
    values = {
        'robot_ids': ROBOTS,
        'engine': {'mode': 'inprocess', 'device': 'cpu'},
        'diagnostics': {'period_s': 0.2, 'silent_robot_s': 0.5},
    }
    params.write_text(yaml.safe_dump({'/**': {'ros__parameters': values}}))
    cmd = [sys.executable, '-m', 'vla_sched.ros.node', '--ros-args', '-r', f'__ns:=/{namespace}']
    cmd += ['--params-file', str(params)]
    log = (folder / f'{namespace}.log').open('w')
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)


@pytest.fixture(scope='module')
def arrays(tmp_path_factory):
    """The latest /diagnostics status of each name, from both nodes."""
    folder = tmp_path_factory.mktemp('two_nodes')
    procs = [_start(folder, ns) for ns in NAMESPACES]
    context = rclpy.Context()
    rclpy.init(args=[], context=context)
    node = rclpy.create_node('vla_sched_names_test', context=context)
    executor = SingleThreadedExecutor(context=context)
    executor.add_node(node)
    statuses = {}

    def on_array(msg: DiagnosticArray) -> None:
        statuses.update({s.name: s for s in msg.status})

    node.create_subscription(DiagnosticArray, '/diagnostics', on_array, 50)
    expected = [n for ns in NAMESPACES for n in status_names(f'/{ns}/vla_sched', ROBOTS)]
    end = time.monotonic() + 120
    while not set(expected) <= set(statuses) and time.monotonic() < end:
        executor.spin_once(timeout_sec=0.1)
    try:
        logs = {ns: (folder / f'{ns}.log').read_text() for ns in NAMESPACES}
        assert set(expected) <= set(statuses), (sorted(statuses), logs)
        yield statuses
    finally:
        executor.shutdown()
        node.destroy_node()
        context.try_shutdown()
        for proc in procs:
            proc.send_signal(signal.SIGINT)
        for proc in procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def test_two_namespaced_nodes_publish_distinct_names_and_hardware_ids(arrays):
    gpu0 = status_names('/gpu0/vla_sched', ROBOTS)
    gpu1 = status_names('/gpu1/vla_sched', ROBOTS)
    assert not set(gpu0) & set(gpu1)
    ids = [arrays[name].hardware_id for name in (*gpu0, *gpu1)]
    assert len(set(ids)) == len(ids)
    assert arrays['/gpu0/vla_sched: scheduler'].hardware_id == '/gpu0/vla_sched'
    assert arrays['/gpu1/vla_sched: robot robot_0'].hardware_id == '/gpu1/vla_sched/robot_0'


def test_the_analyzers_claim_each_received_status_once(arrays):
    params = yaml.safe_load(ANALYZERS.read_text())['analyzers']['ros__parameters']
    rules = list(rules_from_params(params))
    for name in arrays:
        if 'vla_sched' in name:
            assert len(claims(rules, name)) == 1, name


def test_a_robot_that_never_sent_an_image_is_stale_waiting_for_it(arrays):
    # silent_robot_s is 0.5 s and no image ever came: still STALE, not ERROR
    status = arrays['/gpu0/vla_sched: robot robot_1']
    assert status.level[0] == STALE and status.message.startswith('waiting for first image')
    values = {kv.key: kv.value for kv in status.values}
    assert values['time since last image (s)'] == 'n/a'
    assert values['last error'] == 'n/a'
