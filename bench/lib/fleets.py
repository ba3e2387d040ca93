"""One fleet of simulated robots, on whatever clock drives it: the node's rules for robots.

Each robot's camera takes an image every ``period_s`` (the robots' phases spread evenly over
the period, drawn at random, or aligned). A robot has at most one step in flight: an image
taken while one is waits, and a newer image supersedes a waiting one; when a step ends, the
waiting image (if any) is sent at once. An image whose deadline (``budget_s`` after its
stamp) passed before it could be sent is refused without being sent, as the node refuses it.
These are the rules of the node's ``on_image`` trigger (``vla_sched/ros/robot_slot.py``).

``Fleet`` keeps no clock: its driver tells it the time. The engine core driven in-process
(``bench/engine_paced.py``, ``bench/itl_jump.py``) uses the wall clock; the simulator
(``bench/lib/simulation.py``) a simulated one. Images stamped in the judged window
``[warmup, warmup + duration)`` after the start are judged (``bench/lib/capacity.judge``);
cameras stop at the window's end, and steps in flight are followed until they end.

``step_request`` is the ``StepRequest`` a driver sends for a robot's step, with a fresh
synthetic frame (``FrameSource`` draws ``vla_sched.synthetic_frames.synthetic_frame``'s
frames from a gradient made once, the same bytes at a tenth of the cost).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

from bench.lib.capacity import CapacityMeasure, StepEnd, judge
from vla_sched.ipc.messages import StepRequest

NS_PER_S = 1_000_000_000
PHASES = ('spread', 'random', 'aligned')
INSTRUCTION = 'pick up the red block'


@dataclass(frozen=True, slots=True)
class FleetTiming:
    """The robots' clock (seconds) and the judged window."""

    period_s: float = 0.1  # an image per robot per period
    budget_s: float = 0.5  # a step's deadline after its image's stamp
    warmup_s: float = 2.0  # images before this are served but not judged
    duration_s: float = 8.0  # the judged images' span
    phases: str = 'random'  # 'spread': i / N of the period; 'random': seeded; 'aligned': 0
    seed: int = 0  # the random phases

    def __post_init__(self) -> None:
        for name in ('period_s', 'budget_s', 'duration_s'):
            if not getattr(self, name) > 0:
                raise ValueError(f'{name} must be > 0, got {getattr(self, name)}')
        if self.warmup_s < 0:
            raise ValueError(f'warmup_s must be >= 0, got {self.warmup_s}')
        if self.phases not in PHASES:
            raise ValueError(f'phases must be one of {PHASES}, got {self.phases!r}')


@dataclass(frozen=True, slots=True)
class RobotStep:
    """A step a robot sends now: its image's stamp and the deadline after it."""

    robot: int
    seq: int  # 1, 2, ... per robot
    stamp_ns: int
    deadline_ns: int


