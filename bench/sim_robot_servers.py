"""Robots served on a simulated clock: the engine's scheduler, or one request at a time.

``serve_robots`` drives N robots the way the node drives real ones (an image every period,
at most one step in flight per robot, the newest image waiting while one is, a step refused
once its deadline passed before it could be sent) against a ``SimServer`` and judges the
images of a window (``bench/capacity.py``'s ``CapacityMeasure``). Two servers:

- ``ScheduledServer``: the real ``Scheduler`` with the settings the engine derives from an
  ``EngineConfig`` on a GPU (overlap on), over the simulated runner whose passes take a
  ``HardwareCostModel``'s durations; OpenVLA's prompt (BOS, image, text: nothing shared but
  BOS), each robot's session holding BOS, as the scheduled core feeds it; each iteration
  also costs host time (hidden by the overlap loop while the device is busy).
- ``OneAtATimeServer``: the baseline's way under the same cost model: one step at a time in
  arrival order, its prefill and decode passes alone; no deadlines (late steps come late).

Latency is image stamp to the end of the step on the engine's clock: no ROS, no transport.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import random
from collections import deque
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from bench.capacity import CapacityMeasure
from bench.lib.cost_model import ModelShape, one_at_a_time_step_ns
from bench.sim_scheduler import build_sim_scheduler
from vla_sched.core.forward_batch import ImageInput, SamplingParams
from vla_sched.core.memory.kv_config import KVMemoryConfig
from vla_sched.core.memory.pages import round_up_to_page
from vla_sched.core.memory.radix_key import RadixKey
from vla_sched.core.scheduling.request import FinishKind, Req
from vla_sched.core.scheduling.scheduler import Scheduler
from vla_sched.core.scheduling.scheduler_config import SchedulerConfig
from vla_sched.engine.config import EngineConfig
from vla_sched.engine.scheduled_core import scheduler_config_for
from vla_sched.testing.sim_runner import HardwareCostModel, SimClock

NS_PER_S = 1_000_000_000
BOS_TOKEN_ID = 1
IMAGE_TOKEN_ID = 32000  # a placeholder; the image's positions are keyed by its content hash
ACTION_TOKENS = (31744, 32000)  # OpenVLA's 256 action bins
MODEL_KEY = 'openvla-7b'
PIXELS = np.zeros((1, 1, 3), dtype=np.uint8)  # the simulated runner never looks at pixels


@dataclass(frozen=True, slots=True)
class FleetTiming:
    """The robots' clock (simulated seconds) and what is judged."""

    period_s: float = 0.1  # an image per robot per period
    budget_s: float = 0.5  # a step's deadline after its image, as in the control loop
    warmup_s: float = 2.0  # images before this are served but not judged
    duration_s: float = 8.0  # the judged images' span
    seed: int = 0  # the robots' phases
    aligned: bool = False  # every robot's camera fires at the same time (phase 0)

    def __post_init__(self) -> None:
        for name in ('period_s', 'budget_s', 'duration_s'):
            if not getattr(self, name) > 0:
                raise ValueError(f'{name} must be > 0, got {getattr(self, name)}')
        if self.warmup_s < 0:
            raise ValueError(f'warmup_s must be >= 0, got {self.warmup_s}')


@dataclass(frozen=True, slots=True)
class StepEnd:
    """How one robot step ended (simulated nanoseconds)."""

    robot: int
    stamp_ns: int
    end_ns: int
    delivered: bool  # actions came back (late or not)
    deadline_ns: int

    @property
    def on_time(self) -> bool:
        return self.delivered and self.end_ns <= self.deadline_ns


class SimServer(Protocol):
    """A server on a ``SimClock``: steps go in, ``run_once`` runs one iteration."""

    clock: SimClock

    def submit(self, robot: int, seq: int, stamp_ns: int, deadline_ns: int) -> StepEnd | None:
        """Queue a step; a ``StepEnd`` if it was refused at once."""
        ...

    def has_work(self) -> bool: ...

    def run_once(self) -> list[StepEnd]: ...


def engine_scheduler_config(config: EngineConfig, device_type: str = 'cuda') -> SchedulerConfig:
    """The scheduler settings the engine's scheduled core derives from ``config``."""
    return scheduler_config_for(config, device_type)


