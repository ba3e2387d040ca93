"""The H200 cost model (bench.lib.cost_model: the floor, the calibrations, the bounds) and
the capacity projection (bench.capacity_projection) in tiny runs: its servers on the shared
simulator, the report."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from bench import capacity_projection
from bench.lib import cost_model
from bench.lib.capacity import CapacityCriteria
from bench.lib.fleets import FleetTiming
from bench.lib.simulation import OneAtATimeServer, serve_robots
from vla_sched.engine.assembly import scheduler_config_for
from vla_sched.engine.config import EngineConfig


@pytest.fixture(scope='module')
def shape():
    return cost_model.openvla_7b_shape()


@pytest.fixture(autouse=True, scope='module')
def single_torch_thread():
    """Tiny index tensors: a thread pool only adds overhead on a busy machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_the_hardware_bound_calibration_gives_the_floor_of_one_robot(shape):
    hw = cost_model.H200Measurements()
    cost = cost_model.hardware_bound_cost(shape, hw)
    assert shape.prompt_len == 280 and shape.num_action_tokens == 7
    assert 4.0e12 < shape.step_flops < 4.4e12
    assert cost.prefill_ns(280, 1) / 1e6 == pytest.approx(hw.floor_prefill_ms, rel=0.01)
    decode_ms = cost.decode_ns(1, 281) / 1e6  # the floor leaves the KV reads out
    assert hw.floor_decode_ms < decode_ms < 1.02 * hw.floor_decode_ms


def test_the_floor_of_the_7b_shape_at_run_as_rates_is_the_floor_run_a_measured(shape):
    hw = cost_model.H200_RUN_A
    floor = cost_model.step_floor(shape, hw)
    assert floor.prefill_ms == pytest.approx(hw.floor_prefill_ms, rel=0.01)
    assert floor.decode_ms == pytest.approx(hw.floor_decode_ms, rel=0.01)
    assert floor.step_ms == pytest.approx(hw.floor_step_ms, rel=0.01)
    assert floor.step_ms == pytest.approx(floor.prefill_ms + 6 * floor.decode_ms)


def test_a_slow_copy_makes_the_prefill_floor_the_weights_not_the_flops(shape):
    slow = cost_model.step_floor(
        shape, dataclasses.replace(cost_model.H200_RUN_A, copy_gb_per_s=1.0)
    )
    weight_bytes = (shape.decoder_params + shape.vision_params) * shape.bytes_per_param
    assert slow.prefill_ms == pytest.approx(weight_bytes / 1e9 * 1e3)


@pytest.mark.slow
def test_a_checkpoint_folder_has_the_shape_of_its_config(tmp_path):
    from bench.lib.checkpoints import openvla_folder_once

    folder, reused = openvla_folder_once(tmp_path, tiny=True, device='cpu', dtype=torch.float32)
    assert not reused
    assert openvla_folder_once(tmp_path, tiny=True, device='cpu', dtype=torch.float32)[1]
    tiny = cost_model.checkpoint_shape(folder, bytes_per_param=4)
    assert (tiny.num_image_tokens, tiny.num_action_tokens, tiny.prompt_len) == (256, 7, 280)
    assert 0 < tiny.decoder_params < 7e9 / 100 and tiny.kv_bytes_per_token % 4 == 0


def test_the_measured_calibrations_reproduce_the_runners_times_on_the_h200(shape):
    for hw in (cost_model.H200_RUN_A, cost_model.H200_RUN_B):
        cost = cost_model.measured_cost(shape, hw)
        for robots, ms in hw.runner_prefill_ms:
            assert cost.prefill_ns(robots * 280, robots) / 1e6 == pytest.approx(ms, rel=1e-6)
        for robots, ms in hw.runner_decode_ms:
            assert cost.decode_ns(robots, robots * 283) / 1e6 == pytest.approx(ms, rel=1e-6)
        assert 0 < cost.compute_utilization <= 1 and 0 < cost.kv_bandwidth_utilization <= 1
    hw = cost_model.H200_RUN_A
    too_fast = dataclasses.replace(hw, runner_prefill_ms=((1, 1.0), (16, 2.0)))
    with pytest.raises(ValueError, match='the fit gives'):
        cost_model.measured_cost(shape, too_fast)


def test_the_pass_bound_lies_below_the_flop_ceiling_and_fills_the_period(shape):
    for name in cost_model.CALIBRATIONS:
        cost = cost_model.calibrated_cost(name, shape)
        bounds = cost_model.physical_bounds(cost, shape, 0.1)
        assert 0 < bounds.pass_bound < bounds.flop_ceiling < bounds.bandwidth_ceiling
        assert cost_model.period_pass_ns(cost, shape, bounds.pass_bound) == pytest.approx(
            1e8, rel=1e-6
        )
        assert bounds.one_at_a_time_bound < bounds.pass_bound


