"""bench.gpu_check: the prepared GPU run, checked through its CPU dry run.

Every part runs in its own subprocess with rclpy, ZMQ, cv_bridge, cv2 and PIL hidden (as on
the bare GPU machine); a part that hangs is stopped at its limit and the next part still runs,
and a part stopped partway keeps the data it saved on the way.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from bench.gpu_check import report
from bench.lib.capacity import CapacityCriteria, CapacityMeasure

pytestmark = pytest.mark.slow  # seconds or more: not in the fast tier

ROOT = Path(__file__).resolve().parents[2]
PARTS = (
    'environment', 'kernels', 'checkpoint', 'model', 'profile', 'engine_core', 'serving',
    'oft', 'scheduler', 'pi0', 'smolvla',
)  # fmt: skip


def _run(out: Path, *args: str, timeout_s: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, '-m', 'bench.gpu_check', '--out', str(out), '--dry-run', *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


@pytest.fixture(scope='module')
def dry_run_outputs(tmp_path_factory) -> tuple[subprocess.CompletedProcess, dict, str, Path]:
    """The whole dry run through the GPU machine's entry point, bench/gpu_check.sh; the
    parts' limits are set for the H200, so they are doubled for a shared 2-core CPU. The
    work dir is kept: it holds each part's result and partial files."""
    out = tmp_path_factory.mktemp('gpu_check')
    workdir = out / 'work'
    done = subprocess.run(
        ['bash', str(ROOT / 'bench' / 'gpu_check.sh'), str(out), '--dry-run', '--budget-s', '900',
         '--workdir', str(workdir)],
        env=dict(os.environ, PYTHON=sys.executable, GPU_CHECK_TIMEOUT_S='580'),
        capture_output=True,
        text=True,
        timeout=600,
    )  # fmt: skip
    results = json.loads((out / 'results.json').read_text())
    return done, results, (out / 'report.md').read_text(), workdir


@pytest.fixture(scope='module')
def dry_run(dry_run_outputs) -> tuple[subprocess.CompletedProcess, dict, str]:
    return dry_run_outputs[:3]


def test_dry_run_runs_every_part_ok_and_says_so_with_timestamps(dry_run):
    done, results, report = dry_run
    assert done.returncode == 0, done.stdout[-3000:]
    assert {name: e['status'] for name, e in results['parts'].items()} == dict.fromkeys(
        PARTS, 'ok'
    )
    for name in PARTS:
        assert f'] {name}: ok in ' in done.stdout
        assert f'| {name} | ok |' in report
    assert results['dry_run'] is True and results['hidden_modules']


