"""Which scheduler settings serve robots best? The real scheduler on the simulated GPU.

Robots (``bench/lib/fleets.py``: a camera every period, random phases, at most one step in
flight, the newest image waiting) are served by ``bench/lib/simulation.SimulatedEngine``:
the real ``Scheduler`` and KV memory over the simulated runner, whose passes take a
``CostModel``'s durations (prefill cost per new token, decode cost per batch size and KV
read) on a simulated clock, each iteration costing ``--host-overhead-us`` of host time that
the overlap loop hides. Steps are the checkpoint's (the built-in tiny one unless
``--model-path``), made by its ``StepTranslator``.

For each schedule policy, with the prefill delayer off and on (plus a row with
``prefill_decode_interval`` and one without the overlap loop), it prints the step latency
(image stamp to actions), inter-token latency of running steps without and with a prefill
inside the gap (``bench/lib/itl.py``), the capacity measure of the judged window, deadline
misses, retracts, superseded steps and delayed passes. Everything is simulated time: the
numbers are the same on any machine, and compare scheduling choices; they do not predict a
deployment's latency.

    python -m bench.sim_policies                         # the default scenario, ~1 min
    python -m bench.sim_policies --robots 8 --rate-hz 2 --pool-tokens 4096 --duration-s 18
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from dataclasses import dataclass

import torch

from bench.lib.fleets import Fleet, FleetTiming
from bench.lib.itl import ItlSummary, itl_gaps
from bench.lib.simulation import SimulatedEngine, run_fleet
from bench.lib.stats import percentile
from bench.lib.tables import markdown_table
from vla_sched.core.memory.kv_config import KVMemoryConfig
from vla_sched.core.memory.pages import round_up_to_page
from vla_sched.core.scheduling.scheduler_config import (
    SCHEDULE_POLICIES,
    PrefillDelayerConfig,
    SchedulerConfig,
)
from vla_sched.engine.checkpoints import open_served, resolve_checkpoint
from vla_sched.engine.config import EngineConfig
from vla_sched.model.families.openvla.steps import StepTranslator
from vla_sched.testing.sim_runner import CostModel

MS = 1_000_000


@dataclass(frozen=True, slots=True)
class Scenario:
    """The simulated deployment: fleet, KV pool, chunking, host time, cost model."""

    num_robots: int = 16
    timing: FleetTiming = dataclasses.field(
        default_factory=lambda: FleetTiming(
            period_s=0.2, budget_s=0.4, warmup_s=2.0, duration_s=10.0
        )
    )
    pool_tokens: int = 2048
    page_size: int = 16
    max_running: int = 16
    chunked_prefill_size: int = 256
    host_overhead_us: float = 300.0
    late_policy: str = 'drop'
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

    def config(self, scenario: Scenario) -> SchedulerConfig:
        return SchedulerConfig(
            schedule_policy=self.policy,
            max_running_requests=scenario.max_running,
            chunked_prefill_size=scenario.chunked_prefill_size,
            enable_overlap=self.overlap,
            prefill_decode_interval=self.prefill_decode_interval,
            late_policy=scenario.late_policy,
            prefill_delayer=dataclasses.replace(scenario.delayer, enabled=self.delayer),
        )


def simulate(scenario: Scenario, variant: Variant, translator: StepTranslator) -> list[object]:
    """One variant's table row."""
    spec = translator.spec
    context = 1024 + spec.num_image_tokens + spec.num_action_tokens
    memory = KVMemoryConfig(
        num_pages=scenario.pool_tokens // scenario.page_size,
        page_size=scenario.page_size,
        num_req_slots=scenario.max_running,
        max_context_len=round_up_to_page(context, scenario.page_size),
        session_idle_timeout_s=0.0,
    )
    engine = SimulatedEngine(
        variant.config(scenario),
        memory,
        scenario.cost,
        translator,
        host_overhead_us=scenario.host_overhead_us,
    )
    fleet = run_fleet(engine, Fleet(scenario.num_robots, scenario.timing))
    window = fleet.window
    judged = [r for r in engine.delivered if window[0] <= r.stamp_ns < window[1]]
    latency = [(r.times.finished_ns - r.stamp_ns) / MS for r in judged]
    itl = ItlSummary.of(*itl_gaps(judged, engine.runner.steps))
    measure = fleet.measure()
    metrics = engine.scheduler.metrics
    robots = metrics.robots.values()
    return [
        variant.policy,
        'on' if variant.delayer else 'off',
        variant.prefill_decode_interval,
        'on' if variant.overlap else 'off',
        f'{len(judged)}/{fleet.num_images_judged}',
        percentile(latency, 50),
        percentile(latency, 99),
        itl.clean_p50,
        itl.clean_p99,
        itl.prefill_p50,
        itl.prefill_p99,
        itl.max,
        f'{100 * measure.rate_share:.0f}%',
        sum(c.num_deadline_misses for c in robots),
        metrics.num_retracts_total,
        sum(c.num_superseded for c in robots),
        metrics.num_delayed_prefills,
        f'{100 * metrics.cache_hit_rate:.0f}%',
    ]