class ScheduledServer:
    """The engine's scheduler over the simulated runner (see the module docstring)."""

    def __init__(
        self,
        engine: EngineConfig,
        cost: HardwareCostModel,
        shape: ModelShape,
        num_robots: int,
        *,
        host_overhead_us: float,
        mixed: bool = False,
    ) -> None:
        memory = KVMemoryConfig(
            num_pages=engine.kv_pool_tokens // engine.page_size,
            page_size=engine.page_size,
            num_req_slots=engine.max_running_requests,
            max_context_len=round_up_to_page(
                shape.prompt_len + shape.num_action_tokens + 64, engine.page_size
            ),
            session_step_kv='free',
            session_idle_timeout_s=0.0,
        )
        config = engine_scheduler_config(engine)
        if mixed:  # the engine mixes on the CPU only; the projection tries it on the GPU
            config = dataclasses.replace(config, enable_mixed_chunk=True)
        self.sched: Scheduler = build_sim_scheduler(config, memory, cost)
        self.clock: SimClock = self.sched.clock
        self.shape = shape
        self.host_overhead_ns = round(host_overhead_us * 1000)
        self.prompt = (
            BOS_TOKEN_ID,
            *[IMAGE_TOKEN_ID] * shape.num_image_tokens,
            *range(400, 400 + shape.num_text_tokens),
        )
        bos = RadixKey(torch.tensor([BOS_TOKEN_ID], dtype=torch.int64), extra_key=MODEL_KEY)
        for robot in range(num_robots):
            self.sched.memory.sessions.open(f'r{robot}', bos, now_ns=0)

    def submit(self, robot: int, seq: int, stamp_ns: int, deadline_ns: int) -> StepEnd | None:
        image = ImageInput(
            content_hash=hash((robot, seq)) & ((1 << 62) - 1),
            token_offset=1,
            num_tokens=self.shape.num_image_tokens,
            pixels=PIXELS,
        )
        req = Req(
            rid=f'r{robot}/{seq}',
            origin_input_ids=self.prompt,
            sampling=SamplingParams(
                allowed_token_start=ACTION_TOKENS[0], allowed_token_end=ACTION_TOKENS[1]
            ),
            max_new_tokens=self.shape.num_action_tokens,
            images=(image,),
            robot_id=f'r{robot}',
            step_seq=seq,
            session_id=f'r{robot}',
            deadline_ns=deadline_ns,
            stamp_ns=stamp_ns,
            extra_key=MODEL_KEY,
        )
        if self.sched.add_request(req) is None:
            return None
        return self._end(req)

    def has_work(self) -> bool:
        return self.sched.has_work()

    def run_once(self) -> list[StepEnd]:
        self.clock.advance(self.host_overhead_ns)
        return [self._end(req) for req in self.sched.run_once()]

    def _end(self, req: Req) -> StepEnd:
        assert req.robot_id is not None
        assert req.stamp_ns is not None and req.deadline_ns is not None
        reason = req.finished_reason
        return StepEnd(
            robot=int(req.robot_id[1:]),
            stamp_ns=req.stamp_ns,
            end_ns=self.clock(),
            delivered=reason is not None and reason.kind is FinishKind.LENGTH,
            deadline_ns=req.deadline_ns,
        )


class OneAtATimeServer:
    """One step at a time in arrival order under ``cost`` (see the module docstring)."""

    def __init__(self, cost: HardwareCostModel, shape: ModelShape) -> None:
        self.clock = SimClock()
        self.step_ns = round(one_at_a_time_step_ns(cost, shape))
        self.queue: deque[tuple[int, int, int]] = deque()

    def submit(self, robot: int, seq: int, stamp_ns: int, deadline_ns: int) -> StepEnd | None:
        self.queue.append((robot, stamp_ns, deadline_ns))
        return None

    def has_work(self) -> bool:
        return bool(self.queue)

    def run_once(self) -> list[StepEnd]:
        robot, stamp_ns, deadline_ns = self.queue.popleft()
        self.clock.advance(self.step_ns)
        return [StepEnd(robot, stamp_ns, self.clock(), True, deadline_ns)]


@dataclass
class _Robot:
    pending_ns: int | None = None  # stamp of the newest image not sent yet
    in_flight: bool = False
    seq: int = 0


def serve_robots(server: SimServer, num_robots: int, timing: FleetTiming) -> CapacityMeasure:
    """Robots send steps to ``server`` as the node's robots do; judged over the images
    stamped in ``[warmup, warmup + duration)``, each followed until its step ends."""
    period = round(timing.period_s * NS_PER_S)
    budget = round(timing.budget_s * NS_PER_S)
    start = round(timing.warmup_s * NS_PER_S)
    window = (start, start + round(timing.duration_s * NS_PER_S))
    rng = random.Random(timing.seed)
    images = []
    for robot in range(num_robots):
        t = 0 if timing.aligned else rng.randrange(period)
        images += [(t + k * period, robot) for k in range((window[1] - t + period - 1) // period)]
    num_judged = sum(1 for t, _ in images if window[0] <= t < window[1])
    heapq.heapify(images)
    robots = [_Robot() for _ in range(num_robots)]
    ends: list[StepEnd] = []
    clock = server.clock

    def send(robot: int) -> None:
        state = robots[robot]
        if state.pending_ns is None or state.in_flight:
            return
        stamp, state.pending_ns = state.pending_ns, None
        if clock() > stamp + budget:  # refused before it was sent
            ends.append(StepEnd(robot, stamp, clock(), False, stamp + budget))
            return
        state.seq += 1
        state.in_flight = True
        refused = server.submit(robot, state.seq, stamp, stamp + budget)
        if refused is not None:
            finish(refused)

    def finish(end: StepEnd) -> None:
        ends.append(end)
        robots[end.robot].in_flight = False
        send(end.robot)

    while images or server.has_work():
        while images and images[0][0] <= clock():
            stamp, robot = heapq.heappop(images)
            robots[robot].pending_ns = stamp  # an unsent older image is superseded
            send(robot)
        if server.has_work():
            for end in server.run_once():
                finish(end)
        elif images:
            clock.advance_to(images[0][0])
    return judge(ends, num_robots, window, num_judged)


def judge(
    ends: list[StepEnd], num_robots: int, window: tuple[int, int], num_images: int
) -> CapacityMeasure:
    """Delivered steps over the ``num_images`` images stamped in ``window``, on-time steps
    over the steps that ended, latency percentiles of the delivered ones (image stamp to the
    step's end)."""
    in_window = [e for e in ends if window[0] <= e.stamp_ns < window[1]]
    delivered = [e for e in in_window if e.delivered]
    latencies = np.array([(e.end_ns - e.stamp_ns) / 1e6 for e in delivered])
    return CapacityMeasure(
        num_robots=num_robots,
        rate_share=len(delivered) / num_images if num_images else math.nan,
        on_time_share=sum(e.on_time for e in in_window) / len(in_window)
        if in_window
        else math.nan,
        latency_ms_p50=float(np.percentile(latencies, 50)) if latencies.size else math.nan,
        latency_ms_p99=float(np.percentile(latencies, 99)) if latencies.size else math.nan,
    )