def test_dry_run_records_the_numbers_each_part_must_produce(dry_run):
    _, results, report = dry_run
    data = {name: e['data'] for name, e in results['parts'].items()}
    env = data['environment']
    assert env['copy_gb_per_s'] > 0 and env['matmul_tflops'] > 0
    assert {'python', 'torch', 'triton', 'transformers', 'numpy'} <= set(env['versions'])
    # The decode builds are listed before any timing; the interpreter compiles nothing.
    builds = env['kernel_builds']
    assert builds['compiled'] is False and len(builds['rows']) == 7
    assert all(row['fallback'] >= 1 for row in builds['rows'])
    assert '## Kernel builds' in report
    kernels = data['kernels']
    assert [r['kernel'] for r in kernels['rows']] == ['decode', 'extend', 'store_kv']
    assert all(r['ms'] > 0 and r['gbs'] >= 0 and 'copy_share' in r for r in kernels['rows'])
    assert any('every benchmark shape' in check for check in kernels['checks'])
    assert kernels['copy_gb_per_s'] == env['copy_gb_per_s']  # the rates are measured once
    model = data['model']
    assert model['logits']['max_relative_error'] < 1e-3  # fp32, same weights
    assert [b['robots'] for b in model['batches']] == [1, 2]
    for batch in model['batches']:
        for engine in ('eager', 'graphs', 'transformers'):
            assert batch[engine]['step_ms'] > 0
        for share in ('graphs_equal_eager_share', 'eager_equal_transformers_share'):
            assert 0.0 <= batch[share] <= 1.0
        assert batch['batch_floor']['num_robots'] == batch['robots']
    assert model['floor']['copy_gb_per_s'] == env['copy_gb_per_s']
    assert model['floor']['step_ms'] > 0 and model['runner_step_over_floor'] > 0
    core = data['engine_core']
    assert core['num_steps_sent'] == 8 and core['num_results'] + core['num_failures'] == 8
    assert core['num_integrity_checks'] >= core['num_steps_sent']
    serving = data['serving']
    criteria = CapacityCriteria()  # the one capacity rule decides which counts are served
    for key, capacity in (('points', 'capacity_separate'), ('mixed_points', 'capacity_mixed')):
        points = serving[key]
        served = [
            p['num_robots']
            for p in points
            if not criteria.failures(CapacityMeasure(**p['capacity']))
        ]
        # The bisection up to 2 robots: 1 robot, then 2 only where 1 was served.
        assert [p['num_robots'] for p in points] == ([1, 2] if 1 in served else [1])
        assert serving[capacity] == max(served, default=0)
        for point in points:
            assert point['latency_ms_p99'] >= point['latency_ms_p50']
            assert point['target_actions_per_s'] == point['num_robots'] / serving['period_s']
    assert serving['max_robots_served'] == max(
        serving['capacity_separate'], serving['capacity_mixed']
    )
    # The ceiling is at least the pass bound (equal when compute-bound: up to rounding).
    assert serving['robots_bound'] >= serving['robots_pass_bound'] * (1 - 1e-9) > 0
    assert 'bound_share_served' in serving
    assert serving['floor']['matmul_tflops'] == env['matmul_tflops']
    assert serving['one_robot_step_over_floor'] > 0
    _check_oft(data['oft'], env)
    points = data['scheduler']['points']
    assert {(p['runner'], p['overlap']) for p in points} == {
        (runner, overlap) for runner in ('null', 'model') for overlap in (False, True)
    }
    assert '## Scheduler host time per decode step' in report and 'Mixed passes:' in report
    for header in ('## Kernels', '## Model', '## Profile', '## Engine core', '## Serving'):
        assert header in report
    assert report.index('## Serving') < report.index('## OpenVLA-OFT (libero preset: 2 cameras')


def _check_oft(oft: dict, env: dict) -> None:
    """The oft part's data: the libero preset's padded passes (no graphs on the CPU) checked
    against the eager pass, then 1 and 2 robots on them and one robot eager against their
    floors at the environment's rates, and the capacity bisection of its chunks."""
    assert (oft['num_images'], oft['chunk_len'], oft['seq_len']) == (2, 8, 590)
    assert oft['cuda_graphs'] is False and oft['core_cuda_graphs'] is False
    # The engine's prepared sizes: 1, 2, 4 and 8 robots of 571 + 48 positions, in 64s.
    assert oft['pass_sizes'] == [[1, 640], [2, 1280], [4, 2496], [8, 4992]]
    assert oft['capture_s'] >= 0
    check = oft['check']
    assert [r['robots'] for r in check['rows']] == [1, 2] and check['passed']
    assert all(r['max_relative_error'] <= check['tolerance'] == 1e-4 for r in check['rows'])
    assert [s['robots'] for s in oft['steps']] == [1, 2]
    assert [s['pass_robots'] for s in oft['steps']] == [[1], [2]]
    for step, size in zip(oft['steps'], (640, 1280), strict=True):
        assert step['path'] == 'padded'
        # Each timed call (2) one pass at its size; both cameras of every robot in one
        # encoder run at a prepared size.
        num_real = 2 * step['robots'] * oft['seq_len']
        assert step['padding']['oft'] == {
            'num_padded_runs': 2, 'num_real': num_real, 'num_padding': 2 * size - num_real,
            'num_eager_runs': 0, 'num_eager': 0,
            'padding_share': pytest.approx(1 - num_real / (2 * size)),
        }  # fmt: skip
        vision = step['padding']['vision']
        assert (vision['num_padded_runs'], vision['num_real']) == (2, 4 * step['robots'])
        assert vision['num_eager_runs'] == 0
    eager = oft['eager_step']
    assert (eager['robots'], eager['path'], eager['chunk_shape']) == (1, 'eager', [8, 7])
    assert eager['padding']['oft']['num_padded_runs'] == 0
    assert eager['padding']['oft']['num_eager_runs'] == 2
    assert eager['over_graphs'] == pytest.approx(eager['pass_ms'] / oft['steps'][0]['pass_ms'])
    for step in (*oft['steps'], eager):
        assert step['pass_ms'] > 0 and step['chunk_shape'] == [8, 7]
        floor = step['floor']
        assert floor['num_robots'] == step['robots']
        assert floor['matmul_tflops'] == env['matmul_tflops']
        assert floor['pass_ms'] == max(floor['compute_ms'], floor['weights_ms']) > 0
        assert step['over_floor'] == pytest.approx(step['pass_ms'] / floor['pass_ms'])
    assert oft['crop_ms_per_image'] > 0 and oft['robots_bound'] > 0
    capacity = oft['capacity']
    # The bisection up to 2 robots (or the FLOP ceiling, if lower): 1 robot, then 2 only
    # where 1 was served.
    assert capacity['max_robots'] == min(2, math.ceil(oft['robots_bound']))
    criteria = CapacityCriteria()
    points = capacity['points']
    served = [
        p['num_robots'] for p in points if not criteria.failures(CapacityMeasure(**p['capacity']))
    ]
    expected = [1, 2] if 1 in served and capacity['max_robots'] == 2 else [1]
    assert [p['num_robots'] for p in points] == expected
    assert capacity['capacity'] == max(served, default=0)
    for point in points:  # a chunk of 8 actions per robot per period
        assert point['target_actions_per_s'] == 8 * point['num_robots'] / capacity['period_s']
    # The engine core on the CPU runs its plain eager pass: one per batch it ran.
    core_oft = capacity['padding']['oft']
    assert core_oft['num_padded_runs'] == 0 and core_oft['num_eager_runs'] > 0


