"""One simulator: robots served on a simulated clock, by the engine's scheduler or one at a time.

``SimulatedEngine`` is the real ``Scheduler`` over its KV memory driving the simulated runner
(``vla_sched/testing/sim_runner.py``), whose passes take a cost model's durations
(``CostModel``, ``HardwareCostModel``) on a ``SimClock`` as on a GPU stream; every scheduler
iteration also costs ``host_overhead_us`` of host time (which the overlap loop hides while
the device is busy). Each step becomes a request as in the engine: the checkpoint's
``StepTranslator`` builds the ``Req`` and the robot's session prefix from a ``StepRequest``
(the prompt of the checkpoint's template, the image span keyed by the frame's content hash).
``SimulatedEngine.for_engine`` takes the settings the engine derives from an
``EngineConfig`` (``scheduler_config_for``) and sizes the KV memory as the engine does.

``OneAtATimeServer`` is what single-robot servers do, under a cost model: one step at a
time in arrival order, each ``step_ns`` long, no deadlines (late steps come late).

``run_fleet`` drives a ``bench/lib/fleets.Fleet`` (the node's rules for robots) against
either server on the server's clock; ``serve_robots`` returns the judged window's
``CapacityMeasure``. Latency is image stamp to the step's end on the engine's clock: no ROS,
no transport. Numbers come from the cost model, not a device.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from bench.lib.capacity import CapacityMeasure
from bench.lib.fleets import Fleet, FleetTiming, RobotStep, robot_index, step_request
from vla_sched.core.memory.kv_config import KVMemoryConfig
from vla_sched.core.memory.kv_memory import KVMemory
from vla_sched.core.memory.pages import round_up_to_page
from vla_sched.core.scheduling.request import FinishKind, Req
from vla_sched.core.scheduling.scheduler import Scheduler
from vla_sched.core.scheduling.scheduler_config import SchedulerConfig
from vla_sched.engine.assembly import scheduler_config_for
from vla_sched.engine.config import EngineConfig
from vla_sched.model.families.openvla.family import num_state_values
from vla_sched.model.families.openvla.steps import StepTranslator
from vla_sched.testing.sim_runner import SimClock, SimRunner, StepCost


@dataclass(frozen=True, slots=True)
class Ended:
    """A step that ended on a server: its robot and whether its actions came back."""

    robot: int
    delivered: bool


class SimServer(Protocol):
    """A server on a ``SimClock``: steps go in, ``run_once`` runs one iteration."""

    clock: SimClock

    def submit(self, step: RobotStep) -> list[Ended]:
        """Queue a step; what ended at once (a refusal)."""
        ...

    def has_work(self) -> bool: ...

    def run_once(self) -> list[Ended]: ...


def sim_frame(robot: int, seq: int) -> np.ndarray:
    """A 2 x 4 frame unique to ``(robot, seq)``: the simulated runner never reads pixels,
    only the content hash the translator keys the image span by."""
    return np.frombuffer(struct.pack('<qq8x', robot, seq), np.uint8).reshape(2, 4, 3)


class SimulatedEngine:
    """The engine's scheduler over the simulated runner (see the module docstring)."""

    def __init__(
        self,
        config: SchedulerConfig,
        memory: KVMemoryConfig,
        cost: StepCost,
        translator: StepTranslator,
        *,
        host_overhead_us: float = 0.0,
    ) -> None:
        kv = KVMemory(memory)
        self.clock = SimClock()
        runner = SimRunner(
            req_to_token=kv.req_to_token_pool.req_to_token,
            num_kv_slots=kv.allocator.num_slots,
            cost_model=cost,
            clock=self.clock,
        )
        self.scheduler = Scheduler(config, kv, runner, clock=self.clock)
        self.runner = runner
        self.translator = translator
        self.host_overhead_ns = round(host_overhead_us * 1000)
        self.num_state = num_state_values(translator.spec)
        self.delivered: list[Req] = []  # every request that ended with its actions

    @classmethod
    def for_engine(
        cls,
        engine: EngineConfig,
        cost: StepCost,
        translator: StepTranslator,
        *,
        device_type: str = 'cuda',
        host_overhead_us: float = 0.0,
        config: SchedulerConfig | None = None,
    ) -> SimulatedEngine:
        """The scheduler settings the engine derives from ``engine`` on ``device_type``
        (``config`` instead, when given) and the engine's KV memory sizing."""
        spec = translator.spec
        longest = engine.max_instruction_bytes + 64 + spec.num_image_tokens
        memory = KVMemoryConfig(
            num_pages=engine.kv_pool_tokens // engine.page_size,
            page_size=engine.page_size,
            num_req_slots=engine.max_running_requests,
            max_context_len=round_up_to_page(
                longest + spec.num_action_tokens + 64, engine.page_size
            ),
            session_step_kv='free',
            session_idle_timeout_s=0.0,
        )
        if config is None:
            config = scheduler_config_for(engine, device_type)
        return cls(config, memory, cost, translator, host_overhead_us=host_overhead_us)

    def submit(self, step: RobotStep) -> list[Ended]:
        now = self.clock()
        request = step_request(
            step.robot,
            step.seq,
            stamp_ns=step.stamp_ns,
            deadline_ns=step.deadline_ns,
            received_ns=now,
            frame=sim_frame(step.robot, step.seq),
            num_state=self.num_state,
        )
        translated = self.translator.translate(request)
        self.scheduler.open_or_update_session(
            request.robot_id,
            translated.session_prefix,
            instruction_version=translated.instruction_version,
        )
        if self.scheduler.add_request(translated.req) is None:
            return []
        return [self._ended(translated.req)]

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    def run_once(self) -> list[Ended]:
        self.clock.advance(self.host_overhead_ns)
        return [self._ended(req) for req in self.scheduler.run_once()]

    def _ended(self, req: Req) -> Ended:
        assert req.robot_id is not None
        reason = req.finished_reason
        delivered = reason is not None and reason.kind is FinishKind.LENGTH
        if delivered:
            self.delivered.append(req)
        return Ended(robot_index(req.robot_id), delivered)


