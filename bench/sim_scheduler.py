"""Discrete-event simulation of the scheduler serving N robots from one simulated GPU.

Each robot sends a control step at its rate (every observation goes to the engine; a
newer one supersedes the robot's waiting step). A step's prompt is the robot's session
prefix (system prompt + instruction, shared by robots with the same instruction), an
image span keyed by the frame's content hash, state tokens and a suffix; it asks for
``action_tokens`` outputs. The model is the deterministic simulated runner with a cost
model (prefill cost per token, decode cost per batch size and KV read), queued on a
simulated clock like a GPU stream; each scheduler iteration also costs
``sched_overhead_us`` of host time, which the overlap loop hides.

For each policy, with the prefill delayer off and on, it prints p50/p99 step latency,
inter-token latency (ITL) of decoding robots with and without a prefill in the interval
(the jump a new image causes), deadline misses, retracts and superseded steps.

    python bench/sim_scheduler.py                    # the default scenario
    python bench/sim_scheduler.py --robots 16 --pool-tokens 4096 --duration-s 20

Numbers come from the cost model, not a GPU: they compare scheduling choices, they do
not predict a real deployment's latency.
"""

from __future__ import annotations

import argparse
import dataclasses
import heapq
import itertools
import random
from dataclasses import dataclass

import numpy as np
import torch

from vla_sched.core.forward_batch import ForwardMode, ImageInput, SamplingParams
from vla_sched.core.memory.kv_config import KVMemoryConfig
from vla_sched.core.memory.kv_memory import KVMemory
from vla_sched.core.memory.radix_key import RadixKey
from vla_sched.core.scheduling.request import FinishKind, Req
from vla_sched.core.scheduling.scheduler import Scheduler
from vla_sched.core.scheduling.scheduler_config import (
    SCHEDULE_POLICIES,
    PrefillDelayerConfig,
    SchedulerConfig,
)
from vla_sched.testing.sim_runner import CostModel, SimClock, SimRunner, StepCost, StepRecord

MS = 1_000_000
IMAGE_TOKEN_ID = 32000
PIXELS = np.zeros((1, 1, 3), dtype=np.uint8)  # the simulated runner never looks at pixels


@dataclass(frozen=True, slots=True)
class Scenario:
    """The simulated deployment."""

    num_robots: int = 8
    rate_hz: float = 2.0
    duration_s: float = 20.0
    deadline_ms: float = 400.0
    pool_tokens: int = 4096
    page_size: int = 16
    max_running: int = 16
    chunked_prefill_size: int = 256
    prefix_tokens: int = 48
    image_tokens: int = 256
    state_tokens: int = 8
    action_tokens: int = 28  # horizon 4 x 7 DoF
    num_instructions: int = 2
    sched_overhead_us: float = 300.0
    late_policy: str = 'drop'
    seed: int = 0
    delayer: PrefillDelayerConfig = dataclasses.field(
        default_factory=lambda: PrefillDelayerConfig(enabled=True)
    )
    cost: CostModel = dataclasses.field(
        default_factory=lambda: CostModel(
            prefill_base_ns=3 * MS,
            prefill_ns_per_token=40_000,
            decode_base_ns=8 * MS,
            decode_ns_per_req=150_000,
            decode_ns_per_kv_token=100,
        )
    )


@dataclass(frozen=True, slots=True)
class Variant:
    policy: str
    delayer: bool
    overlap: bool = True
    prefill_decode_interval: int = 0


@dataclass
class Summary:
    """What one run measured (latencies in milliseconds)."""

    variant: Variant
    num_arrivals: int
    num_done: int
    step_p50: float
    step_p99: float
    itl_clean_p50: float
    itl_clean_p99: float
    itl_prefill_p50: float
    itl_prefill_p99: float
    itl_max: float
    num_deadline_misses: int
    num_retracts: int
    num_superseded: int
    num_delayed_prefills: int
    cache_hit_rate: float


