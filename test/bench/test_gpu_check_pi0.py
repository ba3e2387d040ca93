"""The prepared GPU run's pi0 part: the floor of a step (each pass the longer of its FLOPs
and its weights), pi0.5's shape at real sizes, the part's dry run on the CPU and its report
section."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.gpu_check import pi0
from bench.lib.device_timing import MeasuredRates
from bench.lib.pi0_cost import Pi0Shape, pi0_step_floor, robots_at_period

pytestmark = pytest.mark.slow  # seconds or more: not in the fast tier

ROOT = Path(__file__).resolve().parents[2]
H200 = MeasuredRates(4138.8, 753.5, 'bfloat16')  # run B's rates


def _shape(**changes) -> Pi0Shape:
    fields = dict(
        language_params=1000, vision_params=100, expert_params=50, language_bytes=2000,
        vision_bytes=400, expert_bytes=100, num_images=2, num_image_tokens=4, prefix_len=20,
        suffix_len=3, num_steps=10,
    )  # fmt: skip
    return Pi0Shape(**{**fields, **changes})


def test_a_step_is_a_prefix_pass_then_each_denoising_pass_each_the_longer_of_flops_and_bytes():
    shape = _shape()
    # prefix: 2 x 1000 x 20 positions + 2 images x 2 x 100 x 4 patches; suffix 2 x 50 x 3
    assert shape.prefix_flops == 40_000 + 1_600 and shape.suffix_flops == 300
    assert shape.step_flops == 41_600 + 10 * 300
    rates = MeasuredRates(copy_gb_per_s=1e-6, matmul_tflops=1e-9, matmul_dtype='bfloat16')
    one = pi0_step_floor(shape, rates, 1)  # 1000 FLOP/s, 1000 B/s
    assert one.prefix_ms == pytest.approx(41_600.0)  # FLOP-bound: 2400 bytes take 2400 ms
    assert one.denoise_ms == pytest.approx(300.0)  # FLOP-bound against 100 ms of weights
    assert one.step_ms == pytest.approx(41_600.0 + 10 * 300.0)
    slow_copy = MeasuredRates(copy_gb_per_s=1e-8, matmul_tflops=1e-9, matmul_dtype='bfloat16')
    weights_bound = pi0_step_floor(shape, slow_copy, 1)  # 10 B/s: every pass reads its weights
    assert weights_bound.prefix_ms == pytest.approx(240_000.0)
    assert weights_bound.denoise_ms == pytest.approx(10_000.0)
    batched = pi0_step_floor(shape, rates, 4)  # the FLOPs grow with the robots, not the bytes
    assert batched.prefix_ms == pytest.approx(4 * 41_600.0)
    assert batched.denoise_ms == pytest.approx(1_200.0)
    assert robots_at_period(shape, rates, 100.0) == pytest.approx(100_000 / 44_600)
    with pytest.raises(ValueError, match='num_robots'):
        pi0_step_floor(shape, rates, 0)
    with pytest.raises(ValueError, match='prefix_len'):
        _shape(prefix_len=0)


def test_pi05_at_real_sizes_is_flop_bound_in_its_prefix_and_byte_bound_in_its_passes():
    """The real model's parameter counts (Gemma 2B without its embedding, SigLIP So400m and
    the projector in float32, the 300M expert and pi0.5's projections) for two cameras and
    a 143-token prompt, as the part measures them."""
    language = 18 * (2048 * (2048 + 2 * 256) + 2048 * 2048 + 3 * 2048 * 16384 + 2 * 2048) + 2048
    expert_layers = 18 * (1024 * 2048 + 2 * 1024 * 256 + 2048 * 1024 + 3 * 1024 * 4096)
    expert_norms = (2 * 18 + 1) * (1024 * 3 * 1024 + 3 * 1024)
    heads = 2 * (32 * 1024 + 1024) + 2 * (1024 * 1024 + 1024) - 1024 + 32
    vision = 428_000_000
    shape = Pi0Shape(
        language_params=language, vision_params=vision,
        expert_params=expert_layers + expert_norms + heads, language_bytes=2 * language,
        vision_bytes=4 * vision, expert_bytes=2 * (expert_layers + expert_norms) + 4 * heads,
        num_images=2,
        num_image_tokens=256, prefix_len=512 + 143, suffix_len=50, num_steps=10,
    )  # fmt: skip
    floor = pi0_step_floor(shape, H200, 1)
    assert 2.9 < shape.prefix_flops / 1e12 < 3.1
    assert floor.prefix_ms == pytest.approx(shape.prefix_flops / 753.5e9)  # FLOP-bound
    assert floor.denoise_ms == pytest.approx(shape.expert_bytes / 4138.8e6)  # bytes-bound
    assert 4.5 < floor.step_ms < 7.0 and floor.step_ms < pi0.SGLANG_PI05_H200_P50_MS
    assert 20 < robots_at_period(shape, H200, 0.1) < 30


def test_the_part_dry_run_checks_times_and_bisects_the_padded_core_on_the_cpu(tmp_path):
    out = tmp_path / 'out'
    done = subprocess.run(
        [sys.executable, '-m', 'bench.gpu_check', '--out', str(out), '--dry-run', '--parts',
         'pi0', '--budget-s', '900', '--workdir', str(tmp_path / 'work')],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:]
    results = json.loads((out / 'results.json').read_text())
    entry = results['parts']['pi0']
    assert entry['status'] == 'ok'
    data = entry['data']
    assert (data['num_images'], data['chunk_size'], data['num_steps']) == (2, 50, 10)
    assert data['prompt_len'] > 100  # the 32 discretized state values, a digit a piece
    assert data['check']['passed'] and [r['robots'] for r in data['check']['rows']] == [1, 2]
    assert [s['robots'] for s in data['steps']] == [1, 2]
    for step in data['steps']:  # the padded passes (eager on the CPU), none plain
        assert step['path'] == 'graphs' and step['padding']['denoise']['num_eager_runs'] == 0
        assert step['padding']['denoise']['num_real'] == 2 * step['robots'] * 10
        assert step['padding']['prefix']['num_padded_runs'] >= 2
    eager = data['eager_step']['padding']
    assert eager['denoise']['num_padded_runs'] == 0 and eager['denoise']['num_eager'] == 20
    capacity = data['capacity']
    assert capacity['capacity'] is not None and capacity['max_robots'] == 2
    assert capacity['padding']['denoise']['num_eager_runs'] == 0
    report = (out / 'report.md').read_text()
    assert '## pi0.5 (tiny (dry run) sizes, random weights; 2 cameras, chunks of 50' in report
    again = subprocess.run(
        [sys.executable, '-m', 'bench.gpu_check', '--out', str(out), '--dry-run', '--parts',
         'pi0', '--budget-s', '900', '--workdir', str(tmp_path / 'work')],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert again.returncode == 0 and 'reused' in again.stdout


def _section_data() -> dict:
    floor = {'step_ms': 5.5, 'prefix_ms': 3.7, 'denoise_ms': 0.18}

    def step(robots, path, ms, floor, **more):
        padding = {
            'denoise': {'num_padded_runs': 10, 'num_eager_runs': 0, 'padding_share': 0.0},
            'prefix': {'num_padded_runs': 1, 'num_eager_runs': 0, 'padding_share': 0.1},
        }
        if path == 'eager':
            padding = {
                'denoise': {'num_padded_runs': 0, 'num_eager_runs': 10, 'padding_share': 0.0}
            }
        return {'robots': robots, 'path': path, 'step_ms': ms, 'floor': floor,
                'over_floor': ms / floor['step_ms'], 'padding': padding, **more}  # fmt: skip

    return {
        'policy_type': 'pi05', 'sizes': 'real', 'num_images': 2, 'chunk_size': 50,
        'num_steps': 10, 'dtype': 'bfloat16', 'cuda_graphs': True, 'folder_made_s': 22.0,
        'folder_reused': False, 'load_s': 9.0, 'prefix_len': 655, 'prompt_len': 143,
        'step_tflop_per_robot': 2.9, 'period_s': 0.1, 'sglang_p50_ms': 43.0, 'robots_bound': 26.0,
        'check': {'tolerance': 5e-2, 'passed': True,
                  'rows': [{'robots': 1, 'max_relative_error': 1e-3},
                           {'robots': 16, 'max_relative_error': 2e-3}]},
        'steps': [step(1, 'graphs', 22.0, floor, over_sglang=22.0 / 43.0),
                  step(16, 'graphs', 110.0, {**floor, 'step_ms': 70.0})],
        'eager_step': step(1, 'eager', 80.0, floor, over_graphs=80.0 / 22.0,
                           over_sglang=80.0 / 43.0),
        'capacity': {'period_s': 0.1, 'deadline_ms': 100.0, 'warmup_s': 0.5, 'duration_s': 1.5,
                     'criteria': 'the rule', 'max_robots': 16, 'points': [], 'capacity': None},
    }  # fmt: skip


def test_the_section_shows_the_steps_against_their_floor_and_sglang_with_the_eager_step():
    text = '\n'.join(pi0.section(_section_data()))
    assert text.startswith('## pi0.5 (real sizes, random weights; 2 cameras, chunks of 50')
    assert 'allows 26.0 robots at 10 Hz' in text
    assert 'max relative error 1.00e-03 (1 robots), 2.00e-03 (16 robots)' in text
    lines = text.splitlines()
    one = lines.index('| 1 | CUDA graphs | 22.00 | 5.50 | 3.70 | 0.18 | 4.00x | 0.51x | 0.0% |')
    assert lines[one + 1] == '| 1 | eager | 80.00 | 5.50 | 3.70 | 0.18 | 14.55x | 1.86x | - |'
    assert lines[one + 2].startswith('| 16 | CUDA graphs | 110.00 | 70.00 |')
    assert 'none found yet' in text


def test_the_section_renders_a_part_stopped_before_its_steps():
    data = _section_data()
    for key in ('check', 'eager_step', 'capacity'):
        del data[key]
    data['steps'] = []
    text = '\n'.join(pi0.section(data))
    assert 'CUDA graphs on)' in text and '| robots' not in text and 'Capacity' not in text
