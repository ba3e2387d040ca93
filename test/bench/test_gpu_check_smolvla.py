"""The prepared GPU run's smolvla part: SmolVLA's step shape (every parameter counted once,
in the pass that reads it), the part's dry run on the CPU and its report section."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.gpu_check import smolvla
from bench.lib.smolvla_cost import smolvla_shape

pytestmark = pytest.mark.slow  # seconds or more: not in the fast tier

ROOT = Path(__file__).resolve().parents[2]


def test_every_parameter_is_counted_once_in_the_pass_that_reads_it(tmp_path):
    from vla_sched.model.families.smolvla.checkpoint import read_smolvla_spec
    from vla_sched.model.families.smolvla.weights import load_smolvla_model
    from vla_sched.testing.smolvla_writer import write_smolvla_checkpoint

    folder = write_smolvla_checkpoint(tmp_path / 'tiny', seed=0)
    spec = read_smolvla_spec(folder, vlm_folder=folder / 'vlm')
    model = load_smolvla_model(folder, spec)
    shape = smolvla_shape(model, num_images=2, prefix_len=20, chunk_size=4, num_steps=3)
    embed = model.language.embed_tokens.weight.numel()
    connector = model.connector.weight.numel()
    tower = sum(p.numel() for p in model.vision_tower.parameters())
    total = sum(p.numel() for p in model.parameters()) - embed
    # The connector counts per token: 1 / scale ** 2 of it per patch.
    assert shape.vision_params == tower + connector // spec.sizes.scale_factor**2
    assert shape.language_params + shape.expert_params + tower + connector == total
    cross_kv = sum(
        model.expert[i].self_attn.k_proj.weight.numel() * 2 for i in spec.sizes.cross_layers
    )
    assert cross_kv > 0
    expert = sum(p.numel() for p in model.expert.parameters())
    assert shape.expert_params + cross_kv > expert  # the cross K/V are the prefix's
    assert shape.num_image_tokens == (spec.image_size // spec.sizes.vision.patch_size) ** 2
    assert shape.suffix_len == 4 and shape.prefix_len == 20


def test_the_part_dry_run_checks_times_and_bisects_the_padded_core_on_the_cpu(tmp_path):
    out = tmp_path / 'out'
    argv = [sys.executable, '-m', 'bench.gpu_check', '--out', str(out), '--dry-run', '--parts',
            'smolvla', '--budget-s', '900', '--workdir', str(tmp_path / 'work')]  # fmt: skip
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:]
    entry = json.loads((out / 'results.json').read_text())['parts']['smolvla']
    assert entry['status'] == 'ok'
    data = entry['data']
    assert (data['num_images'], data['prompt_len']) == (2, 6)
    assert data['prefix_len'] == 2 * 4 + 6 + 1  # the tiny tower's 4 tokens a camera, the state
    assert data['check']['passed'] and [r['robots'] for r in data['check']['rows']] == [1, 2]
    assert [s['robots'] for s in data['steps']] == [1, 2]
    for step in data['steps']:  # the padded passes (eager on the CPU), none plain
        assert step['path'] == 'graphs' and step['padding']['denoise']['num_eager_runs'] == 0
        assert step['padding']['denoise']['num_real'] == 2 * step['robots'] * data['num_steps']
        assert step['padding']['prefix']['num_padded_runs'] >= 2
        assert step['padding']['vision']['num_eager_runs'] == 0  # the tower padded too
        assert 'over_sglang' not in step
    eager = data['eager_step']['padding']
    assert eager['denoise']['num_padded_runs'] == 0
    capacity = data['capacity']
    assert capacity['capacity'] == 2 and capacity['max_robots'] == 2
    assert [p['num_robots'] for p in capacity['points']] == [1, 2]  # the top right after 1
    assert capacity['padding']['denoise']['num_eager_runs'] == 0
    report = (out / 'report.md').read_text()
    assert '## SmolVLA (tiny (dry run) sizes, random weights; 2 cameras, chunks of 4' in report
    again = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and 'reused' in again.stdout


def _section_data() -> dict:
    floor = {'step_ms': 1.0, 'prefix_ms': 0.53, 'denoise_ms': 0.05}
    padding = {'denoise': {'num_padded_runs': 10, 'num_eager_runs': 0, 'padding_share': 0.0}}
    eager = {'denoise': {'num_padded_runs': 0, 'num_eager_runs': 10, 'padding_share': 0.0}}
    return {
        'sizes': 'real', 'num_images': 2, 'chunk_size': 50, 'num_steps': 10,
        'dtype': 'bfloat16', 'cuda_graphs': True, 'folder_made_s': 12.0, 'folder_reused': False,
        'load_s': 6.0, 'prefix_len': 135, 'prompt_len': 6, 'step_tflop_per_robot': 0.5,
        'period_s': 0.1, 'lerobot_async_ms': 104.0, 'robots_bound': 151.2,
        'check': {'tolerance': 5e-2, 'passed': True,
                  'rows': [{'robots': 1, 'max_relative_error': 1e-3}]},
        'steps': [{'robots': 1, 'path': 'graphs', 'step_ms': 8.0, 'floor': floor,
                   'over_floor': 8.0, 'padding': padding}],
        'eager_step': {'robots': 1, 'path': 'eager', 'step_ms': 40.0, 'floor': floor,
                       'over_floor': 40.0, 'padding': eager},
        'capacity': {'period_s': 0.1, 'deadline_ms': 100.0, 'warmup_s': 0.5, 'duration_s': 1.5,
                     'criteria': 'the rule', 'max_robots': 32, 'points': [], 'capacity': 32},
    }  # fmt: skip


def test_the_section_shows_the_steps_against_their_floor_with_the_eager_step():
    text = '\n'.join(smolvla.section(_section_data()))
    assert text.startswith('## SmolVLA (real sizes, random weights; 2 cameras, chunks of 50')
    assert 'allows 151 robots at 10 Hz' in text and '104 ms a step' in text
    lines = text.splitlines()
    one = lines.index('| 1 | CUDA graphs | 8.00 | 1.00 | 0.53 | 0.05 | 8.00x | 0.0% |')
    assert lines[one + 1] == '| 1 | eager | 40.00 | 1.00 | 0.53 | 0.05 | 40.00x | - |'
    assert '**32** robots' in text


def test_the_section_renders_a_part_stopped_before_its_steps():
    data = _section_data()
    for key in ('check', 'eager_step', 'capacity'):
        del data[key]
    data['steps'] = []
    text = '\n'.join(smolvla.section(data))
    assert 'CUDA graphs on)' in text and '| robots' not in text and 'Capacity' not in text