HEADERS = (
    'policy', 'delayer', 'interval', 'overlap', 'done/images', 'step p50', 'step p99',
    'ITL p50', 'ITL p99', 'ITL w/ prefill p50', 'ITL w/ prefill p99', 'ITL max', 'rate',
    'deadline misses', 'retracts', 'superseded', 'delayed passes', 'cache hit',
)  # fmt: skip


def _or_off(value: float | None) -> float:
    return -1 if value is None else value


def parse_args(argv: list[str] | None) -> tuple[Scenario, list[Variant], str]:
    base = Scenario()
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--robots', type=int, default=base.num_robots)
    parser.add_argument('--rate-hz', type=float, default=1 / base.timing.period_s)
    parser.add_argument('--duration-s', type=float, default=base.timing.duration_s)
    parser.add_argument('--deadline-ms', type=float, default=base.timing.budget_s * 1e3)
    parser.add_argument('--pool-tokens', type=int, default=base.pool_tokens)
    parser.add_argument('--page-size', type=int, default=base.page_size)
    parser.add_argument('--chunk', type=int, default=base.chunked_prefill_size)
    parser.add_argument('--host-overhead-us', type=float, default=base.host_overhead_us)
    parser.add_argument('--policies', nargs='+', default=list(SCHEDULE_POLICIES))
    parser.add_argument(
        '--delayer-near-done',
        type=int,
        default=_or_off(base.delayer.near_done_decode_tokens),
        help='near_done_decode_tokens of the prefill delayer (-1: off)',
    )
    parser.add_argument('--delayer-max-passes', type=int, default=base.delayer.max_delay_passes)
    parser.add_argument('--no-overlap-row', action='store_true', help='skip the overlap-off row')
    parser.add_argument(
        '--interval-row', type=int, default=1, help='a row with this prefill_decode_interval'
    )
    parser.add_argument('--late-policy', default=base.late_policy)
    parser.add_argument('--seed', type=int, default=base.timing.seed)
    parser.add_argument('--model-path', default='', help='checkpoint (default: the tiny one)')
    args = parser.parse_args(argv)
    try:
        timing = dataclasses.replace(
            base.timing,
            period_s=1 / args.rate_hz,
            duration_s=args.duration_s,
            budget_s=args.deadline_ms / 1e3,
            seed=args.seed,
        )
        delayer = PrefillDelayerConfig(
            enabled=True,
            near_done_decode_tokens=None if args.delayer_near_done < 0 else args.delayer_near_done,
            max_delay_passes=args.delayer_max_passes,
        )
    except ValueError as exc:
        parser.error(str(exc))
    scenario = dataclasses.replace(
        base,
        num_robots=args.robots,
        timing=timing,
        pool_tokens=args.pool_tokens,
        page_size=args.page_size,
        chunked_prefill_size=args.chunk,
        host_overhead_us=args.host_overhead_us,
        late_policy=args.late_policy,
        delayer=delayer,
    )
    variants = [Variant(p, d) for p in args.policies for d in (False, True)]
    first = args.policies[0]
    if args.interval_row:
        variants += [Variant(first, d, prefill_decode_interval=args.interval_row) for d in (0, 1)]
    if not args.no_overlap_row:
        variants.append(Variant(first, False, overlap=False))
    return scenario, variants, args.model_path


def main(argv: list[str] | None = None) -> int:
    torch.set_num_threads(1)  # tiny index tensors: a thread pool only adds overhead
    scenario, variants, model_path = parse_args(argv)
    folder, _ = resolve_checkpoint(model_path)
    translator = open_served(folder, EngineConfig(model_path=model_path)).translator
    layout = translator.prompts.build('pick up the red block')
    print(
        f'{scenario.num_robots} robots at {1 / scenario.timing.period_s:g} Hz, '
        f'{scenario.timing.duration_s:g} s judged, deadline {scenario.timing.budget_s * 1e3:g} '
        f'ms, KV pool {scenario.pool_tokens} tokens (page {scenario.page_size}), chunk '
        f'{scenario.chunked_prefill_size}, {folder.name}: {len(layout.token_ids)}-token prompt '
        f'({layout.session_prefix_len} session prefix, {layout.num_image_tokens} image), '
        f'{translator.spec.num_action_tokens} action tokens, late policy '
        f'{scenario.late_policy}; {scenario.cost}; {scenario.delayer}',
        flush=True,
    )
    rows = []
    for variant in variants:
        rows.append(simulate(scenario, variant, translator))
        print(markdown_table(HEADERS, [rows[-1]], digits=1).splitlines()[-1], flush=True)
    print()
    print(markdown_table(HEADERS, rows, digits=1))
    return 0


if __name__ == '__main__':
    sys.exit(main())
