"""A simulated robot: a moving synthetic camera, joint states, an instruction, and a log of
the action chunks it gets back.

    python -m vla_sched.ros.sim_robot --robot-id robot_0 --rate 10 --duration 20

It publishes, under its namespace, an image on each of its ``--camera-topics`` (default
``camera/image_raw``; rgb8, a square moving over a gradient, all cameras' images of a frame
stamped alike), ``joint_states`` (sine waves) and ``vla/instruction`` (once, transient local), and
subscribes ``vla/action_chunk`` and ``vla/step_rejected``. It measures each chunk's latency
(now minus the chunk's stamp, which is the image's stamp) and, with ``--report-period``,
prints a JSON progress line per period; at exit it prints a JSON summary line.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections import Counter
from typing import Any

import rclpy
from rclpy.executors import ExternalShutdownException
from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
from rclpy.qos import qos_profile_sensor_data as sensor_qos
from rclpy.signals import SignalHandlerOptions
from rclpy.utilities import remove_ros_args
from sensor_msgs.msg import Image, JointState
from std_msgs.msg import String

from vla_sched.msg import ActionChunk, StepRejected
from vla_sched.ros.conversions import rgb_to_image, stamp_to_ns
from vla_sched.ros.shutdown import ShutdownRequest
from vla_sched.ros.windows import EventWindow, MsLatencyWindow
from vla_sched.synthetic_frames import synthetic_frame

DEFAULT_JOINTS = ('joint_1', 'joint_2', 'joint_3', 'joint_4', 'joint_5', 'joint_6', 'gripper')
DEADLINE_REASON = 5  # StepRejected.REASON_DEADLINE_MISSED
# Fast DDS's shared-memory segment holds 512 KiB by default: a larger frame travels in UDP
# fragments, and a best-effort frame of which one is lost never arrives.
FASTDDS_SEGMENT_BYTES = 512 * 1024
LARGE_FRAMES_PROFILE = 'fastdds_large_frames.xml'


class SimRobotLog:
    """What the robot received: chunks, rejections, latencies. Times in nanoseconds."""

    def __init__(self, robot_id: str, *, window_s: float = 2.0) -> None:
        self.robot_id = robot_id
        self.num_chunks = 0
        self.num_late = 0
        self.rejected: Counter[str] = Counter()
        self.latencies = MsLatencyWindow(capacity=4096)
        self.recent = EventWindow(round(window_s * 1e9))
        self.first_chunk: dict[str, Any] | None = None
        self.last_step_seq = 0
        self.num_images = 0
        self.started_ns = time.time_ns()

    def on_chunk(self, msg, now_ns: int) -> None:
        self.num_chunks += 1
        self.num_late += int(msg.late)
        self.last_step_seq = int(msg.step_seq)
        self.latencies.add((now_ns - stamp_to_ns(msg.header.stamp)) / 1e6)
        self.recent.add(now_ns)
        if self.first_chunk is None:
            self.first_chunk = {
                'robot_id': msg.robot_id,
                'step_seq': int(msg.step_seq),
                'horizon': int(msg.horizon),
                'dof': int(msg.dof),
                'num_actions': len(msg.actions),
                'joint_names': list(msg.joint_names),
                'stamp_ns': stamp_to_ns(msg.header.stamp),
                'frame_id': msg.header.frame_id,
                'action_space': msg.action_space,
            }

    def on_rejected(self, msg) -> None:
        self.rejected[str(msg.reason)] += 1

    def summary(self, now_ns: int) -> dict[str, Any]:
        elapsed_s = max(1e-9, (now_ns - self.started_ns) / 1e9)
        return {
            'robot_id': self.robot_id,
            'num_images': self.num_images,
            'num_chunks': self.num_chunks,
            'rate_hz': round(self.recent.rate_hz(now_ns, since_ns=self.started_ns), 3),
            'mean_rate_hz': round(self.num_chunks / elapsed_s, 3),
            'latency_ms_p50': _rounded(self.latencies.percentile(50)),
            'latency_ms_p99': _rounded(self.latencies.percentile(99)),
            'misses': self.num_late + self.rejected.get(str(DEADLINE_REASON), 0),
            'rejected': dict(self.rejected),
            'last_step_seq': self.last_step_seq,
            'first_chunk': self.first_chunk,
        }


def _rounded(value: float) -> float | None:
    return None if math.isnan(value) else round(value, 2)


def joint_state(names, t_s: float, stamp):
    msg = JointState(name=list(names))
    msg.header.stamp = stamp
    msg.position = [0.5 * math.sin(t_s + 0.3 * i) for i in range(len(names))]
    return msg


def run(args: argparse.Namespace, ros_argv: list[str]) -> int:
    """Publish until ``--duration`` ends, ``--stop-after-chunks`` chunks came or SIGINT or
    SIGTERM (Ctrl-C), then print the summary line. Stopped by a signal, however many and
    whenever they come (also while starting): 0; otherwise 0 if any chunk came, else 1."""
    log = SimRobotLog(args.robot_id)
    with (
        ShutdownRequest() as shutdown,
        rclpy.init(args=ros_argv, signal_handler_options=SignalHandlerOptions.NO),
    ):
        ns = args.namespace or args.robot_id
        node = rclpy.create_node(f'sim_{args.robot_id}', namespace=ns)
        end = time.monotonic() + args.duration if args.duration > 0 else math.inf
        try:
            _set_up(node, args, log)
            while not shutdown.requested and rclpy.ok() and time.monotonic() < end:
                if args.stop_after_chunks and log.num_chunks >= args.stop_after_chunks:
                    break
                rclpy.spin_once(node, timeout_sec=0.05)
        except ExternalShutdownException:
            pass  # the context was shut down from elsewhere: stop as on a signal
        finally:
            print(json.dumps({'type': 'summary', **log.summary(time.time_ns())}), flush=True)
            node.destroy_node()
    return 0 if log.num_chunks > 0 or shutdown.requested else 1


def use_large_frame_transport(frame_bytes: int, environ=os.environ) -> str | None:
    """Point Fast DDS at ``config/fastdds_large_frames.xml`` when a frame is larger than its
    shared-memory segment and no profile was chosen (call before ``rclpy.init``); the
    profile's path, or None when it was not needed or not found."""
    chosen = ('FASTDDS_DEFAULT_PROFILES_FILE', 'FASTRTPS_DEFAULT_PROFILES_FILE')
    if frame_bytes <= FASTDDS_SEGMENT_BYTES or any(environ.get(name) for name in chosen):
        return None
    if environ.get('RMW_IMPLEMENTATION', 'rmw_fastrtps_cpp') != 'rmw_fastrtps_cpp':
        return None
    profile = _config_file(LARGE_FRAMES_PROFILE)
    if profile is not None:
        environ['FASTDDS_DEFAULT_PROFILES_FILE'] = profile
    return profile


