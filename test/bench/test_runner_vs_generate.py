"""bench.runner_vs_generate: our runner against transformers generate, on the tiny OpenVLA
on the CPU (the prepared GPU run's model part runs the same code on openvla-7b)."""

from __future__ import annotations

import json

import pytest

from bench import runner_vs_generate


def test_the_plan_picks_the_preset_and_dtype_of_its_device():
    args = runner_vs_generate.parse_args(['--device', 'cuda'])
    plan = runner_vs_generate.plan_from_args(args)
    assert (plan.preset, str(plan.dtype), plan.batch_sizes) == (
        'openvla-7b',
        'torch.bfloat16',
        (1, 16),
    )
    plan = runner_vs_generate.plan_from_args(runner_vs_generate.parse_args([]))
    assert (plan.preset, str(plan.dtype), plan.batch_sizes) == (
        'openvla-tiny',
        'torch.float32',
        (1, 8),
    )
    with pytest.raises(ValueError, match='device'):
        runner_vs_generate.ComparePlan(device='mps')
    with pytest.raises(ValueError, match='batch size'):
        runner_vs_generate.ComparePlan(batch_sizes=(0,))


@pytest.mark.slow
def test_a_cpu_run_compares_every_engine_and_sets_one_robot_against_the_floor(tmp_path, capsys):
    out, md = tmp_path / 'model.json', tmp_path / 'model.md'
    argv = ['--reps', '1', '--batch-sizes', '1', '2', '--json', str(out), '--markdown', str(md)]
    assert runner_vs_generate.main(argv) == 0
    result = json.loads(out.read_text())
    assert result['preset'] == 'openvla-tiny' and result['prompt_tokens'] == 280
    assert result['logits']['max_relative_error'] < 1e-3 and result['logits']['top1_equal']
    assert [b['robots'] for b in result['batches']] == [1, 2]
    for batch in result['batches']:
        for engine in runner_vs_generate.ENGINES:
            assert batch[engine]['prefill_ms'] > 0 and batch[engine]['step_ms'] > 0
        for share in ('graphs_equal_eager_share', 'eager_equal_transformers_share'):
            assert 0.0 <= batch[share] <= 1.0
    floor = result['floor']
    assert floor['step_ms'] == pytest.approx(floor['prefill_ms'] + 6 * floor['decode_ms'])
    assert result['runner_step_over_floor'] > 0
    report = md.read_text()
    assert report in capsys.readouterr().out
    assert '| 2 | transformers |' in report and 'One robot, "graphs" / floor:' in report
