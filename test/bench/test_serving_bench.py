"""The serving benchmarks (bench/control_loop.py, itl_jump.py, scheduler_cost.py) run end to
end in tiny modes, and their bookkeeping computes what it says."""

from __future__ import annotations

import importlib
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.slow  # seconds or more: not in the fast tier

ROOT = Path(__file__).resolve().parents[2]


def _bench(name: str):
    """``bench.<name>``, imported when a test needs it (some import rclpy)."""
    return importlib.import_module(f'bench.{name}')


# --- bookkeeping --------------------------------------------------------------------------


def _window(chunks: int, latencies: list[float], *, late: int = 0, deadline_refusals: int = 0):
    fleet = _bench('lib.ros_fleet')
    robot = {
        'num_chunks': chunks,
        'misses': late + deadline_refusals,
        'rejected': {'5': deadline_refusals} if deadline_refusals else {},
        'first_chunk': {'horizon': 2},
    }
    return fleet.FleetWindow(duration_s=2.0, robots=[robot], latencies_ms=latencies)


def test_a_loop_point_counts_actions_misses_and_pools_latencies_over_windows():
    loop = _bench('control_loop')
    plan = loop.LoopPlan(robot_counts=(4,), period_s=0.1)
    windows = [
        _window(10, [10.0] * 10, late=1),
        _window(20, [20.0] * 19 + [400.0], deadline_refusals=2),
    ]
    point = loop.summarize('scheduled', 4, plan, windows, retracts=[1, 2])
    assert point.actions_per_s == [10.0, 20.0]  # chunks x horizon 2 / 2 s
    assert point.target_actions_per_s == pytest.approx(80.0)  # 4 robots x 2 actions x 10 Hz
    assert point.miss_rate == pytest.approx(3 / 32)  # 3 misses over 30 chunks + 2 refusals
    assert point.num_retracts == 3
    assert point.rejected_by_reason == {'5': 2}
    assert point.latency_ms_p50 == pytest.approx(20.0)
    assert point.latency_ms_p99 > 20.0


def test_the_report_gives_ratios_of_the_scheduled_core_over_the_sequential_one():
    loop = _bench('control_loop')
    plan = loop.LoopPlan(robot_counts=(8,))
    ours = loop.summarize('scheduled', 8, plan, [_window(50, [100.0] * 50)], [0])
    base = loop.summarize('sequential', 8, plan, [_window(10, [400.0] * 10)], [0])
    tables = loop.markdown_tables([base, ours])
    assert '| 8 | 5.00x | 0.25 | 0.25 |' in tables
    rows = [line for line in tables.splitlines() if line.startswith('| 8 | ')]
    assert rows[0].startswith('| 8 | scheduled | 50.0 (50.0-50.0) | 160 | 100 | 100 | 0.0% | 0 |')


def test_loop_plan_rejects_bad_settings_by_name():
    loop = _bench('control_loop')
    with pytest.raises(ValueError, match='period_s'):
        loop.LoopPlan(period_s=0.0)
    with pytest.raises(ValueError, match='systems'):
        loop.LoopPlan(systems=('vllm',))


def test_null_runner_samples_the_first_allowed_token_only_where_asked():
    cost = _bench('scheduler_cost')
    from vla_sched.core.forward_batch import SamplingParams

    class Batch:
        sampling = (SamplingParams(5, 9), SamplingParams(7, 8))
        sample = (True, False)

    assert cost.NullRunner().launch(Batch()).result().next_token_ids == (5, -1)


def test_plots_are_written_as_png_files_from_the_json_records(tmp_path):
    plots = _bench('serving_plots')
    loop = {
        'plan': {'budget_s': 0.5, 'period_s': 0.1},
        'points': [
            {
                'system': s,
                'num_robots': n,
                'actions_per_s': [10.0 * n / k, 9.0 * n / k],
                'target_actions_per_s': 20.0 * n,
                'latency_ms_p99': 100.0 * k,
            }
            for s, k in (('scheduled', 1), ('sequential', 2))
            for n in (1, 2)
        ],
    }
    itl = {'results': [{'variant': 'sglang', 'itl_clean_p99': 4.0, 'itl_prefill_p99': 9.0}]}
    cost = {
        'points': [
            {'runner': r, 'overlap': o, 'batch_size': b, 'sched_us': 10.0 * b, 'step_us': 40.0 * b}
            for r in ('null', 'model')
            for o in (False, True)
            for b in (1, 4)
        ]
    }
    paths = {}
    for name, record in (('loop', loop), ('itl', itl), ('cost', cost)):
        paths[name] = tmp_path / f'{name}.json'
        paths[name].write_text(json.dumps(record))
    argv = ['--control-loop', str(paths['loop']), '--itl', str(paths['itl'])]
    argv += ['--cost', str(paths['cost']), '--out', str(tmp_path / 'img'), '--tag', 't']
    assert plots.main(argv) == 0
    for name in ('control_loop_t', 'itl_jump_t', 'scheduler_cost_t'):
        data = (tmp_path / 'img' / f'{name}.png').read_bytes()
        assert data.startswith(b'\x89PNG') and len(data) > 10_000


