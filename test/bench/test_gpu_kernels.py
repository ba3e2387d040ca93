"""bench.gpu_kernels runs end to end on the CPU in its dry-run mode."""

from __future__ import annotations

import pytest
import torch

from bench import gpu_kernels

pytestmark = pytest.mark.slow  # seconds or more: not in the fast tier


def test_dry_run_checks_every_kernel_and_writes_one_row_per_shape(tmp_path, capsys):
    report_path = tmp_path / 'kernels.md'
    assert gpu_kernels.main(['--dry-run', '--out', str(report_path)]) == 0
    report = report_path.read_text()
    assert report.strip() == capsys.readouterr().out.strip()
    main_table, sweep_table = report.split('### Launch configs against the alternatives')
    rows = [
        line for line in main_table.splitlines() if line.startswith('| ') and '---' not in line
    ]
    assert 'graph ms | launch ms' in rows[0]
    kernels = [row.split('|')[1].strip() for row in rows[1:]]
    assert kernels == ['decode'] * 4 + ['extend'] * 2 + ['store_kv']
    assert 'Checked against the float32 reference: decode and extend' in report
    sweep = [
        line for line in sweep_table.splitlines() if line.startswith('| ') and '---' not in line
    ]
    launches = [(row.split('|')[1].strip(), row.split('|')[4].strip()) for row in sweep[1:]]
    # The rule's launch first for each kernel, then its alternatives, each checked and timed.
    assert [launch for launch in launches if launch[1] == 'rule'] == [
        ('decode', 'rule'), ('extend', 'rule'),
    ]  # fmt: skip
    assert ('extend', 'm64 n64 h1 s1 (before)') in launches
    assert len(launches) == 6
    assert 'decode b=3 ctx=24: fastest of 3 is' in sweep_table
    assert 'extend b=2 ctx=24+6: fastest of 3 is' in sweep_table


def test_sweep_candidates_on_a_gpu_put_the_rule_first_then_every_alternative():
    plan = gpu_kernels.BenchPlan(torch.device('cuda'), torch.bfloat16, 32, 8, 128, 16)
    decode = gpu_kernels.sweep_candidates(plan, 'decode')
    assert decode[0].label == 'rule' and decode[0].config.block_h == 16
    assert [c.num_splits for c in decode[1:5]] == [1, 2, 4, 8]
    assert len(decode) == 9
    extend = gpu_kernels.sweep_candidates(plan, 'extend')
    assert extend[0].label == 'rule' and extend[0].config.heads_per_program == 4
    assert len(extend) == 5


def test_sweep_verdicts_name_the_fastest_launch_and_the_rule_against_the_baseline():
    rows = [
        dict(kernel='decode', batch=32, context='2048', candidate='rule', ms=0.10),
        dict(kernel='decode', batch=32, context='2048', candidate='n32', ms=0.08),
    ]
    (verdict,) = gpu_kernels.sweep_verdicts(rows, {('decode', 32, '2048'): 0.2})
    assert verdict['fastest'] == 'n32'
    assert verdict['rule_over_fastest'] == pytest.approx(1.25)
    assert verdict['rule_over_baseline'] == pytest.approx(0.5)


def test_bench_plan_rejects_heads_that_do_not_group():
    with pytest.raises(ValueError, match='multiple of num_kv_heads'):
        gpu_kernels.BenchPlan(torch.device('cpu'), torch.float32, 6, 4, 64, 16)


def test_check_close_raises_when_the_kernel_drifts_from_the_reference():
    expected = torch.ones(4, dtype=torch.bfloat16)
    gpu_kernels.check_close('same', expected.clone(), expected)
    with pytest.raises(AssertionError, match=r'drifted: relative error \S+ exceeds 2e-02'):
        gpu_kernels.check_close('drifted', expected * 1.1, expected)
