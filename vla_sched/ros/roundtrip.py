"""Send ActionChunk messages from one process to another over DDS and check every field.

The smallest end-to-end proof that the generated messages, rclpy and the middleware work on
this machine::

    python -m vla_sched.ros.roundtrip demo            # starts a subscriber process, publishes
    python -m vla_sched.ros.roundtrip sub --count 2   # prints each chunk received as JSON
    python -m vla_sched.ros.roundtrip pub --count 2   # publishes example chunks
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import numpy as np
import rclpy
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy

from vla_sched.msg import ActionChunk

TOPIC = '/vla_roundtrip/action_chunk'
EXAMPLE_JOINTS = ('x', 'y', 'z', 'roll', 'pitch', 'yaw', 'gripper')


def example_chunk(index: int, *, horizon: int = 8, dof: int = 7):
    """Build the ``index``-th example chunk: distinct, exactly representable float32 values."""
    rng = np.random.default_rng(index)
    msg = ActionChunk()
    msg.header.stamp.sec = 1_700_000_000 + index
    msg.header.stamp.nanosec = 123_456_789
    msg.header.frame_id = 'base_link'
    msg.robot_id = f'robot_{index}'
    msg.step_seq = 2**40 + index
    msg.horizon = horizon
    msg.dof = dof
    msg.dt = 0.02
    msg.actions = rng.standard_normal(horizon * dof).astype(np.float32)
    msg.joint_names = [EXAMPLE_JOINTS[j % len(EXAMPLE_JOINTS)] + str(j) for j in range(dof)]
    msg.action_space = ActionChunk.ACTION_SPACE_EE_DELTA
    msg.deadline.sec = msg.header.stamp.sec
    msg.deadline.nanosec = 223_456_789
    msg.queue_ms = 1.5
    msg.prefill_ms = 12.25
    msg.decode_ms = 30.125
    msg.total_ms = 44.0
    msg.late = index % 2 == 1
    return msg


def chunk_to_dict(msg) -> dict:
    """Every field of an ActionChunk as JSON-safe values (float32 values kept exact)."""
    actions = np.frombuffer(msg.actions, dtype=np.float32) if len(msg.actions) else []
    return {
        'stamp': [msg.header.stamp.sec, msg.header.stamp.nanosec],
        'frame_id': msg.header.frame_id,
        'robot_id': msg.robot_id,
        'step_seq': msg.step_seq,
        'horizon': msg.horizon,
        'dof': msg.dof,
        'dt': float(np.float32(msg.dt)),
        'actions': [float(a) for a in actions],
        'joint_names': list(msg.joint_names),
        'action_space': msg.action_space,
        'deadline': [msg.deadline.sec, msg.deadline.nanosec],
        'timing_ms': [
            float(np.float32(v))
            for v in (msg.queue_ms, msg.prefill_ms, msg.decode_ms, msg.total_ms)
        ],
        'late': msg.late,
    }


def _qos(depth: int):
    # Transient local: a subscriber that matches after the publish still gets the chunks.
    return QoSProfile(
        depth=depth,
        reliability=ReliabilityPolicy.RELIABLE,
        durability=DurabilityPolicy.TRANSIENT_LOCAL,
    )


def run_subscriber(*, count: int, timeout_s: float) -> int:
    """Print each received chunk as one JSON line; return 0 once ``count`` arrived."""
    received: list[dict] = []
    with rclpy.init(), rclpy.create_node('vla_roundtrip_sub') as node:
        node.create_subscription(
            ActionChunk, TOPIC, lambda m: received.append(chunk_to_dict(m)), _qos(count)
        )
        print('ready', flush=True)
        end = time.monotonic() + timeout_s
        while len(received) < count and time.monotonic() < end:
            rclpy.spin_once(node, timeout_sec=0.1)
        for item in received:
            print(json.dumps(item), flush=True)
    return 0 if len(received) >= count else 1


def run_publisher(*, count: int, timeout_s: float) -> int:
    """Publish ``count`` example chunks and stay until the subscriber has gone."""
    with rclpy.init(), rclpy.create_node('vla_roundtrip_pub') as node:
        pub = node.create_publisher(ActionChunk, TOPIC, _qos(count))
        end = time.monotonic() + timeout_s
        while pub.get_subscription_count() == 0 and time.monotonic() < end:
            rclpy.spin_once(node, timeout_sec=0.05)
        for index in range(count):
            pub.publish(example_chunk(index))
        # Keep the transient-local history alive until the subscriber leaves.
        while pub.get_subscription_count() > 0 and time.monotonic() < end:
            rclpy.spin_once(node, timeout_sec=0.05)
    return 0


def run_demo(*, count: int, timeout_s: float) -> int:
    """Run a subscriber process and a publisher process; compare what arrived, field by field."""
    cmd = [sys.executable, '-m', 'vla_sched.ros.roundtrip']
    args = ['--count', str(count), '--timeout', str(timeout_s)]
    sub = subprocess.Popen([*cmd, 'sub', *args], stdout=subprocess.PIPE, text=True)
    assert sub.stdout is not None
    if sub.stdout.readline().strip() != 'ready':
        sub.kill()
        print('roundtrip: the subscriber process did not start', file=sys.stderr)
        return 1
    pub = subprocess.Popen([*cmd, 'pub', *args])
    out, _ = sub.communicate(timeout=timeout_s + 10)
    pub.wait(timeout=timeout_s + 10)
    got = [json.loads(line) for line in out.splitlines() if line.strip()]
    want = [chunk_to_dict(example_chunk(i)) for i in range(count)]
    for item in got:
        print(
            f'received {item["robot_id"]}: step {item["step_seq"]}, '
            f'{item["horizon"]}x{item["dof"]} actions, first {item["actions"][:3]}'
        )
    if got != want:
        print(f'roundtrip: FAILED, {len(got)} of {count} chunks arrived intact', file=sys.stderr)
        return 1
    print(f'roundtrip: {count} ActionChunk messages arrived intact in another process')
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('role', choices=('demo', 'pub', 'sub'))
    parser.add_argument('--count', type=int, default=2)
    parser.add_argument('--timeout', type=float, default=30.0)
    args = parser.parse_args(argv)
    run = {'demo': run_demo, 'pub': run_publisher, 'sub': run_subscriber}[args.role]
    return run(count=args.count, timeout_s=args.timeout)


if __name__ == '__main__':
    sys.exit(main())
