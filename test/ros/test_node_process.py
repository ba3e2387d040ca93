"""The node as a user starts it from a command line, over real DDS and real signals.

One node runs under the namespace /gpu0 with the shipped params file, in a process group of
its own and with a runtime base folder that holds two leftovers of earlier nodes (one whose
owner process is gone, one whose owner still runs). In order: it serves the file's robots;
its parameters, read as ``ros2 param dump`` reads them, are written as that command writes
them; a double SIGINT to its process group stops it cleanly; a second node started from the
dump has the same parameters, and SIGTERM stops it cleanly.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import rclpy
import rclpy.executors
import yaml
from rcl_interfaces.srv import GetParameters, ListParameters
from rclpy.parameter import parameter_value_to_python

pytestmark = [pytest.mark.ros, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
PARAMS_FILE = ROOT / 'config' / 'vla_sched.yaml'
NODE = '/gpu0/vla_sched'
STOP_S = 15.0  # generous on a loaded machine; the node's own bound is a few seconds


class NodeRun:
    """``python -m vla_sched.ros.node`` in its own process group, output in a log file."""

    def __init__(self, folder: Path, params_file: Path, runtime_base: Path) -> None:
        self.log_path = folder / 'node.log'
        cmd = [sys.executable, '-m', 'vla_sched.ros.node', '--ros-args', '-r', '__ns:=/gpu0']
        cmd += ['--params-file', str(params_file)]
        env = {**os.environ, 'XDG_RUNTIME_DIR': str(runtime_base)}
        with self.log_path.open('w') as log:
            self.proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        self.runtime_base = runtime_base

    def log(self) -> str:
        return self.log_path.read_text(errors='replace')

    def runtime_dir(self, timeout_s: float = 60.0) -> Path | None:
        """The runtime folder this node owns, once it exists."""
        end = time.monotonic() + timeout_s
        while time.monotonic() < end and self.proc.poll() is None:
            for path in self.runtime_base.glob('vla_sched-*'):
                owner = path / 'owner.pid'
                if owner.exists() and owner.read_text().strip() == str(self.proc.pid):
                    return path
            time.sleep(0.05)
        return None

    def descendants(self) -> list[psutil.Process]:
        return psutil.Process(self.proc.pid).children(recursive=True)

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


class ParamReader:
    """Reads a node's parameters through its list/get parameters services, as ros2 param
    dump does, in a context of its own."""

    def __init__(self) -> None:
        self.context = rclpy.Context()
        rclpy.init(args=[], context=self.context)
        self.node = rclpy.create_node('vla_sched_param_reader', context=self.context)

    def _call(self, srv_type, name: str, request, timeout_s: float):
        client = self.node.create_client(srv_type, f'{NODE}/{name}')
        try:
            assert client.wait_for_service(timeout_sec=timeout_s), f'no {NODE}/{name}'
            future = client.call_async(request)
            executor = rclpy.executors.SingleThreadedExecutor(context=self.context)
            executor.add_node(self.node)
            executor.spin_until_future_complete(future, timeout_sec=timeout_s)
            executor.remove_node(self.node)
            assert future.done(), f'{NODE}/{name} did not answer'
            return future.result()
        finally:
            self.node.destroy_client(client)

    def values(self, timeout_s: float = 60.0) -> dict:
        names = self._call(ListParameters, 'list_parameters', ListParameters.Request(), timeout_s)
        names = sorted(names.result.names)
        got = self._call(GetParameters, 'get_parameters', GetParameters.Request(names=names), 30)
        return {n: parameter_value_to_python(v) for n, v in zip(names, got.values, strict=True)}

    def close(self) -> None:
        self.node.destroy_node()
        self.context.try_shutdown()


def dump_yaml(values: dict) -> str:
    """The YAML ``ros2 param dump`` prints: nested at each '.', keyed by the node's name."""
    tree: dict = {}
    for name, value in values.items():
        *groups, leaf = name.split('.')
        holder = tree
        for group in groups:
            holder = holder.setdefault(group, {})
        holder[leaf] = value
    return yaml.dump({NODE: {'ros__parameters': tree}}, default_flow_style=False)


@pytest.fixture(scope='module')
def state(tmp_path_factory):
    folder = tmp_path_factory.mktemp('node_process')
    runtime_base = folder / 'runtime'
    runtime_base.mkdir()
    gone = subprocess.Popen([sys.executable, '-c', 'pass'])
    gone.wait()  # reaped: its pid names no process
    stale = runtime_base / 'vla_sched-stale'
    stale.mkdir()
    (stale / 'owner.pid').write_text(f'{gone.pid}\n')
    kept = runtime_base / 'vla_sched-kept'
    kept.mkdir()
    (kept / 'owner.pid').write_text(f'{os.getpid()}\n')  # this test process runs
    reader = ParamReader()
    node = NodeRun(folder, PARAMS_FILE, runtime_base)
    state = {'folder': folder, 'runtime_base': runtime_base, 'reader': reader, 'node': node}
    try:
        yield state
    finally:
        for run in (state['node'], state.get('second')):
            if run is not None:
                run.kill()
        reader.close()


def _stop(run: NodeRun, *signals: int) -> tuple[int, list[psutil.Process]]:
    """Send ``signals`` to the node's process group; its exit status and the descendants it
    had, once it exited."""
    children = run.descendants()
    for signum in signals:
        os.killpg(run.proc.pid, signum)
    try:
        code = run.proc.wait(timeout=STOP_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f'still running {STOP_S} s after {signals}: {run.log()[-2000:]}')
    return code, children


def test_the_shipped_params_file_serves_its_robots_under_a_namespace(state):
    values = state['reader'].values()
    assert values['robot_ids'] == ['robot_0', 'robot_1', 'robot_2', 'robot_3']
    assert values['robots.robot_0.instruction'] == 'pick up the red block'
    state['values'] = values
    assert 'serving 4 robots' in state['node'].log()


def test_start_up_removes_runtime_folders_whose_owner_is_gone(state):
    own = state['node'].runtime_dir()
    assert own is not None, state['node'].log()[-2000:]
    base = state['runtime_base']
    assert not (base / 'vla_sched-stale').exists()
    assert (base / 'vla_sched-kept').exists()  # its owner still runs


def test_the_parameter_dump_writes_empty_lists_as_lists(state):
    values = state['values']
    assert values['robots.robot_2.action_joint_names'] == []  # not None, which dumps as null
    dump = state['folder'] / 'dump.yaml'
    dump.write_text(dump_yaml(values))
    assert 'null' not in dump.read_text()
    state['dump'] = dump


def test_a_double_sigint_to_the_process_group_stops_the_node_cleanly(state):
    run = state['node']
    own = run.runtime_dir()
    code, children = _stop(run, signal.SIGINT, signal.SIGINT)
    log = run.log()
    assert code == 0, log[-2000:]
    assert 'Traceback' not in log and 'KeyboardInterrupt' not in log, log[-2000:]
    assert children and not [c for c in children if c.is_running()]  # the engine is gone
    assert own is not None and not own.exists()


def test_a_node_started_from_the_dump_has_the_same_parameters_and_stops_on_sigterm(state):
    second = NodeRun(state['folder'], state['dump'], state['runtime_base'])
    state['second'] = second
    assert state['reader'].values() == state['values'], second.log()[-2000:]
    own = second.runtime_dir()
    code, children = _stop(second, signal.SIGTERM)
    log = second.log()
    assert code == 0 and 'Traceback' not in log, log[-2000:]
    assert not [c for c in children if c.is_running()]
    assert own is not None and not own.exists()