def _config_file(name: str) -> str | None:
    """``name`` in the package's installed share folder, else in the checkout's config/."""
    try:
        from ament_index_python.packages import get_package_share_directory

        candidates = [os.path.join(get_package_share_directory('vla_sched'), 'config', name)]
    except Exception:  # not in the ament index: a checkout
        candidates = []
    candidates.append(os.path.join(os.path.dirname(__file__), '..', '..', 'config', name))
    found = [path for path in candidates if os.path.isfile(path)]
    return os.path.realpath(found[0]) if found else None


def _set_up(node: Node, args: argparse.Namespace, log: SimRobotLog) -> None:
    """The robot's publishers, subscriptions and timers on ``node``; chunks go to ``log``."""
    cameras = [node.create_publisher(Image, topic, sensor_qos) for topic in args.camera_topics]
    sizes = _camera_sizes(args)
    joints = node.create_publisher(JointState, 'joint_states', sensor_qos)
    latched = QoSProfile(
        depth=1,
        reliability=ReliabilityPolicy.RELIABLE,
        durability=DurabilityPolicy.TRANSIENT_LOCAL,
    )
    instruction = node.create_publisher(String, 'vla/instruction', latched)
    node.create_subscription(
        ActionChunk, 'vla/action_chunk', lambda m: log.on_chunk(m, time.time_ns()), 10
    )
    node.create_subscription(StepRejected, 'vla/step_rejected', log.on_rejected, 10)
    if args.instruction:
        instruction.publish(String(data=args.instruction))

    def publish_frame() -> None:
        stamp = node.get_clock().now().to_msg()
        joints.publish(joint_state(args.joint_names, time.monotonic(), stamp))
        for camera, publisher in enumerate(cameras):
            width, height = sizes[camera]
            frame = synthetic_frame(log.num_images, width=width, height=height)
            frame_id = f'{args.robot_id}_camera' + (f'_{camera}' if camera else '')
            publisher.publish(rgb_to_image(frame, stamp=stamp, frame_id=frame_id))
        log.num_images += 1

    def report() -> None:
        print(json.dumps({'type': 'progress', **log.summary(time.time_ns())}), flush=True)

    node.create_timer(1.0 / args.rate, publish_frame)
    if args.report_period > 0:
        node.create_timer(args.report_period, report)


def _camera_sizes(args: argparse.Namespace) -> list[tuple[int, int]]:
    """(width, height) of each camera: ``--camera-sizes`` or ``--width`` x ``--height``."""
    if not args.camera_sizes:
        return [(args.width, args.height)] * len(args.camera_topics)
    return [tuple(int(v) for v in size.lower().split('x')) for size in args.camera_sizes]


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--robot-id', default='robot_0')
    parser.add_argument('--namespace', default='', help='topic namespace (default: the id)')
    parser.add_argument('--rate', type=float, default=10.0, help='camera and joint rate (Hz)')
    parser.add_argument('--width', type=int, default=64)
    parser.add_argument('--height', type=int, default=64)
    parser.add_argument('--instruction', default='pick up the red block')
    parser.add_argument('--joint-names', nargs='*', default=list(DEFAULT_JOINTS))
    parser.add_argument(
        '--camera-topics',
        nargs='+',
        default=['camera/image_raw'],
        help='image topics under the namespace, the primary first (one image each per frame)',
    )
    parser.add_argument(
        '--camera-sizes',
        nargs='*',
        default=[],
        help='WIDTHxHEIGHT of each camera, in --camera-topics order (default: --width x --height)',
    )
    parser.add_argument('--duration', type=float, default=0.0, help='seconds (0: until ^C)')
    parser.add_argument('--stop-after-chunks', type=int, default=0)
    parser.add_argument('--report-period', type=float, default=0.0, help='JSON progress (s)')
    args = parser.parse_args(remove_ros_args(['sim_robot', *argv])[1:])
    if args.rate <= 0 or args.width < 1 or args.height < 1:
        parser.error('--rate, --width and --height must be positive')
    if args.camera_sizes:
        sizes = [s.lower().split('x') for s in args.camera_sizes]
        if len(sizes) != len(args.camera_topics) or not all(
            len(wh) == 2 and all(v.isdigit() and int(v) > 0 for v in wh) for wh in sizes
        ):
            parser.error('--camera-sizes needs one WIDTHxHEIGHT (positive) per camera topic')
    use_large_frame_transport(max(w * h * 3 for w, h in _camera_sizes(args)))
    return run(args, ['sim_robot', *argv])


if __name__ == '__main__':
    sys.exit(main())
