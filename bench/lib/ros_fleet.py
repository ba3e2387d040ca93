"""N simulated robots through ROS in one process, measured over a window: what the node faces.

Each robot is one rclpy node under its own namespace with the topics of
``vla_sched.ros.sim_robot`` (camera, joint states, latched instruction; it receives
``vla/action_chunk`` and ``vla/step_rejected``) and the same frames, joint waves and log
(``SimRobotLog``). Running every robot as a node of one process, on one executor thread,
keeps the fleet's own CPU cost small and equal for whichever node serves it, which matters
on a 2-core machine; ``vla_sched.ros.demo`` runs each robot as a process instead.

``start_window`` starts fresh logs; ``end_window`` returns a ``FleetWindow``: chunks,
latency samples (now minus the chunk's stamp, the image stamp), the server's own timing of
each chunk, deadline misses and refusals of every robot during the window only.

The robots publish what ``vla_sched.ros.sim_robot`` publishes, frame for frame, as cheaply
as they can: each robot draws ``synthetic_frame(i)`` from a gradient it computed once
(``bench/lib/fleets.FrameSource``: the same bytes, a new square and blue level every tick,
so every frame is a new image to the engine), and its nodes have no parameter services and
no QoS event handlers, which rclpy's executor would walk on every wake-up.
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import rclpy
from rclpy.event_handler import PublisherEventCallbacks, SubscriptionEventCallbacks
from rclpy.executors import SingleThreadedExecutor
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
from rclpy.qos import qos_profile_sensor_data as sensor_qos
from sensor_msgs.msg import Image, JointState
from std_msgs.msg import String

from bench.lib.fleets import FrameSource
from bench.lib.stats import percentile
from vla_sched.msg import ActionChunk, StepRejected
from vla_sched.ros.conversions import rgb_to_image, stamp_to_ns
from vla_sched.ros.sim_robot import DEFAULT_JOINTS, SimRobotLog, joint_state

STAGES = ('queue', 'prefill', 'decode', 'total')


@dataclass(frozen=True, slots=True)
class FleetConfig:
    """How the simulated robots behave.

    Attributes:
        camera_rate_hz: images (and joint states) each robot publishes per second.
        width, height: camera frame size.
        instruction: published once, latched, by every robot.
        camera_topics: the robot's cameras (the primary first), all published with one
            stamp per tick; each further camera's frame is the primary's shifted sideways.
        joint_names: the names of the joint states.
    """

    camera_rate_hz: float = 10.0
    width: int = 64
    height: int = 64
    instruction: str = 'pick up the red block'
    camera_topics: tuple[str, ...] = ('camera/image_raw',)
    joint_names: tuple[str, ...] = DEFAULT_JOINTS

    def __post_init__(self) -> None:
        if not self.camera_rate_hz > 0:
            raise ValueError(f'camera_rate_hz must be > 0, got {self.camera_rate_hz}')
        if self.width < 1 or self.height < 1:
            raise ValueError(f'bad frame size {self.width}x{self.height}')


@dataclass
class FleetWindow:
    """What the robots received during one measurement window."""

    duration_s: float
    robots: list[dict[str, Any]]  # SimRobotLog summaries
    latencies_ms: list[float] = field(default_factory=list)  # every chunk of every robot
    num_late_chunks: int = 0
    # the server's own account of every chunk: ActionChunk queue_ms, prefill_ms, decode_ms
    # and total_ms (publication minus the image stamp)
    stages_ms: dict[str, list[float]] = field(default_factory=dict)

    @property
    def num_chunks(self) -> int:
        return sum(r['num_chunks'] for r in self.robots)

    @property
    def num_misses(self) -> int:
        return sum(r['misses'] for r in self.robots)

    @property
    def num_rejected(self) -> int:
        return sum(sum(r['rejected'].values()) for r in self.robots)

    def latency_ms(self, q: float) -> float:
        """The ``q``-th percentile of every chunk's latency; NaN without chunks."""
        return percentile(self.latencies_ms, q)


