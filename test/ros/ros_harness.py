"""Real-process ROS tests: the node as a child process, and a test node in this process.

``NodeProcess`` starts ``python -m vla_sched.ros.node`` (or another node script) with a
parameter file (or a given command line). ``Harness``
is an rclpy node (in its own context) that plays the robots: it publishes their images,
joint states and instructions, and records every chunk, rejection, arm command (trajectory,
twist, gripper) and /diagnostics array the node publishes, chunks, rejections and arrays with
the time they arrived. It also calls the node's lifecycle services as ``ros2 lifecycle
get/set`` do (``lifecycle_state``, ``change_state``). Tests wait for events with
``spin_until``; nothing sleeps for a fixed time.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import rclpy
import yaml
from diagnostic_msgs.msg import DiagnosticArray
from geometry_msgs.msg import TwistStamped
from lifecycle_msgs.srv import ChangeState, GetAvailableTransitions, GetState
from rcl_interfaces.srv import GetParameters, ListParameters
from rclpy.executors import SingleThreadedExecutor
from rclpy.parameter import parameter_value_to_python
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
from rclpy.qos import qos_profile_sensor_data as sensor_qos
from sensor_msgs.msg import CompressedImage, Image, JointState
from std_msgs.msg import Float64, String
from trajectory_msgs.msg import JointTrajectory

from vla_sched.msg import ActionChunk, StepRejected
from vla_sched.ros.conversions import ns_to_stamp, rgb_to_image
from vla_sched.synthetic_frames import synthetic_frame

LATCHED = QoSProfile(
    depth=1, reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.TRANSIENT_LOCAL
)
JOINTS = ('joint_1', 'joint_2', 'joint_3', 'joint_4', 'joint_5', 'joint_6', 'gripper')


class NodeProcess:
    """The vla_sched node in a child process, configured by ``values`` (ros__parameters);
    ``script`` runs that file instead of ``vla_sched.ros.node`` (a node with a fake engine)."""

    def __init__(
        self,
        folder: Path,
        values: dict[str, Any] | None,
        *,
        script: Path | None = None,
        command: list[str] | None = None,
        ros_arguments: tuple[str, ...] = (),
        name: str = 'node',
    ):
        self.log_path = folder / f'{name}.log'
        if command is not None:  # the whole command line (e.g. as a launch file gives it)
            cmd = command
        else:
            self.params_path = folder / f'{name}_params.yaml'
            params = {'vla_sched': {'ros__parameters': values}}
            self.params_path.write_text(yaml.safe_dump(params))
            cmd = [sys.executable, '-m', 'vla_sched.ros.node']
            if script is not None:
                cmd = [sys.executable, str(script)]
            cmd += ['--ros-args', '--params-file', str(self.params_path), *ros_arguments]
        with self.log_path.open('w') as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)

    def log(self) -> str:
        return self.log_path.read_text(errors='replace')

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


class Harness:
    """Plays the robots and records what the node publishes (see the module docstring)."""

    def __init__(self, robot_ids: list[str], *, compressed: tuple[str, ...] = ()) -> None:
        self.context = rclpy.Context()
        rclpy.init(args=[], context=self.context)
        self.node = rclpy.create_node('vla_sched_test_robots', context=self.context)
        self.executor = SingleThreadedExecutor(context=self.context)
        self.executor.add_node(self.node)
        self.robot_ids = robot_ids
        self.compressed = compressed
        self.chunks: dict[str, list[tuple[int, ActionChunk]]] = defaultdict(list)
        self.rejected: dict[str, list[tuple[int, StepRejected]]] = defaultdict(list)
        self.trajectories: dict[str, list[JointTrajectory]] = defaultdict(list)
        self.twists: dict[str, list[TwistStamped]] = defaultdict(list)
        self.grippers: dict[str, list[Float64]] = defaultdict(list)
        self.diagnostics: list[tuple[int, DiagnosticArray]] = []
        self.images, self.joints, self.instructions = {}, {}, {}
        self._frames: dict[str, int] = defaultdict(int)
        self._cameras: dict[str, Any] = {}
        for rid in robot_ids:
            self._robot(rid)
        self.node.create_subscription(
            DiagnosticArray, '/diagnostics', lambda m: self.diagnostics.append((_now(), m)), 50
        )

    def _robot(self, rid: str) -> None:
        node = self.node
        if rid in self.compressed:
            topic = f'/{rid}/camera/image_raw/compressed'
            self.images[rid] = node.create_publisher(CompressedImage, topic, sensor_qos)
        else:
            topic = f'/{rid}/camera/image_raw'
            self.images[rid] = node.create_publisher(Image, topic, sensor_qos)
        self.joints[rid] = node.create_publisher(JointState, f'/{rid}/joint_states', sensor_qos)
        self.instructions[rid] = node.create_publisher(String, f'/{rid}/vla/instruction', LATCHED)
        node.create_subscription(
            ActionChunk,
            f'/{rid}/vla/action_chunk',
            lambda m, r=rid: self.chunks[r].append((_now(), m)),
            50,
        )
        node.create_subscription(
            StepRejected,
            f'/{rid}/vla/step_rejected',
            lambda m, r=rid: self.rejected[r].append((_now(), m)),
            50,
        )
        node.create_subscription(
            JointTrajectory,
            f'/{rid}/vla/joint_trajectory',
            lambda m, r=rid: self.trajectories[r].append(m),
            50,
        )
        node.create_subscription(
            TwistStamped, f'/{rid}/vla/twist', lambda m, r=rid: self.twists[r].append(m), 50
        )
        node.create_subscription(
            Float64, f'/{rid}/vla/gripper', lambda m, r=rid: self.grippers[r].append(m), 50
        )

    # --- waiting ---------------------------------------------------------------------------

    def spin_until(self, predicate: Callable[[], bool], timeout_s: float) -> bool:
        end = time.monotonic() + timeout_s
        while not predicate():
            left = end - time.monotonic()
            if left <= 0:
                return False
            self.executor.spin_once(timeout_sec=min(0.05, left))
        return True

    def wait_matched(self, timeout_s: float = 30.0, *, joints: bool = True) -> bool:
        """Until the node subscribes every robot's topics (``joints=False``: but its
        ``joint_states``, which the node subscribes only for robots with state joints)."""

        def matched() -> bool:
            pubs = [*self.images.values(), *self.instructions.values()]
            if joints:
                pubs.extend(self.joints.values())
            return all(p.get_subscription_count() > 0 for p in pubs)

        return self.spin_until(matched, timeout_s)

    def status(self, name: str, *, after_ns: int = 0):
        """The newest status called ``name`` received after ``after_ns``, or None."""
        for received, array in reversed(self.diagnostics):
            if received < after_ns:
                break
            for status in array.status:
                if status.name == name:
                    return status
        return None

    def wait_status(self, name: str, check: Callable, timeout_s: float, *, after_ns: int = 0):
        found = []

        def ready() -> bool:
            status = self.status(name, after_ns=after_ns)
            if status is not None and check(status):
                found.append(status)
                return True
            return False

        self.spin_until(ready, timeout_s)
        return found[0] if found else None

    # --- the node's lifecycle, as ros2 lifecycle get/set --------------------------------------

    def lifecycle_state(self, node_name: str, timeout_s: float = 10.0) -> str:
        """The label of ``node_name``'s lifecycle state (``ros2 lifecycle get``)."""
        response = self._call(GetState, f'{node_name}/get_state', GetState.Request(), timeout_s)
        return response.current_state.label

    def change_state(self, node_name: str, label: str, timeout_s: float = 30.0) -> bool:
        """Whether ``node_name`` took the transition ``label`` (``configure``, ``activate``,
        ...), asked as ``ros2 lifecycle set`` asks: the label is looked up among the node's
        available transitions (False when it is not one of them), then taken by its id."""
        available = self._call(
            GetAvailableTransitions,
            f'{node_name}/get_available_transitions',
            GetAvailableTransitions.Request(),
            timeout_s,
        ).available_transitions
        match = [t.transition for t in available if t.transition.label == label]
        if not match:
            return False
        request = ChangeState.Request(transition=match[0])
        return self._call(ChangeState, f'{node_name}/change_state', request, timeout_s).success

    # --- the node's parameters, as ros2 param dump reads them ---------------------------------

    def parameters(self, node_name: str, timeout_s: float = 30.0) -> dict[str, Any]:
        """Every parameter of ``node_name`` and its value, read through its list and get
        parameters services."""
        listed = self._call(
            ListParameters, f'{node_name}/list_parameters', ListParameters.Request(), timeout_s
        )
        names = sorted(listed.result.names)
        got = self._call(
            GetParameters, f'{node_name}/get_parameters', GetParameters.Request(names=names), 30
        )
        return {n: parameter_value_to_python(v) for n, v in zip(names, got.values, strict=True)}

    def _call(self, srv_type, name: str, request, timeout_s: float):
        client = self.node.create_client(srv_type, name)
        try:
            assert client.wait_for_service(timeout_sec=timeout_s), f'no service {name}'
            future = client.call_async(request)
            assert self.spin_until(future.done, timeout_s), f'{name} did not answer'
            return future.result()
        finally:
            self.node.destroy_client(client)

    # --- playing the robots -----------------------------------------------------------------

    def publish_image(self, rid: str, msg: Image) -> None:
        self.images[rid].publish(msg)

    def publish_frame(self, rid: str, *, stamp_ns: int | None = None, size: int = 32) -> int:
        """A synthetic frame (rgb8, or PNG for compressed robots) stamped ``stamp_ns`` (now by
        default); returns the stamp."""
        stamp_ns = _now() if stamp_ns is None else stamp_ns
        frame = synthetic_frame(self._frames[rid], width=size, height=size)
        self._frames[rid] += 1
        if rid in self.compressed:
            ok, png = cv2.imencode('.png', np.ascontiguousarray(frame[..., ::-1]))
            assert ok
            msg = CompressedImage(format='png', data=png.tobytes())
            msg.header.stamp = ns_to_stamp(stamp_ns)
        else:
            msg = rgb_to_image(frame, stamp=ns_to_stamp(stamp_ns))
        self.images[rid].publish(msg)
        return stamp_ns

    def publish_joints(
        self, rid: str, names=JOINTS, positions=None, *, stamp_ns: int | None = None
    ) -> None:
        """A joint state stamped ``stamp_ns`` (now by default)."""
        positions = np.linspace(-0.5, 0.5, len(names)) if positions is None else positions
        msg = JointState(name=list(names), position=[float(p) for p in positions])
        msg.header.stamp = ns_to_stamp(_now() if stamp_ns is None else stamp_ns)
        self.joints[rid].publish(msg)

    def publish_instruction(self, rid: str, text: str) -> None:
        self.instructions[rid].publish(String(data=text))

    def start_camera(self, rid: str, rate_hz: float) -> None:
        """Publish a new frame and joint state at ``rate_hz`` while spinning."""

        def tick() -> None:
            self.publish_joints(rid)
            self.publish_frame(rid)

        self._cameras[rid] = self.node.create_timer(1.0 / rate_hz, tick)

    def stop_camera(self, rid: str) -> None:
        timer = self._cameras.pop(rid, None)
        if timer is not None:
            self.node.destroy_timer(timer)

    def close(self) -> None:
        self.executor.shutdown()
        self.node.destroy_node()
        self.context.try_shutdown()


def dump_yaml(node_name: str, values: dict[str, Any]) -> str:
    """The YAML ``ros2 param dump`` prints: nested at each '.', keyed by the node's name."""
    tree: dict = {}
    for name, value in values.items():
        *groups, leaf = name.split('.')
        holder = tree
        for group in groups:
            holder = holder.setdefault(group, {})
        holder[leaf] = value
    return yaml.dump({node_name: {'ros__parameters': tree}}, default_flow_style=False)


def _now() -> int:
    return time.time_ns()


def values_of(status) -> dict[str, str]:
    return {kv.key: kv.value for kv in status.values}


def level_of(status) -> int:
    return status.level[0]