# --- end to end, tiny -----------------------------------------------------------------------


@pytest.mark.slow
def test_scheduler_cost_times_decode_steps_with_and_without_the_model(tmp_path, capsys):
    cost = _bench('scheduler_cost')
    out = tmp_path / 'cost.json'
    argv = ['--batch-sizes', '1', '3', '--steps', '3', '--json', str(out)]
    assert cost.main(argv) == 0
    points = json.loads(out.read_text())['points']
    keys = {(p['runner'], p['overlap'], p['batch_size']) for p in points}
    assert keys == {(r, o, b) for r in ('null', 'model') for o in (False, True) for b in (1, 3)}
    for p in points:
        assert 0 < p['sched_us'] <= p['step_us']
        model_share = p['model_us'] / p['step_us']
        assert model_share < 0.2 if p['runner'] == 'null' else model_share > 0.3
    assert '| model | on | 3 |' in capsys.readouterr().out


@pytest.mark.slow
def test_itl_jump_classifies_every_token_gap_of_the_finished_steps(tmp_path):
    itl = _bench('itl_jump')
    out = tmp_path / 'itl.json'
    argv = ['--robots', '2', '--period', '0.05', '--duration', '1.5', '--json', str(out)]
    # Each decode pass waits while the other robot is idle until its next image is due, so
    # that robot's step is queued while the running step still decodes: however fast or busy
    # the machine, a prefill lands inside a running step's gap.
    argv.append('--hold-decodes')
    assert itl.main([*argv, '--variants', 'sglang', 'delayer+chunked']) == 0
    results = json.loads(out.read_text())['results']
    assert [r['variant'] for r in results] == ['sglang', 'delayer+chunked']
    for r in results:
        assert 0 < r['num_steps_done'] <= r['num_steps_sent']
        assert 0 < r['itl_clean_p50'] <= r['itl_max']
        assert 0.0 <= r['prefill_gap_share'] <= 1.0
        assert r['step_p50'] <= r['step_p99']
    # Prefill first (sglang): the other robot's queued step is prefilled inside a gap.
    assert results[0]['prefill_gap_share'] > 0
    assert not math.isnan(results[0]['itl_prefill_p99'])


@pytest.mark.slow
def test_engine_throughput_compares_both_cores_and_splits_the_scheduled_time(capsys):
    tp = _bench('engine_throughput')
    assert tp.main(['--robots', '2', '--duration', '1']) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith('| 2 |')]
    assert [row.split('|')[2].strip() for row in rows] == ['scheduled', 'sequential']
    scheduled = [float(cell) for cell in rows[0].split('|')[3:8]]
    assert all(value > 0 for value in scheduled[:4])  # steps/s, latency, model, scheduler
    # Glue is busy time minus model and scheduler time, clamped at 0: on a loaded machine
    # the three measurements can leave nothing between them.
    assert scheduled[4] >= 0
    assert rows[0].split('|')[8].strip().endswith('x')  # the ratio to the sequential core


@pytest.mark.slow
def test_openvla_shaped_checkpoint_is_served_by_both_engine_cores(tmp_path):
    from bench.lib.checkpoints import write_openvla_folder
    from bench.lib.fleets import step_request
    from vla_sched.engine.config import EngineConfig
    from vla_sched.engine.core_factory import build_core
    from vla_sched.ipc.messages import StepResult
    from vla_sched.model.families.openvla.prompt import VLAPromptBuilder

    folder = write_openvla_folder(tmp_path / 'ckpt', tiny=True, num_shards=2)
    layout = VLAPromptBuilder.from_checkpoint(folder).build('pick up the block')
    assert layout.token_ids[0] == 1 and layout.image_offset == 1  # BOS, then the image
    assert layout.num_image_tokens == 256
    for core_name in ('scheduled', 'sequential'):
        core = build_core(EngineConfig(core=core_name, model_path=str(folder)))
        request = step_request(
            0, 1, stamp_ns=0, deadline_ns=2**62, received_ns=0,
            frame=np.zeros((224, 224, 3), np.uint8), num_state=core.info.num_state,
            instruction='pick up the block',
        )  # fmt: skip
        assert core.submit(request, 0) == []
        outs = []
        while core.has_work():
            outs += core.step(0)
        core.close()
        (out,) = outs
        assert isinstance(out, StepResult), out
        assert out.actions.shape == (1, 7) and np.all(np.isfinite(out.actions))