class FleetRobot:
    """One simulated robot (topics and behaviour of ``vla_sched.ros.sim_robot``)."""

    def __init__(self, context, robot_id: str, config: FleetConfig) -> None:
        self.robot_id = robot_id
        self.config = config
        self.node = rclpy.create_node(
            f'sim_{robot_id}', namespace=robot_id, context=context, start_parameter_services=False
        )
        self.log = SimRobotLog(robot_id)
        self.latencies_ms: list[float] = []
        self.stages_ms: dict[str, list[float]] = {k: [] for k in STAGES}
        self.num_frames = 0
        self._frames = FrameSource(width=config.width, height=config.height)
        quiet_pub = PublisherEventCallbacks(use_default_callbacks=False)
        quiet_sub = SubscriptionEventCallbacks(use_default_callbacks=False)
        self._images = [
            self.node.create_publisher(Image, topic, sensor_qos, event_callbacks=quiet_pub)
            for topic in config.camera_topics
        ]
        self._joints = self.node.create_publisher(
            JointState, 'joint_states', sensor_qos, event_callbacks=quiet_pub
        )
        latched = QoSProfile(
            depth=1,
            reliability=ReliabilityPolicy.RELIABLE,
            durability=DurabilityPolicy.TRANSIENT_LOCAL,
        )
        instruction = self.node.create_publisher(
            String, 'vla/instruction', latched, event_callbacks=quiet_pub
        )
        instruction.publish(String(data=config.instruction))
        self.node.create_subscription(
            ActionChunk, 'vla/action_chunk', self._on_chunk, 10, event_callbacks=quiet_sub
        )
        self.node.create_subscription(
            StepRejected, 'vla/step_rejected', self._on_rejected, 10, event_callbacks=quiet_sub
        )
        self.node.create_timer(1.0 / config.camera_rate_hz, self._publish_frame)

    def _publish_frame(self) -> None:
        stamp = self.node.get_clock().now().to_msg()
        self._joints.publish(joint_state(self.config.joint_names, time.monotonic(), stamp))
        frame = self._frames.frame(self.num_frames)
        for index, publisher in enumerate(self._images):
            # each further camera sees the frame shifted: an image of its own to the engine
            view = frame if index == 0 else np.roll(frame, 7 * index, axis=1)
            publisher.publish(
                rgb_to_image(view, stamp=stamp, frame_id=f'{self.robot_id}_camera{index or ""}')
            )
        self.num_frames += 1
        self.log.num_images += 1

    def _on_chunk(self, msg) -> None:
        now = time.time_ns()
        self.log.on_chunk(msg, now)
        self.latencies_ms.append((now - stamp_to_ns(msg.header.stamp)) / 1e6)
        for stage in STAGES:
            self.stages_ms[stage].append(float(getattr(msg, f'{stage}_ms')))

    def _on_rejected(self, msg) -> None:
        self.log.on_rejected(msg)

    def restart_log(self) -> None:
        self.log = SimRobotLog(self.robot_id)
        self.latencies_ms = []
        self.stages_ms = {k: [] for k in STAGES}

    def close(self) -> None:
        self.node.destroy_node()


class RobotFleet:
    """``num_robots`` simulated robots ``robot_0..`` spinning on one background thread.

    The fleet has an rclpy context of its own, initialized here and shut down by ``close``
    after the executor and the robots' nodes.
    """

    def __init__(self, num_robots: int, config: FleetConfig | None = None) -> None:
        if num_robots < 1:
            raise ValueError(f'num_robots must be >= 1, got {num_robots}')
        self.config = config if config is not None else FleetConfig()
        self.context = rclpy.Context()
        self.robots: list[FleetRobot] = []
        with contextlib.ExitStack() as stack:
            stack.enter_context(rclpy.init(args=[], context=self.context))
            for i in range(num_robots):
                self.robots.append(FleetRobot(self.context, f'robot_{i}', self.config))
                stack.callback(self.robots[-1].close)
            self.executor = stack.enter_context(SingleThreadedExecutor(context=self.context))
            for robot in self.robots:
                self.executor.add_node(robot.node)
            self._ros = stack.pop_all()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._window_start = time.monotonic()
        self._thread = threading.Thread(target=self._spin, name='robot-fleet', daemon=True)
        self._thread.start()

    def _spin(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                self.executor.spin_once(timeout_sec=0.01)

    def wait_for_chunks(self, timeout_s: float) -> bool:
        """Wait until every robot got a chunk since its log started; False on timeout."""
        end = time.monotonic() + timeout_s
        while not all(r.log.num_chunks > 0 for r in self.robots):
            if time.monotonic() >= end:
                return False
            time.sleep(0.05)
        return True

    def start_window(self) -> None:
        """Start fresh logs: what arrives from now on is measured."""
        with self._lock:
            for robot in self.robots:
                robot.restart_log()
            self._window_start = time.monotonic()

    def end_window(self) -> FleetWindow:
        """What the robots got since ``start_window``."""
        with self._lock:
            elapsed = time.monotonic() - self._window_start
            now = time.time_ns()
            window = FleetWindow(
                duration_s=elapsed, robots=[r.log.summary(now) for r in self.robots]
            )
            for robot in self.robots:
                window.latencies_ms.extend(robot.latencies_ms)
                window.num_late_chunks += robot.log.num_late
                for stage, values in robot.stages_ms.items():
                    window.stages_ms.setdefault(stage, []).extend(values)
        return window

    def close(self) -> None:
        """Stop the spin thread; shut down the executor, the robots' nodes, the context."""
        self._stop.set()
        self._thread.join(timeout=5)
        self._ros.close()