def test_dry_run_profiles_each_step_as_a_table_of_its_ops_longest_first(dry_run):
    _, results, report = dry_run
    profile = results['parts']['profile']['data']
    assert profile['table'] == 'CPU operators (self time)'
    steps = [(s['step'], s['robots']) for s in profile['steps']]
    assert steps == [('prefill', 1), ('decode', 1), ('prefill', 2), ('decode', 2)]
    for step in profile['steps']:
        rows = step['rows']
        assert rows and sum(r['share'] for r in rows) == pytest.approx(1.0)
        assert [r['total_us'] for r in rows] == sorted((r['total_us'] for r in rows), reverse=True)
        assert all(r['calls'] > 0 and r['mean_us'] > 0 for r in rows)
        assert step['busy_ms'] == pytest.approx(sum(r['total_us'] for r in rows) / 1e3)
        assert step['graph_launches'] == 0  # a CPU launches no CUDA graph
    assert [s['tokens'] for s in profile['steps']] == [280, 1, 560, 2]
    assert '### Prefill, 1 robot (280 tokens)' in report and '### Decode, 2 robots' in report
    assert '| operator | calls | total us | mean us | share |' in report


def test_dry_run_opens_its_report_with_every_issue_target_from_the_parts_data(dry_run):
    _, results, report = dry_run
    data = {name: e['data'] for name, e in results['parts'].items()}
    rows = {t['key']: t for t in results['targets']}
    assert list(rows) == [
        'decode_step_1', 'decode_step_batch', 'prefill_1', 'step_1', 'step_batch',
        'decode_kernel_copy_share', 'extend_kernel_over_sdpa', 'capacity_separate',
        'capacity_mixed', 'engine_step_1', 'oft_step_1', 'oft_step_batch', 'oft_capacity',
    ]  # fmt: skip
    one, two = (b['graphs'] for b in data['model']['batches'])
    assert rows['decode_step_1']['value'] == one['decode_step_ms']
    assert rows['step_batch']['value'] == two['step_ms']
    assert rows['step_batch']['measure'] == '2 robots in one batched step'
    assert rows['step_1']['over_floor'] == pytest.approx(data['model']['runner_step_over_floor'])
    for key in ('capacity_separate', 'capacity_mixed'):
        assert rows[key]['value'] == data['serving'][key]
        assert rows[key]['met'] is (data['serving'][key] >= 10)
    oft_one, oft_two = data['oft']['steps']
    assert rows['oft_step_1']['value'] == oft_one['pass_ms']
    assert rows['oft_step_batch']['over_floor'] == pytest.approx(oft_two['over_floor'])
    assert rows['oft_capacity']['value'] == data['oft']['capacity']['capacity']
    for key in ('oft_step_1', 'oft_step_batch', 'oft_capacity'):
        assert rows[key]['target'] is None and rows[key]['met'] is None
    # The dry run's kernel shapes are tiny: no decode at batch 32, no extend at batch 8.
    assert rows['decode_kernel_copy_share']['met'] is None
    assert rows['extend_kernel_over_sdpa']['met'] is None
    assert report.index('## Targets') < report.index('## Parts') < report.index('## Kernels')


