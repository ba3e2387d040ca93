"""A dump of a launched node's parameters starts a node on its own that serves.

The first node runs as vla_sched.launch.py starts it (its command line made from the launch
file's own ``LifecycleNode`` action: arguments, remaps, parameters, ros_arguments); it waits
for the transitions the launch file would drive. Its parameters are read through its list
and get parameters services and written as ``ros2 param dump`` writes them; a second node
started from that file alone (``ros2 run vla_sched vla_sched_node --ros-args --params-file
p.yaml``, in the first node's namespace) must reach active by itself.
"""

from __future__ import annotations

import os
import sys

import pytest
from launch_stand_ins import bring_up, node_command
from ros_harness import Harness, NodeProcess, dump_yaml

pytestmark = [pytest.mark.ros, pytest.mark.slow]

NAMESPACE = f'dump_{os.getpid()}'  # no other test's node shares its name
NODE = f'/{NAMESPACE}/vla_sched'
WAIT_S = 60.0  # only a hang reaches this


def test_a_parameter_dump_of_a_launched_node_starts_a_node_that_reaches_active(
    monkeypatch, tmp_path
):
    (launched,) = [
        a
        for a in bring_up(monkeypatch, namespace=NAMESPACE)
        if type(a).__name__ == 'LifecycleNode'
    ]
    first = NodeProcess(tmp_path, None, command=node_command(launched, tmp_path), name='launched')
    second = None
    harness = Harness([])
    try:
        assert harness.spin_until(lambda: 'waiting for configure' in first.log(), WAIT_S), (
            first.log()[-3000:]
        )
        assert harness.lifecycle_state(NODE) == 'unconfigured'  # waits for its launch file
        values = harness.parameters(NODE)
        assert values['autostart'] is True
        dump = tmp_path / 'p.yaml'
        dump.write_text(dump_yaml(NODE, values))
        assert first.stop() == 0, first.log()[-3000:]

        def gone() -> bool:
            names = harness.node.get_node_names_and_namespaces()
            return ('vla_sched', f'/{NAMESPACE}') not in names

        assert harness.spin_until(gone, WAIT_S)

        # as ros2 run vla_sched vla_sched_node --ros-args --params-file p.yaml runs it
        # (in the launched node's namespace, as its dump is keyed by its full name)
        plain = [sys.executable, '-m', 'vla_sched.ros.node', '--ros-args', '-r']
        plain += [f'__ns:=/{NAMESPACE}', '--params-file', str(dump)]
        second = NodeProcess(tmp_path, None, command=plain, name='from_dump')

        def active() -> bool:
            return 'active: serving' in second.log()

        assert harness.spin_until(active, WAIT_S), second.log()[-3000:]
        assert harness.lifecycle_state(NODE) == 'active'
    finally:
        harness.close()
        first.stop()
        if second is not None:
            assert second.stop() == 0, second.log()[-3000:]