def test_one_at_a_time_robots_wait_for_their_step_in_flight_and_are_judged_on_the_window(
    shape,
):
    cost = cost_model.hardware_bound_cost(shape, cost_model.H200Measurements())
    step_ns = round(cost_model.one_at_a_time_step_ns(cost, shape))
    timing = FleetTiming(warmup_s=0.2, duration_s=1.0)
    one = serve_robots(OneAtATimeServer(step_ns), 1, timing)
    assert one.rate_share == 1.0 and one.on_time_share == 1.0
    assert one.latency_ms_p50 == pytest.approx(step_ns / 1e6, abs=1e-3)
    many = serve_robots(OneAtATimeServer(step_ns), 8, timing)
    assert many.rate_share < 0.7  # 8 steps of 25 ms do not fit a 100 ms period
    assert many.on_time_share == 1.0  # the robots' images wait instead: latency stays bounded
    assert many.latency_ms_p99 > 100


@pytest.fixture(scope='module')
def translator(tmp_path_factory):
    return capacity_projection.openvla_translator(tmp_path_factory.mktemp('projection'))


def test_the_projection_serves_openvla_prompts_with_the_engines_gpu_settings(shape, translator):
    plan = _tiny_plan()
    cost = cost_model.hardware_bound_cost(shape, cost_model.H200_RUN_A)
    servers = dict(capacity_projection.projection_servers(plan, cost, shape, translator))
    engine = EngineConfig(chunked_prefill_size=8192, kv_pool_tokens=plan.kv_pool_tokens)
    gpu = scheduler_config_for(engine, 'cuda')
    separate = servers['vla_sched, chunk 8192']().scheduler.config
    assert separate == dataclasses.replace(gpu, enable_mixed_chunk=False)
    mixed = servers['vla_sched, chunk 8192, mixed passes']().scheduler.config
    assert mixed == gpu and gpu.enable_mixed_chunk
    spec = translator.spec
    assert (spec.num_image_tokens, spec.num_action_tokens) == (
        shape.num_image_tokens,
        shape.num_action_tokens,
    )
    one = servers['one-at-a-time']()
    assert one.step_ns == round(cost_model.one_at_a_time_step_ns(cost, shape))


def _tiny_plan(max_robots: int = 4, *, duration_s: float = 0.6):
    return capacity_projection.ProjectionPlan(
        timing=FleetTiming(warmup_s=0.5, duration_s=duration_s),
        max_robots=max_robots,
        chunk_sizes=(8192,),
    )


def _check_within_bounds(p) -> None:
    """Capacities within their bounds, up to the criteria's slack (99% of the rate passes)."""
    slack = CapacityCriteria().min_rate_share
    assert [s.system for s in p.searches] == [
        'vla_sched, chunk 8192',
        'vla_sched, chunk 8192, mixed passes',
        'one-at-a-time',
    ]
    assert p.bounds.pass_bound <= p.bounds.flop_ceiling
    for search in p.searches:
        assert search.steps and search.one_robot is not None
        # mixed passes decode inside prefill passes: only the FLOP ceiling bounds them
        mixed = search.system.endswith('mixed passes')
        bound = p.bounds.flop_ceiling if mixed else p.bounds.pass_bound
        assert search.capacity <= bound / slack
    assert p.one_at_a_time.capacity <= p.bounds.one_at_a_time_bound / slack


@pytest.mark.slow
def test_the_projection_on_a_slow_device_stops_at_its_bound(shape, translator):
    # 120 TFLOP/s: the bounds fall to a few robots, so the search meets them; the window
    # is long enough for a backlog of a few percent to cost images
    hw = dataclasses.replace(cost_model.H200Measurements(), matmul_tflops=120.0)
    p = capacity_projection.project(
        'hardware bound', _tiny_plan(duration_s=3.0), shape=shape, criteria=CapacityCriteria(),
        translator=translator, hw=hw, progress=lambda line: None,
    )  # fmt: skip
    assert p.bounds.pass_bound < 4
    _check_within_bounds(p)
    for search in p.searches:  # stopped by failures, not by the end of the counts
        assert not search.steps[-1].passed


@pytest.mark.slow
def test_a_tiny_projection_writes_each_servers_capacity_and_the_bounds(tmp_path):
    out, md = tmp_path / 'projection.json', tmp_path / 'projection.md'
    results = capacity_projection.run(
        _tiny_plan(max_robots=3), ('as measured',), json_path=str(out),
        markdown_path=str(md),
    )  # fmt: skip
    assert [p.calibration for p in results] == ['as measured']
    _check_within_bounds(results[0])
    record = json.loads(out.read_text())
    assert record['projection'] == 'no GPU served these robots'
    (row,) = record['projections']
    assert {s['system'] for s in row['searches']} == {
        'vla_sched, chunk 8192',
        'vla_sched, chunk 8192, mixed passes',
        'one-at-a-time',
    }
    assert all(isinstance(s['capacity'], int) for s in row['searches'])
    assert row['bounds']['pass_bound'] > 0 and row['cost_model']['prefill_fixed_ns'] > 0
    report = md.read_text()
    assert report.startswith('**Projection** (no GPU served these robots)')
    assert '| as measured | one-at-a-time |' in report and '| as measured | vla_sched' in report
    assert '| calibration | FLOP ceiling | bandwidth ceiling | pass bound |' in report