@pytest.mark.ros
@pytest.mark.slow
def test_control_loop_serves_robots_with_both_cores_and_prints_the_ratios(tmp_path):
    out = tmp_path / 'loop.json'
    cmd = [sys.executable, '-m', 'bench.control_loop', '--robots', '1', '2']
    cmd += ['--warmup', '0.5', '--duration', '2', '--windows', '1', '--json', str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=280, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    points = json.loads(out.read_text())['points']
    assert {(p['system'], p['num_robots']) for p in points} == {
        (s, n) for s in ('scheduled', 'sequential') for n in (1, 2)
    }
    assert all(p['num_chunks'] > 0 for p in points)
    assert '| robots | actions/s scheduled / sequential |' in proc.stdout


@pytest.mark.slow
def test_prefix_reuse_shows_image_first_prompts_share_nothing_but_bos(tmp_path):
    bench = _bench('prefix_reuse')
    out = tmp_path / 'reuse.json'
    assert bench.main(['--robots', '2', '--steps', '2', '--json', str(out)]) == 0
    instruction_first, image_first = json.loads(out.read_text())
    assert instruction_first['session_prefix_len'] > 1
    assert instruction_first['cached_tokens_per_step'] > 0
    assert instruction_first['cache_hit_rate'] > 0
    assert image_first['session_prefix_len'] == 1  # BOS, then the frame's image
    assert image_first['cached_tokens_per_step'] == 0
    assert image_first['prefilled_tokens_per_step'] == image_first['prompt_len']


@pytest.mark.slow
def test_engine_paced_judges_each_count_by_the_capacity_rule(tmp_path):
    paced = _bench('engine_paced')
    out = tmp_path / 'paced.json'
    argv = ['--capacity', '--max-robots', '2', '--warmup', '0.2', '--duration', '0.6']
    assert paced.main([*argv, '--deadline-ms', '60000', '--json', str(out)]) == 0
    points = json.loads(out.read_text())['points']
    assert [p['num_robots'] for p in points] == [1, 2]
    for p in points:
        assert p['num_results'] > 0 and p['num_failures'] == 0
        assert p['capacity']['on_time_share'] == 1.0  # a minute's deadline
        assert 0 < p['capacity']['rate_share'] <= 1.0


def test_engine_paced_sets_mixed_passes_in_the_scheduler_settings_it_builds_the_core_with():
    from vla_sched.engine.assembly import scheduler_config_for

    paced = _bench('engine_paced')
    for mixed in (True, False):
        core = paced.make_core('', device='cpu', cuda_graphs=False, mixed_passes=mixed)
        assert core.scheduler.config.enable_mixed_chunk is mixed
    engine_default = paced.make_core('', device='cpu', cuda_graphs=False)
    assert engine_default.scheduler.config == scheduler_config_for(engine_default.config, 'cpu')


def test_sim_policies_prints_a_row_per_variant_on_the_simulated_clock(capsys):
    policies = _bench('sim_policies')
    argv = ['--robots', '2', '--duration-s', '1', '--policies', 'fcfs', '--no-overlap-row']
    assert policies.main([*argv, '--interval-row', '0']) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith('| fcfs |')]
    assert len(rows) == 4  # delayer off and on, each printed as it ends and in the table
    assert rows[-2] == rows[0] and rows[-1] == rows[1]  # simulated: the same numbers


@pytest.mark.parametrize(
    'driver',
    [
        'control_loop', 'engine_paced', 'engine_throughput', 'itl_jump', 'scheduler_cost',
        'sim_policies', 'soak', 'node_cpu', 'prefix_reuse', 'bench_memory', 'serving_plots',
    ],
)  # fmt: skip
def test_every_driver_runs_as_a_module_with_help(driver):
    proc = subprocess.run(
        [sys.executable, '-m', f'bench.{driver}', '--help'],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith('usage: ')