class Fleet:
    """``num_robots`` robots under ``timing``, started at ``start_ns`` (see the module doc)."""

    def __init__(self, num_robots: int, timing: FleetTiming, *, start_ns: int = 0) -> None:
        if num_robots < 1:
            raise ValueError(f'num_robots must be >= 1, got {num_robots}')
        self.num_robots = num_robots
        self.timing = timing
        self.period_ns = round(timing.period_s * NS_PER_S)
        self.budget_ns = round(timing.budget_s * NS_PER_S)
        first = start_ns + round(timing.warmup_s * NS_PER_S)
        self.window = (first, first + round(timing.duration_s * NS_PER_S))
        rng = random.Random(timing.seed)
        phases = {
            'spread': lambda i: i * self.period_ns // num_robots,
            'random': lambda i: rng.randrange(self.period_ns),
            'aligned': lambda i: 0,
        }[timing.phases]
        self._next_image_ns = [start_ns + phases(i) for i in range(num_robots)]
        self._waiting: list[int | None] = [None] * num_robots  # the waiting image's stamp
        self._in_flight = [False] * num_robots
        self._sent: list[tuple[int, int]] = [(0, 0)] * num_robots  # stamp, deadline in flight
        self._seq = [0] * num_robots
        self.ends: list[StepEnd] = []
        self.num_images_judged = 0
        self.num_superseded = 0

    def next_image_ns(self) -> int | None:
        """When the next camera fires; None once every camera stopped."""
        due = min(self._next_image_ns)
        return due if due < self.window[1] else None

    def next_idle_image_ns(self) -> int | None:
        """When the next image of a robot with no step in flight and none waiting is due;
        None when every robot is busy or every camera stopped."""
        due = [
            self._next_image_ns[r]
            for r in range(self.num_robots)
            if not self._in_flight[r] and self._waiting[r] is None
        ]
        first = min(due, default=None)
        return first if first is not None and first < self.window[1] else None

    @property
    def num_sent(self) -> int:
        """Steps sent so far, every robot's."""
        return sum(self._seq)

    def in_flight(self) -> int:
        return sum(self._in_flight)

    def done(self) -> bool:
        """Every camera stopped and every step ended."""
        return self.next_image_ns() is None and not any(self._in_flight)

    def is_idle(self, robot: int) -> bool:
        return not self._in_flight[robot]

    def images_until(self, now_ns: int) -> list[RobotStep]:
        """Take the images due by ``now_ns``; the steps to send now, in stamp order."""
        sends = []
        for robot in range(self.num_robots):
            while now_ns >= self._next_image_ns[robot] < self.window[1]:
                stamp = self._next_image_ns[robot]
                self._next_image_ns[robot] += self.period_ns
                self.num_images_judged += int(self.window[0] <= stamp)
                self.num_superseded += int(self._waiting[robot] is not None)
                self._waiting[robot] = stamp
            step = self._send_waiting(robot, now_ns)
            if step is not None:
                sends.append(step)
        return sorted(sends, key=lambda s: s.stamp_ns)

    def ended(self, robot: int, end_ns: int, *, delivered: bool) -> RobotStep | None:
        """Robot ``robot``'s step ended at ``end_ns``; its waiting image's step, if any."""
        if not self._in_flight[robot]:
            raise ValueError(f'robot {robot} has no step in flight')
        stamp, deadline = self._sent[robot]
        self.ends.append(StepEnd(robot, stamp, end_ns, delivered, deadline))
        self._in_flight[robot] = False
        return self._send_waiting(robot, end_ns)

    def measure(self) -> CapacityMeasure:
        """The judged window's measure (``bench/lib/capacity.judge``)."""
        return judge(self.ends, self.num_robots, self.window, self.num_images_judged)

    def _send_waiting(self, robot: int, now_ns: int) -> RobotStep | None:
        stamp = self._waiting[robot]
        if stamp is None or self._in_flight[robot]:
            return None
        self._waiting[robot] = None
        deadline = stamp + self.budget_ns
        if now_ns > deadline:  # refused before it was sent
            self.ends.append(StepEnd(robot, stamp, now_ns, False, deadline))
            return None
        self._seq[robot] += 1
        self._in_flight[robot] = True
        self._sent[robot] = (stamp, deadline)
        return RobotStep(robot, self._seq[robot], stamp, deadline)


class FrameSource:
    """``synthetic_frame(index, width=width, height=height)`` for any index, from the
    gradient drawn once: each frame copies it and draws its blue level and square."""

    def __init__(self, *, width: int, height: int) -> None:
        self.width, self.height = width, height
        ys, xs = np.mgrid[0:height, 0:width]
        self._gradient = np.zeros((height, width, 3), dtype=np.uint8)
        self._gradient[..., 0] = (xs * 255 // max(1, width - 1)).astype(np.uint8)
        self._gradient[..., 1] = (ys * 255 // max(1, height - 1)).astype(np.uint8)
        self._side = max(2, min(width, height) // 4)

    def frame(self, index: int) -> np.ndarray:
        frame = self._gradient.copy()
        frame[..., 2] = (index * 7) % 256
        side = self._side
        x0 = (index * 3) % max(1, self.width - side)
        y0 = (index * 2) % max(1, self.height - side)
        frame[y0 : y0 + side, x0 : x0 + side] = (255, 255, 255)
        return frame


def step_request(
    robot: int,
    seq: int,
    *,
    stamp_ns: int,
    deadline_ns: int,
    received_ns: int,
    frame: np.ndarray,
    num_state: int = 0,
    instruction: str = INSTRUCTION,
    other_frames: tuple[np.ndarray, ...] = (),
) -> StepRequest:
    """Step ``seq`` of ``robot_<robot>`` with ``frame`` (the primary camera's) and
    ``other_frames`` (the further cameras', in order), a zero state of ``num_state``."""
    return StepRequest(
        robot_id=f'robot_{robot}',
        step_seq=seq,
        stamp_ns=stamp_ns,
        deadline_ns=deadline_ns,
        received_ns=received_ns,
        images=(frame, *other_frames),
        state=np.zeros(num_state, np.float32),
        instruction=instruction,
        instruction_version=1,
    )


def robot_index(robot_id: str) -> int:
    """``robot_<i>`` -> ``i``."""
    return int(robot_id.rsplit('_', 1)[1])
