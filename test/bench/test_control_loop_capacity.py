"""``python -m bench.control_loop --capacity`` through ROS, tiny: the node with each engine
core is searched, the search stops as told, and both reports give each system's capacity
and 1-robot latency."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # seconds or more: not in the fast tier

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.ros
@pytest.mark.slow
def test_the_capacity_search_serves_each_system_and_reports_its_capacity(tmp_path):
    out, md = tmp_path / 'capacity.json', tmp_path / 'capacity.md'
    cmd = [sys.executable, '-m', 'bench.control_loop', '--capacity']
    cmd += ['--robots', '1', '2', '--max-failures-in-row', '1', '--warmup', '0.5']
    cmd += ['--duration', '2', '--json', str(out), '--markdown', str(md)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=280, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    record = json.loads(out.read_text())
    assert record['mode'] == 'capacity' and len(record['load_average_start']) == 3
    searches = {s['system']: s for s in record['searches']}
    assert set(searches) == {'scheduled', 'sequential'}
    for search in searches.values():
        counts = [step['num_robots'] for step in search['steps']]
        passed = [not step['failures'] for step in search['steps']]
        assert counts[0] == 1 and counts == sorted(counts)
        assert all(passed[:-1])  # one failure stops the search
        assert search['capacity'] == max(
            (n for n, ok in zip(counts, passed, strict=True) if ok), default=0
        )
    points = {(p['system'], p['num_robots']) for p in record['points']}
    assert points == {(s, step['num_robots']) for s in searches for step in searches[s]['steps']}
    report = md.read_text()
    assert report.startswith('Capacity through ROS: robots at 10 Hz')
    for system, search in searches.items():
        assert f'| {system} | {search["capacity"]} |' in report
    assert '| system | robots | rate | on time | p50 ms | p99 ms | verdict |' in report
    assert '1 robot p50 ms' in proc.stdout
