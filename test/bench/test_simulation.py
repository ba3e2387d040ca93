"""One simulator (bench/lib/simulation.py): robots on a simulated clock against the engine's
scheduler over the simulated runner, or against one step at a time. Every time is simulated,
so every number here is the same on any machine."""

from __future__ import annotations

import pytest
import torch

from bench.lib.fleets import Fleet, FleetTiming
from bench.lib.itl import ItlSummary, itl_gaps
from bench.lib.simulation import OneAtATimeServer, SimulatedEngine, run_fleet, serve_robots
from vla_sched.engine.checkpoints import open_served, resolve_checkpoint
from vla_sched.engine.config import EngineConfig
from vla_sched.model.families.openvla.steps import StepTranslator
from vla_sched.testing.sim_runner import CostModel

MS = 1_000_000
TIMING = FleetTiming(period_s=0.1, budget_s=0.5, warmup_s=0.2, duration_s=1.0, phases='spread')


@pytest.fixture(scope='module')
def translator() -> StepTranslator:
    torch.set_num_threads(1)
    folder, _ = resolve_checkpoint('')
    return open_served(folder, EngineConfig()).translator


def test_one_at_a_time_serves_every_image_while_steps_fit_the_period_and_falls_behind_after():
    fits = serve_robots(OneAtATimeServer(step_ns=20 * MS), 4, TIMING)  # 80 of 100 ms
    assert (fits.rate_share, fits.on_time_share) == (1.0, 1.0)
    assert fits.latency_ms_p50 == pytest.approx(20.0)  # spread phases: nobody waits
    behind = serve_robots(OneAtATimeServer(step_ns=40 * MS), 4, TIMING)  # 160 of 100 ms
    assert 0.55 < behind.rate_share < 0.8  # about 100 / 160, less the window's edges
    assert behind.latency_ms_p99 > 40.0


def test_the_engine_serves_the_checkpoints_prompts_through_its_translator(translator):
    engine = SimulatedEngine.for_engine(EngineConfig(), CostModel(), translator, device_type='cpu')
    fleet = run_fleet(engine, Fleet(2, TIMING))
    assert fleet.done() and fleet.measure().rate_share == 1.0
    layout = translator.prompts.build('pick up the red block')
    assert {r.origin_input_ids for r in engine.delivered} == {layout.token_ids}
    assert {len(r.output_ids) for r in engine.delivered} == {translator.spec.num_action_tokens}
    sessions = engine.scheduler.memory.sessions
    assert {s.robot_id for s in sessions.sessions()} == {'robot_0', 'robot_1'}
    assert engine.scheduler.metrics.cache_hit_rate > 0  # each robot's prefix is reused


def test_an_overloaded_engine_delivers_less_than_the_rate_and_the_simulation_repeats(translator):
    slow = CostModel(prefill_base_ns=30 * MS, decode_base_ns=10 * MS)

    def measure():
        engine = SimulatedEngine.for_engine(EngineConfig(), slow, translator, device_type='cpu')
        return serve_robots(engine, 8, TIMING)

    first = measure()
    assert first.rate_share < 0.99
    assert measure() == first


def test_two_robots_half_a_period_apart_put_a_prefill_inside_a_running_steps_gaps(translator):
    # Robot 1's image arrives while robot 0 decodes (on the simulated clock, so on any
    # machine), and its prefill pass runs inside one of robot 0's token gaps.
    engine = SimulatedEngine.for_engine(EngineConfig(), CostModel(), translator, device_type='cpu')
    run_fleet(
        engine, Fleet(2, FleetTiming(period_s=0.1, warmup_s=0.0, duration_s=0.5, phases='spread'))
    )
    clean, hit = itl_gaps(engine.delivered, engine.runner.steps)
    summary = ItlSummary.of(clean, hit)
    assert clean and hit
    assert 0 < summary.prefill_gap_share < 1
