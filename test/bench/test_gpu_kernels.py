"""bench.gpu_kernels runs end to end on the CPU in its dry-run mode."""

from __future__ import annotations

import pytest
import torch

from bench import gpu_kernels


def test_dry_run_checks_every_kernel_and_writes_one_row_per_shape(tmp_path, capsys):
    report_path = tmp_path / 'kernels.md'
    assert gpu_kernels.main(['--dry-run', '--out', str(report_path)]) == 0
    report = report_path.read_text()
    assert report.strip() == capsys.readouterr().out.strip()
    rows = [line for line in report.splitlines() if line.startswith('| ') and '---' not in line]
    kernels = [row.split('|')[1].strip() for row in rows[1:]]
    assert kernels == ['decode'] * 4 + ['extend'] * 2 + ['store_kv']
    assert 'Checked against the float32 reference: decode and extend' in report


def test_bench_plan_rejects_heads_that_do_not_group():
    with pytest.raises(ValueError, match='multiple of num_kv_heads'):
        gpu_kernels.BenchPlan(torch.device('cpu'), torch.float32, 6, 4, 64, 16)


def test_check_close_raises_when_the_kernel_drifts_from_the_reference():
    expected = torch.ones(4, dtype=torch.bfloat16)
    gpu_kernels.check_close('same', expected.clone(), expected)
    with pytest.raises(AssertionError, match=r'drifted: relative error \S+ exceeds 2e-02'):
        gpu_kernels.check_close('drifted', expected * 1.1, expected)
