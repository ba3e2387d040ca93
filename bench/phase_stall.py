"""Latency of periodic robots before and after an injected stall, with and without phases.

N ``periodic`` robots (the node's ``RobotSlot`` rules, a new camera image every millisecond,
robot ``i`` starting at ``i / n`` of the period, as robots started one after another) step
against a simulated batching engine on a simulated clock: when idle, the engine takes
every waiting step into one pass of ``--pass-base-ms`` plus ``--pass-ms-per-step`` per step,
and answers them at its end. At ``--stall-at`` seconds the node stops for ``--stall-s``
seconds (as after a CPU stall): nothing is sent or published meanwhile, and every answer that
came due is handled at its end. Latency is a chunk's publication minus its image stamp.

Two schedules: ``phase`` (the node's: robot ``i`` of ``n`` fires at ``i / n`` of its period
and returns to that phase after a stall, ``ros/period_phase.py``) and ``immediate`` (the
rule before it: the next step a period after the last one, or at once when behind, so every
robot that stalled fires at the same moment and they stay in step from then on).

    python -m bench.phase_stall                                   # 8 robots at 4 Hz
    python -m bench.phase_stall --robots 16 --period 0.1 --stall-at 3 --stall-s 2
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import numpy as np

from vla_sched.ipc.messages import StepRequest, StepResult
from vla_sched.ros.camera_sync import CameraFrame
from vla_sched.ros.node_config import RobotConfig
from vla_sched.ros.period_phase import PeriodSchedule
from vla_sched.ros.robot_slot import RobotSlot

MS = 1_000_000
SCHEDULES = ('phase', 'immediate')


class ImmediateSchedule(PeriodSchedule):
    """The rule before phases: a period after the last step, at once when behind."""

    def is_due(self, now_ns: int) -> bool:
        return self.next_due_ns is None or now_ns >= self.next_due_ns

    def advance(self, now_ns: int) -> None:
        due = (now_ns if self.next_due_ns is None else self.next_due_ns) + self.period_ns
        self.next_due_ns = due if due > now_ns else now_ns + self.period_ns


@dataclass(frozen=True)
class StallPlan:
    num_robots: int = 8
    period_s: float = 0.25
    duration_s: float = 12.0
    stall_at_s: float = 4.0
    stall_s: float = 2.0
    pass_base_ms: float = 10.0
    pass_ms_per_step: float = 25.0


def _result(step: StepRequest) -> StepResult:
    return StepResult(
        robot_id=step.robot_id, step_seq=step.step_seq, stamp_ns=step.stamp_ns,
        actions=np.zeros((1, 7), np.float32), queue_ms=0.0, prefill_ms=0.0, decode_ms=0.0,
        late=False, num_cached_prefix_tokens=0,
    )  # fmt: skip


def _slots(plan: StallPlan, schedule: str) -> list[RobotSlot]:
    slots = []
    for i in range(plan.num_robots):
        config = RobotConfig(robot_id=f'r{i}', period_s=plan.period_s, instruction='pick it up')
        slot = RobotSlot(config, window_s=1.0, created_ns=0, phase=i / plan.num_robots)
        if schedule == 'immediate':
            slot.schedule = ImmediateSchedule(slot.period_ns)
        slots.append(slot)
    return slots


def simulate(plan: StallPlan, schedule: str) -> list[tuple[int, float]]:
    """``(publish time ns, latency ms)`` of every chunk."""
    slots = {s.robot_id: s for s in _slots(plan, schedule)}
    stall = (round(plan.stall_at_s * 1e9), round((plan.stall_at_s + plan.stall_s) * 1e9))
    waiting: list[StepRequest] = []
    running: list[StepRequest] = []
    pass_end = 0
    chunks: list[tuple[int, float]] = []
    for now in range(0, round(plan.duration_s * 1e9), MS):
        if running and now >= pass_end and not stall[0] <= now < stall[1]:
            for step in running:  # the node publishes what the engine answered
                slots[step.robot_id].finish(_result(step), now)
                chunks.append((now, (now - step.stamp_ns) / 1e6))
            running = []
        if not running and waiting:  # the engine, which does not stall, starts a pass
            running, waiting = waiting, []
            cost_ms = plan.pass_base_ms + plan.pass_ms_per_step * len(running)
            pass_end = now + round(cost_ms * MS)
        if stall[0] <= now < stall[1]:
            continue
        for i, slot in enumerate(slots.values()):
            if now < i * slot.period_ns // plan.num_robots:  # robots start one after another
                continue
            image = np.zeros((2, 2, 3), np.uint8)
            slot.offer_image(CameraFrame(image=image, stamp_ns=now, received_ns=now))
            if slot.is_due(now):
                step = slot.take_step(now, budget_ns=10**12, num_state=0, num_images=1,
                                      priority=0)  # fmt: skip
                slot.mark_sent(step)
                waiting.append(step)
    return chunks


def _window(chunks, start_ns: int, end_ns: int) -> str:
    ms = np.array([lat for t, lat in chunks if start_ns <= t < end_ns])
    if not ms.size:
        return 'n/a'
    return f'p50 {np.percentile(ms, 50):6.1f} p99 {np.percentile(ms, 99):6.1f} ms ({ms.size})'


def main(argv: list[str] | None = None) -> int:
    base = StallPlan()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--robots', type=int, default=base.num_robots)
    parser.add_argument('--period', type=float, default=base.period_s, help='s')
    parser.add_argument('--duration', type=float, default=base.duration_s, help='s')
    parser.add_argument('--stall-at', type=float, default=base.stall_at_s, help='s')
    parser.add_argument('--stall-s', type=float, default=base.stall_s, help='s')
    parser.add_argument('--pass-base-ms', type=float, default=base.pass_base_ms)
    parser.add_argument('--pass-ms-per-step', type=float, default=base.pass_ms_per_step)
    args = parser.parse_args(argv)
    plan = StallPlan(args.robots, args.period, args.duration, args.stall_at, args.stall_s,
                     args.pass_base_ms, args.pass_ms_per_step)  # fmt: skip
    stall_end_ns = round((plan.stall_at_s + plan.stall_s) * 1e9)
    print(f'{plan.num_robots} robots, period {plan.period_s} s, stall of {plan.stall_s} s at '
          f'{plan.stall_at_s} s; a pass takes {plan.pass_base_ms} ms + '
          f'{plan.pass_ms_per_step} ms per step')  # fmt: skip
    for schedule in SCHEDULES:
        chunks = simulate(plan, schedule)
        before = _window(chunks, 1 * 10**9, round(plan.stall_at_s * 1e9))
        after = _window(chunks, stall_end_ns + 10**9, round(plan.duration_s * 1e9))
        print(f'{schedule:>9}: before the stall {before}; after it {after}')
    return 0


if __name__ == '__main__':
    raise SystemExit(main())