SAVING_PARTS = ('kernels', 'model', 'profile', 'serving', 'oft')


def test_each_measuring_part_saves_as_it_goes_and_its_last_save_is_its_whole_data(
    dry_run_outputs,
):
    _, results, _, workdir = dry_run_outputs
    for name in SAVING_PARTS:
        saved = json.loads((workdir / f'{name}.partial.json').read_text())
        assert saved == results['parts'][name]['data'], name
        assert 'partial' not in results['parts'][name]  # it ended ok: its data is whole
    assert not (workdir / 'environment.partial.json').exists()
    assert not list(workdir.glob('.*.tmp'))  # every save was renamed into place


def _cut_short(data: dict) -> dict:
    """Each saving part's data as it saves it partway: kernels before the sweep, the model
    after one robot count, the profile after one step, serving during its first search, oft
    after its one-robot pass."""
    kernels = {**data['kernels'], 'rows': data['kernels']['rows'][:1]}
    kernels['sweep'] = {'rows': [], 'skipped': [], 'verdicts': []}
    model = {**data['model'], 'batches': data['model']['batches'][:1]}
    profile = {**data['profile'], 'steps': data['profile']['steps'][:1]}
    serving = {**data['serving'], 'points': data['serving']['points'][:1], 'mixed_points': []}
    serving.update(capacity_separate=None, capacity_mixed=None, max_robots_served=None)
    del serving['bound_share_served']
    oft = {**data['oft'], 'steps': data['oft']['steps'][:1]}
    del oft['capacity'], oft['crop_ms_per_image']
    return {
        'kernels': kernels, 'model': model, 'profile': profile, 'serving': serving, 'oft': oft,
    }  # fmt: skip


def test_parts_stopped_partway_keep_their_sections_and_targets_marked_partial(dry_run, tmp_path):
    _, results, _ = dry_run
    data = {name: e['data'] for name, e in results['parts'].items()}
    stopped = json.loads(json.dumps(results))
    for name, partial in _cut_short(data).items():
        stopped['parts'][name] = {
            'status': 'timed out', 'seconds': 12.5, 'limit_s': 12.5, 'output_tail': ['...'],
            'partial': partial,
        }  # fmt: skip
    report.write_outputs(tmp_path, stopped)
    text = (tmp_path / 'report.md').read_text()
    assert text.count('**partial (the part ran out of time after 12.5 s)**') == 5
    for heading in ('## Kernels', '## Model', '## Profile', '## Serving', '## OpenVLA-OFT'):
        assert heading in text
    assert 'none found yet with mixed passes (its search did not end)' in text
    assert 'No window measured.' in text and 'Launch configs' not in text
    rows = {t['key']: t for t in json.loads((tmp_path / 'results.json').read_text())['targets']}
    assert (
        rows['decode_step_1']['value'] == data['model']['batches'][0]['graphs']['decode_step_ms']
    )
    assert rows['step_batch']['value'] is None  # the second robot count was not reached
    assert rows['capacity_separate']['value'] is None
    assert rows['oft_step_1']['value'] is not None and rows['oft_step_batch']['value'] is None
    assert rows['oft_capacity']['value'] is None
    assert rows['engine_step_1']['value'] is not None  # the 1-robot window was saved
    assert all(t['partial'] for t in rows.values())
    assert text.count('(from a partial part: it stopped before its end)') == len(rows)


def _model_partial() -> dict:
    """The model part's data as it saves it after its first robot count."""
    times = {'prefill_ms': 3.0, 'decode_step_ms': 1.5, 'step_ms': 12.0}
    return {
        'preset': 'openvla-tiny', 'device': 'cpu', 'dtype': 'float32', 'reps': 1,
        'prompt_tokens': 280, 'num_action_tokens': 7, 'decoder_params_m': 0.5,
        'graphs_runner': 'padded paths, no graphs', 'batches': [
            {'robots': 1, 'eager': times, 'graphs': times, 'transformers': times,
             'graphs_equal_eager_share': 1.0, 'eager_equal_transformers_share': 1.0,
             'graphs_equal_transformers_share': 1.0},
        ],
        'logits': {'max_relative_error': 1e-6, 'top1_equal': True, 'top5_overlap': 5},
    }  # fmt: skip


