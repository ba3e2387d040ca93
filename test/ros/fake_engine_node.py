"""The vla_sched node with a fake engine that takes two images per step, as a process of its
own (``test_node_cameras.py`` starts it with a parameter file, as ``NodeProcess`` does).

The engine is ready at once; each step it is sent gets a chunk whose first action tells what
the step carried: the number of images, then each image's first pixel value, primary first.

    python test/ros/fake_engine_node.py --ros-args --params-file params.yaml
"""

from __future__ import annotations

import sys

import numpy as np
import rclpy
from rclpy.executors import ExternalShutdownException, SingleThreadedExecutor

from vla_sched.ipc.messages import EngineInfo, StepRequest, StepResult
from vla_sched.ros.node import VlaSchedNode

HORIZON, DOF, NUM_IMAGES = 8, 7, 2


class TwoCameraEngine:
    """An engine client (the node's ``client_factory`` seam) answering every step at once."""

    alive = True
    heartbeat_age_s = 0.0
    pid = None
    failure = ''
    num_bad_frames = 0

    def __init__(self) -> None:
        self.info = EngineInfo(
            model_name='two_camera_fake',
            num_state=0,
            action_horizon=HORIZON,
            action_dim=DOF,
            image_size=32,
            max_instruction_bytes=1024,
            random_weights=True,
            num_images=NUM_IMAGES,
        )
        self.on_arrival = lambda: None
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
        actions = np.zeros((HORIZON, DOF), np.float32)
        carried = [len(msg.images), *(int(image[0, 0, 0]) for image in msg.images)]
        actions[0, : len(carried)] = carried
        self._results.append(
            StepResult(msg.robot_id, msg.step_seq, msg.stamp_ns, actions, 0.0, 0.0, 0.0, False, 0)
        )
        self.on_arrival()

    def poll(self, timeout_s: float = 0.0) -> list:
        results, self._results = self._results, []
        return results


def main(argv: list[str]) -> int:
    with rclpy.init(args=argv):
        node = VlaSchedNode(client_factory=lambda config: TwoCameraEngine(), command_line=argv)
        executor = SingleThreadedExecutor()
        executor.add_node(node)
        try:
            executor.spin()
        except (KeyboardInterrupt, ExternalShutdownException):
            pass
        finally:
            node.close()
            node.destroy_node()
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
