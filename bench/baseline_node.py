"""What users run today: one request at a time through transformers ``generate``.

OpenVLA's deploy server answers each request by building the prompt, preprocessing the
image, calling ``generate`` for the action tokens and un-normalizing them; requests are
served one after another, with no batching and no KV kept between them. This node does
exactly that for a vla_sched checkpoint, behind the same ROS topics as the vla_sched node,
so the same simulated robots measure both:

- per robot (namespace ``robot_id``): subscribes ``camera/image_raw`` and
  ``vla/instruction``; publishes ``vla/action_chunk`` (``vla_sched/msg/ActionChunk``);
- a robot sends a step for each new image when nothing is in flight (``--trigger
  on_image``), or once per ``period_s`` with its newest image (``periodic``): the rules of
  the vla_sched node's robots;
- one worker thread serves the robot that has been due longest, one request at a time, and
  publishes its chunk; the ROS thread only stores the newest image of each robot, so no
  timer competes with the model. A chunk published after ``stamp + budget_s`` is marked
  ``late`` (nothing is dropped: the deploy server has no deadlines).

The prompt and the image preprocessing are the checkpoint's (``VLAPromptBuilder``,
``preprocess_image``), so both nodes feed the model the same tokens and pixels. Decoding is
greedy and, for a LLaVA-layout checkpoint, restricted to the action tokens as the vla_sched
engine does (a random checkpoint would otherwise emit text tokens); an OpenVLA-format folder
runs OpenVLA's ``predict_action`` (``vla_sched.model.hf_openvla``: greedy over the whole
vocabulary, the ids clipped into the bins), and ``--unnorm-key`` picks its dataset.

    python bench/baseline_node.py --robots 8 --period 0.1
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from vla_sched.model.prompting.action_tokenizer import ActionChunkDecoder

os.environ.setdefault('HF_HUB_OFFLINE', '1')
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import rclpy
import torch
from rclpy.executors import ExternalShutdownException
from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
from rclpy.qos import qos_profile_sensor_data as sensor_qos
from sensor_msgs.msg import Image
from std_msgs.msg import String

from vla_sched.engine.config import DEVICES
from vla_sched.msg import ActionChunk
from vla_sched.ros.conversions import ConversionError, image_to_rgb, ns_to_stamp, stamp_to_ns
from vla_sched.ros.node_config import TRIGGERS

READY_LINE = 'baseline: ready'


@dataclass(frozen=True, slots=True)
class BaselineRequest:
    """One robot's step waiting for the model."""

    robot_id: str
    step_seq: int
    stamp_ns: int
    received_ns: int
    image: np.ndarray
    instruction: str


@dataclass(frozen=True, slots=True)
class BaselineResult:
    request: BaselineRequest
    actions: np.ndarray  # float32 [horizon, dof]
    started_ns: int
    done_ns: int


class ActionTokenMask:
    """A logits processor that keeps only the action tokens ``[start, end)``."""

    def __init__(self, start: int, end: int) -> None:
        self.start, self.end = start, end

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        masked = torch.full_like(scores, float('-inf'))
        masked[:, self.start : self.end] = scores[:, self.start : self.end]
        return masked


class GeneratePolicy:
    """The checkpoint behind ``predict_action``: prompt, pixels, ``generate``, un-normalize.

    Args:
        folder: checkpoint folder: LLaVA layout (``LlavaForConditionalGeneration``, action
            tokens only) or OpenVLA's (``HFOpenVLAPolicy``: OpenVLA's ``predict_action``,
            greedy over the whole vocabulary, ids clipped into the bins).
        device: torch device.
        dtype: weights dtype (bfloat16 on a GPU, float32 on the CPU).
        unnorm_key: dataset of the action statistics (needed when there are several).
    """

    def __init__(
        self,
        folder: Path,
        *,
        device: torch.device,
        dtype: torch.dtype,
        unnorm_key: str | None = None,
    ) -> None:
        from vla_sched.model.config.formats import read_checkpoint_spec
        from vla_sched.model.config.openvla_towers import OpenVLAVisionSpec
        from vla_sched.model.prompting.prompt import VLAPromptBuilder

        self.device, self.dtype = device, dtype
        self.spec = read_checkpoint_spec(folder)
        if unnorm_key:
            self.spec = self.spec.with_unnorm_key(unnorm_key)
        self.openvla = None
        if isinstance(self.spec.vision, OpenVLAVisionSpec):
            from vla_sched.model.hf_openvla import HFOpenVLAPolicy

            self.openvla = HFOpenVLAPolicy(folder, device=device, dtype=dtype, spec=self.spec)
            return
        import transformers

        self.prompts = VLAPromptBuilder.from_checkpoint(folder, spec=self.spec)
        self.model = transformers.LlavaForConditionalGeneration.from_pretrained(
            folder, dtype=dtype
        ).to(device)
        self.model.eval()
        self.decoder = ActionChunkDecoder.for_checkpoint(self.spec)
        self.mask = ActionTokenMask(*self.spec.action_token_range)

    @torch.inference_mode()
    def predict_action(self, image: np.ndarray, instruction: str) -> np.ndarray:
        """The un-normalized action chunk ``[horizon, dof]`` for one image."""
        from vla_sched.model.layers.vision import preprocess_image

        if self.openvla is not None:
            return self.openvla.predict(image, instruction).astype(np.float32)
        layout = self.prompts.build(instruction)
        input_ids = torch.tensor([layout.token_ids], device=self.device)
        pixels = preprocess_image(image, self.spec.preprocessing, device=self.device)
        num_tokens = self.spec.num_action_tokens
        out = self.model.generate(
            input_ids=input_ids,
            attention_mask=torch.ones_like(input_ids),
            pixel_values=pixels[None].to(self.dtype),
            max_new_tokens=num_tokens,
            min_new_tokens=num_tokens,
            do_sample=False,
            logits_processor=[self.mask],
            pad_token_id=0,
        )
        tokens = out[0, input_ids.shape[1] :].tolist()
        return self.decoder.decode(tokens).astype(np.float32)


