"""The demo runs the node and simulated robot processes and reports what the robots got."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = [pytest.mark.ros, pytest.mark.slow]


def test_the_demo_prints_a_live_table_and_a_summary_and_exits_zero():
    cmd = [sys.executable, '-m', 'vla_sched.ros.demo', '--robots', '2', '--duration', '6']
    cmd += ['--engine-mode', 'inprocess', '--device', 'cpu']
    cmd += ['--period', '0.5', '--step-budget', '10']
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-3000:]
    assert 'engine ready' in out and 'random weights' in out
    assert '--- t =' in out and '=== summary: 2 robots' in out
    summary = out[out.index('=== summary') :].splitlines()
    rows = {line.split()[0]: line.split() for line in summary if line.startswith('robot_')}
    assert set(rows) == {'robot_0', 'robot_1'}
    # columns: robot, rate, target, p50, p99, misses, chunks, rejected
    assert all(row[2] == '2.00' for row in rows.values())
    assert sum(int(row[6]) for row in rows.values()) > 0
    assert 'action chunks arrived at 2 robots' in out