def test_a_part_that_saved_partial_data_then_hung_ends_timed_out_and_keeps_it(tmp_path):
    partial = _model_partial()
    (tmp_path / 'partial.json').write_text(json.dumps(partial))
    out = tmp_path / 'out'
    done = _run(
        out,
        *('--parts', 'model', '--limit', 'model=6'),
        *('--inject-partial', f'model={tmp_path / "partial.json"}'),
    )
    results = json.loads((out / 'results.json').read_text())
    entry = results['parts']['model']
    assert entry['status'] == 'timed out'
    assert 'saved partial data' in '\n'.join(entry['output_tail'])
    assert entry['partial'] == partial and 'data' not in entry
    assert done.returncode == 1  # a partial part did not end ok
    assert 'kept its partial data' in done.stdout
    text = (out / 'report.md').read_text()
    assert '| model | timed out |' in text and 'partial data kept' in text
    model_section = text[text.index('## Model (') :]
    assert model_section.splitlines()[2].startswith('**partial (the part ran out of time after ')
    assert '| 1 | graphs | 3.00 | 1.50 | 12.00 |' in model_section
    (target,) = [t for t in results['targets'] if t['key'] == 'decode_step_1']
    assert (target['value'], target['partial']) == (1.5, True)
    assert '| decode step, 1 request, CUDA graph (from a partial part' in text


def test_a_run_stopped_while_a_part_runs_keeps_what_that_part_saved(tmp_path):
    """As bench/gpu_check.sh's overall timeout stops it: SIGTERM once the part has saved."""
    partial = _model_partial()
    (tmp_path / 'partial.json').write_text(json.dumps(partial))
    out, workdir = tmp_path / 'out', tmp_path / 'work'
    argv = ['--out', str(out), '--dry-run', '--workdir', str(workdir), '--parts', 'model']
    argv += ['--inject-partial', f'model={tmp_path / "partial.json"}']
    driver = subprocess.Popen(
        [sys.executable, '-m', 'bench.gpu_check', *argv],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        for line in driver.stdout:
            if 'saved partial data' in line:
                break
        driver.send_signal(signal.SIGTERM)
        driver.communicate(timeout=60)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    assert driver.returncode == 128 + signal.SIGTERM
    entry = json.loads((out / 'results.json').read_text())['parts']['model']
    assert entry['status'] == 'timed out' and entry['why'] == 'stopped with the whole run'
    assert entry['partial'] == partial
    text = (out / 'report.md').read_text()
    assert '**partial (the part ran out of time; stopped with the whole run)**' in text


def test_a_hanging_part_is_stopped_at_its_limit_and_the_next_part_still_runs(tmp_path):
    done = _run(
        tmp_path,
        *('--parts', 'environment', 'checkpoint'),
        *('--inject-hang', 'environment', '--limit', 'environment=3'),
    )
    results = json.loads((tmp_path / 'results.json').read_text())
    parts = results['parts']
    assert parts['environment']['status'] == 'timed out'
    assert 'hanging on purpose' in '\n'.join(parts['environment']['output_tail'])
    assert parts['checkpoint']['status'] == 'ok'
    assert parts['model'] == {'status': 'skipped', 'why': 'not selected (--parts)'}
    assert done.returncode == 1  # a part that did not end ok fails the run
    assert '| environment | timed out |' in (tmp_path / 'report.md').read_text()


def test_parts_that_read_the_checkpoint_are_skipped_with_why_when_it_is_missing(tmp_path):
    done = _run(tmp_path, '--parts', 'engine_core')
    parts = json.loads((tmp_path / 'results.json').read_text())['parts']
    assert parts['engine_core']['status'] == 'skipped'
    assert 'checkpoint' in parts['engine_core']['why']
    assert done.returncode == 0


def test_hidden_modules_cannot_be_imported_but_their_metadata_still_reads():
    code = (
        'import importlib.metadata, importlib.util\n'
        'from bench.gpu_check.isolation import hide_modules\n'
        "hide_modules(('numpy',))\n"
        "assert importlib.util.find_spec('numpy') is None\n"
        "assert importlib.metadata.version('numpy')\n"
        'try:\n'
        '    import numpy\n'
        'except ModuleNotFoundError:\n'
        "    print('hidden')\n"
    )
    done = subprocess.run([sys.executable, '-c', code], cwd=ROOT, capture_output=True, text=True)
    assert done.stdout.strip() == 'hidden', done.stderr