class RobotCadence:
    """One robot's steps as a client of a one-at-a-time server would send them.

    The robot sends a step when its period has come (a period of 0: at once), it has a new
    image and nothing is in flight (the rules of the vla_sched node's robots), with the
    newest image it has then; the step then waits in the server's FIFO queue. To serve
    steps in that order with no dispatch timer, the worker computes each robot's send time
    afterwards: the latest of its due time, the end of its previous step and the arrival
    of its first new image; the step carries the newest image received by then.
    """

    def __init__(self, period_ns: int, *, max_images: int = 256) -> None:
        self.period_ns = period_ns
        self.next_due_ns: int | None = None
        self.ready_ns = 0  # when the previous step ended
        self.images: deque[tuple[np.ndarray, int, int]] = deque(maxlen=max_images)
        self.in_flight = False
        self.step_seq = 0

    def offer(self, image: np.ndarray, stamp_ns: int, received_ns: int) -> None:
        self.images.append((image, stamp_ns, received_ns))

    def send_time(self) -> int | None:
        """When the robot sends (or sent) its next step; None while it cannot."""
        if self.in_flight or not self.images:
            return None
        due = 0 if self.next_due_ns is None else self.next_due_ns
        return max(due, self.ready_ns, self.images[0][2])

    def take(self) -> tuple[tuple[np.ndarray, int, int], int]:
        """The step's image (newest received by the send time) and the send time."""
        sent = self.send_time()
        assert sent is not None
        chosen = self.images.popleft()
        while self.images and self.images[0][2] <= sent:
            chosen = self.images.popleft()
        if self.next_due_ns is None:
            self.next_due_ns = sent
        self.next_due_ns += self.period_ns
        if self.next_due_ns <= sent:  # fell behind: skip the missed periods
            self.next_due_ns = sent + self.period_ns
        self.in_flight = True
        self.step_seq += 1
        return chosen, sent

    def finish(self, now_ns: int) -> None:
        self.in_flight = False
        self.ready_ns = now_ns


class BaselineNode(Node):
    """The baseline's ROS side (see the module docstring).

    Callbacks only store the newest image (under ``lock``); ``next_request`` (called by the
    worker) waits until a robot is due and takes the one that has been due longest.
    """

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__('vla_baseline')
        self.args = args
        self.lock = threading.Condition()
        self.stopping = False
        self.cadence: dict[str, RobotCadence] = {}
        self.instructions: dict[str, str] = {}
        self.chunk_pubs = {}
        latched = QoSProfile(
            depth=1,
            reliability=ReliabilityPolicy.RELIABLE,
            durability=DurabilityPolicy.TRANSIENT_LOCAL,
        )
        for i in range(args.robots):
            rid = f'robot_{i}'
            period_s = args.period if args.trigger == 'periodic' else 0.0
            self.cadence[rid] = RobotCadence(round(period_s * 1e9))
            self.instructions[rid] = args.instruction
            self.chunk_pubs[rid] = self.create_publisher(
                ActionChunk, f'{rid}/vla/action_chunk', 10
            )
            self.create_subscription(
                Image, f'{rid}/camera/image_raw', partial(self._on_image, rid), sensor_qos
            )
            self.create_subscription(
                String, f'{rid}/vla/instruction', partial(self._on_instruction, rid), latched
            )

    def now_ns(self) -> int:
        return self.get_clock().now().nanoseconds

    def _on_image(self, rid: str, msg) -> None:
        now = self.now_ns()
        try:
            rgb = image_to_rgb(msg)
        except ConversionError as exc:
            self.get_logger().warning(f'{rid}: {exc}', throttle_duration_sec=1.0)
            return
        with self.lock:
            self.cadence[rid].offer(rgb, stamp_to_ns(msg.header.stamp) or now, now)
            self.lock.notify()

    def _on_instruction(self, rid: str, msg) -> None:
        if msg.data.strip():
            with self.lock:
                self.instructions[rid] = msg.data.strip()

    def next_request(self) -> BaselineRequest | None:
        """The step sent first among those sent by now (waiting for one), or None once
        ``stop`` was called."""
        with self.lock:
            while not self.stopping:
                now = self.now_ns()
                sends = {r: c.send_time() for r, c in self.cadence.items()}
                sends = {r: t for r, t in sends.items() if t is not None}
                if not sends:
                    self.lock.wait()
                    continue
                rid = min(sends, key=sends.__getitem__)
                if sends[rid] > now:
                    self.lock.wait(timeout=(sends[rid] - now) / 1e9)
                    continue
                cadence = self.cadence[rid]
                (image, stamp, received), _ = cadence.take()
                return BaselineRequest(
                    rid, cadence.step_seq, stamp, received, image, self.instructions[rid]
                )
        return None

    def publish_result(self, result: BaselineResult) -> None:
        rid = result.request.robot_id
        msg = chunk_message(result, self.now_ns(), budget_s=self.args.budget)
        self.chunk_pubs[rid].publish(msg)
        with self.lock:
            self.cadence[rid].finish(self.now_ns())
            self.lock.notify()

    def stop(self) -> None:
        with self.lock:
            self.stopping = True
            self.lock.notify_all()