def _prefix(scenario: Scenario, robot: int) -> list[int]:
    instruction = robot % scenario.num_instructions
    system = list(range(1, scenario.prefix_tokens // 2 + 1))
    tail = scenario.prefix_tokens - len(system)
    return system + [1000 + 100 * instruction + i for i in range(tail)]


def _step(scenario: Scenario, robot: int, seq: int, now: int, rng: random.Random) -> Req:
    prefix = _prefix(scenario, robot)
    state = [rng.randrange(2000, 2256) for _ in range(scenario.state_tokens)]
    prompt = [*prefix, *[IMAGE_TOKEN_ID] * scenario.image_tokens, *state, 3, 4]
    image = ImageInput(
        content_hash=hash((robot, seq)) & ((1 << 62) - 1),
        token_offset=len(prefix),
        num_tokens=scenario.image_tokens,
        pixels=PIXELS,
    )
    return Req(
        rid=f'r{robot}/{seq}',
        origin_input_ids=tuple(prompt),
        sampling=SamplingParams(allowed_token_start=31744, allowed_token_end=32000),
        max_new_tokens=scenario.action_tokens,
        images=(image,),
        robot_id=f'r{robot}',
        step_seq=seq,
        session_id=f'r{robot}',
        deadline_ns=now + int(scenario.deadline_ms * MS),
        stamp_ns=now,
    )


def build_sim_scheduler(
    config: SchedulerConfig, memory_config: KVMemoryConfig, cost: StepCost
) -> Scheduler:
    """The real scheduler over its KV memory, driving the simulated runner whose steps take
    ``cost``'s durations on a fresh ``SimClock`` (the scheduler's ``clock``)."""
    memory = KVMemory(memory_config)
    clock = SimClock()
    runner = SimRunner(
        req_to_token=memory.req_to_token_pool.req_to_token,
        num_kv_slots=memory.allocator.num_slots,
        cost_model=cost,
        clock=clock,
    )
    return Scheduler(config, memory, runner, clock=clock)


def _build(scenario: Scenario, variant: Variant) -> Scheduler:
    memory = KVMemoryConfig(
        num_pages=scenario.pool_tokens // scenario.page_size,
        page_size=scenario.page_size,
        num_req_slots=scenario.max_running,
        max_context_len=1024,
        session_idle_timeout_s=0.0,
    )
    config = SchedulerConfig(
        schedule_policy=variant.policy,
        chunked_prefill_size=scenario.chunked_prefill_size,
        enable_overlap=variant.overlap,
        prefill_decode_interval=variant.prefill_decode_interval,
        late_policy=scenario.late_policy,
        prefill_delayer=dataclasses.replace(scenario.delayer, enabled=variant.delayer),
    )
    return build_sim_scheduler(config, memory, scenario.cost)


def _arrivals(scenario: Scenario, rng: random.Random) -> list[tuple[int, int]]:
    period = int(1e9 / scenario.rate_hz)
    end = int(scenario.duration_s * 1e9)
    events = []
    for robot in range(scenario.num_robots):
        t = rng.randrange(period)
        while t < end:
            events.append((t, robot))
            t += period
    heapq.heapify(events)
    return events


def simulate(scenario: Scenario, variant: Variant) -> Summary:
    """Run one scenario under one scheduler variant."""
    rng = random.Random(scenario.seed)
    sched = _build(scenario, variant)
    clock: SimClock = sched.clock
    for robot in range(scenario.num_robots):
        key = RadixKey(torch.tensor(_prefix(scenario, robot), dtype=torch.int64))
        sched.memory.sessions.open(f'r{robot}', key, now_ns=0)
    arrivals = _arrivals(scenario, rng)
    seqs = [0] * scenario.num_robots
    ended: list[Req] = []
    overhead = int(scenario.sched_overhead_us * 1000)
    while arrivals or sched.has_work():
        while arrivals and arrivals[0][0] <= clock():
            _, robot = heapq.heappop(arrivals)
            seqs[robot] += 1
            req = _step(scenario, robot, seqs[robot], clock(), rng)
            if sched.add_request(req) is not None:
                ended.append(req)
        if sched.has_work():
            clock.advance(overhead)
            ended.extend(sched.run_once())
        elif arrivals:
            clock.advance_to(arrivals[0][0])
    return _summarize(variant, sched, ended, sum(seqs))


def itl_samples(done: list[Req], steps: list[StepRecord]) -> tuple[list[float], list[float]]:
    """Inter-token gaps (ms) of completed steps, split by whether a prefill ran inside."""
    prefills = sorted(
        (s.start_ns, s.end_ns) for s in steps if s.forward_mode is ForwardMode.EXTEND
    )
    starts = np.array([s for s, _ in prefills], dtype=np.int64)
    ends = np.array([e for _, e in prefills], dtype=np.int64)
    clean, hit = [], []
    for req in done:
        times = req.times.token_ns
        for prev, cur in itertools.pairwise(times):
            # a prefill overlaps (prev, cur) if it starts before cur and ends after prev
            i = int(np.searchsorted(starts, cur, side='left'))
            overlapped = i > 0 and bool((ends[:i] > prev).any())
            (hit if overlapped else clean).append((cur - prev) / MS)
    return clean, hit


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else 0.0


def _summarize(variant: Variant, sched: Scheduler, ended: list[Req], arrivals: int) -> Summary:
    done = [r for r in ended if r.finished_reason.kind is FinishKind.LENGTH]
    latency = [(r.times.finished_ns - r.times.arrival_ns) / MS for r in done]
    clean, hit = itl_samples(done, sched.runner.steps)
    m = sched.metrics
    return Summary(
        variant=variant,
        num_arrivals=arrivals,
        num_done=len(done),
        step_p50=_pct(latency, 50),
        step_p99=_pct(latency, 99),
        itl_clean_p50=_pct(clean, 50),
        itl_clean_p99=_pct(clean, 99),
        itl_prefill_p50=_pct(hit, 50),
        itl_prefill_p99=_pct(hit, 99),
        itl_max=max(clean + hit, default=0.0),
        num_deadline_misses=sum(c.num_deadline_misses for c in m.robots.values()),
        num_retracts=m.num_retracts_total,
        num_superseded=sum(c.num_superseded for c in m.robots.values()),
        num_delayed_prefills=m.num_delayed_prefills,
        cache_hit_rate=m.cache_hit_rate,
    )


HEADER = (
    '| policy | delayer | interval | overlap | done/sent | step p50 | step p99 | ITL p50 '
    '| ITL p99 '
    '| ITL w/ prefill p50 | ITL w/ prefill p99 | ITL max | deadline misses | retracts '
    '| superseded | delayed passes | cache hit |'
)


def format_row(s: Summary) -> str:
    v = s.variant
    cells = [
        v.policy,
        'on' if v.delayer else 'off',
        str(v.prefill_decode_interval),
        'on' if v.overlap else 'off',
        f'{s.num_done}/{s.num_arrivals}',
        f'{s.step_p50:.1f}',
        f'{s.step_p99:.1f}',
        f'{s.itl_clean_p50:.1f}',
        f'{s.itl_clean_p99:.1f}',
        f'{s.itl_prefill_p50:.1f}',
        f'{s.itl_prefill_p99:.1f}',
        f'{s.itl_max:.1f}',
        str(s.num_deadline_misses),
        str(s.num_retracts),
        str(s.num_superseded),
        str(s.num_delayed_prefills),
        f'{100 * s.cache_hit_rate:.0f}%',
    ]
    return '| ' + ' | '.join(cells) + ' |'


def _or_off(value: float | None) -> float:
    return -1 if value is None else value


def _parse(argv: list[str] | None) -> tuple[Scenario, list[Variant]]:
    base = Scenario()
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--robots', type=int, default=base.num_robots)
    parser.add_argument('--rate-hz', type=float, default=base.rate_hz)
    parser.add_argument('--duration-s', type=float, default=base.duration_s)
    parser.add_argument('--deadline-ms', type=float, default=base.deadline_ms)
    parser.add_argument('--pool-tokens', type=int, default=base.pool_tokens)
    parser.add_argument('--page-size', type=int, default=base.page_size)
    parser.add_argument('--chunk', type=int, default=base.chunked_prefill_size)
    parser.add_argument('--action-tokens', type=int, default=base.action_tokens)
    parser.add_argument('--image-tokens', type=int, default=base.image_tokens)
    parser.add_argument('--policies', nargs='+', default=list(SCHEDULE_POLICIES))
    parser.add_argument(
        '--delayer-near-done',
        type=int,
        default=_or_off(base.delayer.near_done_decode_tokens),
        help='near_done_decode_tokens of the prefill delayer (-1: off)',
    )
    parser.add_argument('--delayer-max-passes', type=int, default=base.delayer.max_delay_passes)
    parser.add_argument(
        '--delayer-high-watermark',
        type=float,
        default=_or_off(base.delayer.token_usage_high_watermark),
        help='token_usage_high_watermark of the prefill delayer (-1: off)',
    )
    parser.add_argument('--no-overlap-row', action='store_true', help='skip the overlap-off row')
    parser.add_argument(
        '--interval-row',
        type=int,
        default=1,
        help='add a row with this prefill_decode_interval (0: none)',
    )
    parser.add_argument('--late-policy', default=base.late_policy)
    parser.add_argument('--seed', type=int, default=base.seed)
    args = parser.parse_args(argv)
    scenario = dataclasses.replace(
        base,
        num_robots=args.robots,
        rate_hz=args.rate_hz,
        duration_s=args.duration_s,
        deadline_ms=args.deadline_ms,
        pool_tokens=args.pool_tokens,
        page_size=args.page_size,
        chunked_prefill_size=args.chunk,
        action_tokens=args.action_tokens,
        image_tokens=args.image_tokens,
        seed=args.seed,
        late_policy=args.late_policy,
        delayer=PrefillDelayerConfig(
            enabled=True,
            near_done_decode_tokens=None if args.delayer_near_done < 0 else args.delayer_near_done,
            max_delay_passes=args.delayer_max_passes,
            token_usage_high_watermark=(
                None if args.delayer_high_watermark < 0 else args.delayer_high_watermark
            ),
        ),
    )
    variants = [Variant(p, d) for p in args.policies for d in (False, True)]
    if args.interval_row:
        first = args.policies[0]
        variants += [
            Variant(first, delayer, prefill_decode_interval=args.interval_row)
            for delayer in (False, True)
        ]
    if not args.no_overlap_row:
        variants.append(Variant(args.policies[0], False, overlap=False))
    return scenario, variants


def main(argv: list[str] | None = None) -> None:
    torch.set_num_threads(1)  # tiny index tensors: a thread pool only adds overhead
    scenario, variants = _parse(argv)
    print(
        f'{scenario.num_robots} robots at {scenario.rate_hz} Hz for {scenario.duration_s} s, '
        f'deadline {scenario.deadline_ms} ms, KV pool {scenario.pool_tokens} tokens '
        f'(page {scenario.page_size}), chunk {scenario.chunked_prefill_size}, prompt '
        f'{scenario.prefix_tokens}+{scenario.image_tokens}+{scenario.state_tokens}+2 tokens, '
        f'{scenario.action_tokens} action tokens, late policy {scenario.late_policy}; '
        f'{scenario.cost}; {scenario.delayer}'
    )
    print()
    print(HEADER)
    print('|' + '---|' * (HEADER.count('|') - 1))
    for variant in variants:
        print(format_row(simulate(scenario, variant)), flush=True)


if __name__ == '__main__':
    main()