class OneAtATimeServer:
    """One step at a time in arrival order, each ``step_ns`` long (see the module doc)."""

    def __init__(self, step_ns: int) -> None:
        if step_ns < 1:
            raise ValueError(f'step_ns must be >= 1, got {step_ns}')
        self.clock = SimClock()
        self.step_ns = step_ns
        self.queue: list[int] = []

    def submit(self, step: RobotStep) -> list[Ended]:
        self.queue.append(step.robot)
        return []

    def has_work(self) -> bool:
        return bool(self.queue)

    def run_once(self) -> list[Ended]:
        robot = self.queue.pop(0)
        self.clock.advance(self.step_ns)
        return [Ended(robot, delivered=True)]


def run_fleet(server: SimServer, fleet: Fleet) -> Fleet:
    """Drive ``fleet`` against ``server`` on the server's clock until every camera stopped
    and every step ended; returns the fleet (its ``ends`` and ``measure()``)."""
    clock = server.clock

    def send(step: RobotStep | None) -> None:
        while step is not None:
            refused = server.submit(step)
            step = None
            for end in refused:
                step = fleet.ended(end.robot, clock(), delivered=end.delivered)

    while not fleet.done():
        for step in fleet.images_until(clock()):
            send(step)
        if server.has_work():
            for end in server.run_once():
                send(fleet.ended(end.robot, clock(), delivered=end.delivered))
        else:
            due = fleet.next_image_ns()
            if due is None:
                raise RuntimeError(f'{fleet.in_flight()} steps in flight on an idle server')
            clock.advance_to(due)
    return fleet


def serve_robots(server: SimServer, num_robots: int, timing: FleetTiming) -> CapacityMeasure:
    """``num_robots`` robots under ``timing`` served by ``server``: the judged measure."""
    return run_fleet(server, Fleet(num_robots, timing, start_ns=server.clock())).measure()