def chunk_message(result: BaselineResult, now_ns: int, *, budget_s: float):
    """The ``ActionChunk`` of a finished request (the fields the vla_sched node fills)."""
    req, actions = result.request, result.actions
    deadline_ns = req.stamp_ns + round(budget_s * 1e9)
    msg = ActionChunk()
    msg.header.stamp = ns_to_stamp(req.stamp_ns)
    msg.header.frame_id = 'base_link'
    msg.robot_id = req.robot_id
    msg.step_seq = req.step_seq
    msg.horizon, msg.dof = int(actions.shape[0]), int(actions.shape[1])
    msg.dt = 0.1
    msg.actions = np.ascontiguousarray(actions, dtype=np.float32).reshape(-1)
    msg.joint_names = [f'action_{j}' for j in range(actions.shape[1])]
    msg.action_space = ActionChunk.ACTION_SPACE_EE_DELTA
    msg.deadline = ns_to_stamp(deadline_ns)
    msg.queue_ms = (result.started_ns - req.received_ns) / 1e6
    msg.prefill_ms = 0.0  # generate does not say; the whole call is in decode_ms
    msg.decode_ms = (result.done_ns - result.started_ns) / 1e6
    msg.total_ms = max(0.0, (now_ns - req.stamp_ns) / 1e6)
    msg.late = now_ns > deadline_ns
    return msg


def serve(policy: GeneratePolicy, node: BaselineNode) -> None:
    """The worker: one request at a time, until the node stops."""
    while (req := node.next_request()) is not None:
        started = time.time_ns()
        actions = policy.predict_action(req.image, req.instruction)
        node.publish_result(BaselineResult(req, actions, started, time.time_ns()))


def pick_device(name: str, *, cpu_threads: int) -> tuple[torch.device, torch.dtype]:
    """bfloat16 on a GPU; float32 on ``cpu_threads`` torch threads on the CPU (as the engine)."""
    if name == 'auto':
        name = 'cuda' if torch.cuda.is_available() else 'cpu'
    device = torch.device(name)
    if device.type == 'cpu':
        torch.set_num_threads(cpu_threads)
        return device, torch.float32
    return device, torch.bfloat16


def run(args: argparse.Namespace) -> int:
    from vla_sched.engine.checkpoints import resolve_checkpoint

    folder, _ = resolve_checkpoint(args.model_path)
    device, dtype = pick_device(args.device, cpu_threads=args.cpu_threads)
    policy = GeneratePolicy(folder, device=device, dtype=dtype, unnorm_key=args.unnorm_key)
    try:
        with rclpy.init(args=['baseline_node']), BaselineNode(args) as node:
            worker = threading.Thread(
                target=serve, args=(policy, node), name='generate', daemon=True
            )
            worker.start()
            print(
                f'{READY_LINE}: {folder.name} on {device} ({dtype}), {args.robots} robots',
                flush=True,
            )
            try:
                rclpy.spin(node)
            finally:
                node.stop()
                worker.join(timeout=30)
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--robots', type=int, default=1, help='serves robot_0 .. robot_{N-1}')
    parser.add_argument('--period', type=float, default=0.1, help='control period (s)')
    parser.add_argument('--trigger', choices=TRIGGERS, default='on_image')
    parser.add_argument('--budget', type=float, default=0.5, help='late after stamp + this (s)')
    parser.add_argument('--instruction', default='pick up the red block')
    parser.add_argument('--model-path', default='', help='checkpoint (default: the tiny one)')
    parser.add_argument(
        '--unnorm-key', default='', help='dataset of the action statistics (several in a folder)'
    )
    parser.add_argument('--device', choices=DEVICES, default='auto')
    parser.add_argument('--cpu-threads', type=int, default=1, help='torch threads on the CPU')
    args = parser.parse_args(argv)
    if min(args.robots, args.cpu_threads) < 1:
        parser.error('--robots and --cpu-threads must be >= 1')
    if min(args.period, args.budget) <= 0:
        parser.error('--period and --budget must be > 0')
    return args


def main(argv: list[str] | None = None) -> int:
    return run(parse_args(argv))


if __name__ == '__main__':
    sys.exit(main())
