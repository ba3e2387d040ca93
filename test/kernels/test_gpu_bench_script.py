"""bench/gpu_kernels.py runs end to end on the CPU in its dry-run mode."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / 'bench' / 'gpu_kernels.py'


def _load_script():
    name = 'gpu_kernels_bench'
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, SCRIPT)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses resolve annotations through sys.modules
        spec.loader.exec_module(module)
    return sys.modules[name]


def test_dry_run_checks_every_kernel_and_writes_one_row_per_shape(tmp_path, capsys):
    bench = _load_script()
    report_path = tmp_path / 'kernels.md'
    assert bench.main(['--dry-run', '--out', str(report_path)]) == 0
    report = report_path.read_text()
    assert report.strip() == capsys.readouterr().out.strip()
    rows = [line for line in report.splitlines() if line.startswith('| ') and '---' not in line]
    kernels = [row.split('|')[1].strip() for row in rows[1:]]
    assert kernels == ['decode'] * 4 + ['extend'] * 2 + ['store_kv']
    assert 'Checked against the float32 reference: decode and extend' in report


def test_bench_plan_rejects_heads_that_do_not_group():
    bench = _load_script()
    with pytest.raises(ValueError, match='multiple of num_kv_heads'):
        bench.BenchPlan(torch.device('cpu'), torch.float32, 6, 4, 64, 16)


def test_check_close_raises_when_the_kernel_drifts_from_the_reference():
    bench = _load_script()
    expected = torch.ones(4, dtype=torch.bfloat16)
    bench.check_close('same', expected.clone(), expected)
    with pytest.raises(AssertionError, match=r'drifted: relative error \S+ exceeds 2e-02'):
        bench.check_close('drifted', expected * 1.1, expected)
