"""The engine soak ends every step exactly once and keeps the core's holdings bounded."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def _soak():
    """Import ``bench.soak`` with the repository root on the path (as the script does)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    return importlib.import_module('bench.soak')


def test_a_short_soak_loses_no_step_and_holds_only_what_its_robots_need():
    soak = _soak()
    config = soak.SoakConfig(num_robots=3, num_steps=300, warmup_steps=60, integrity_every=20,
                        image_size=16, kv_pool_tokens=1024)  # fmt: skip
    result = soak.run_soak(config)
    assert result.num_lost == 0
    assert result.num_steps_sent == 300
    assert result.num_results + result.num_failures == 300
    assert result.num_integrity_checks >= 300 // 20
    held = result.held
    assert held['sessions'] == held['metrics_robots'] == 3  # per robot, not per step
    assert held['live_requests'] == held['in_flight_robots'] == held['request_kv'] == 0
    assert held['feature_cache_entries'] <= 64
    assert held['radix_nodes'] <= 1024 // 16 + 1
    assert result.rss_start_kb > 0 and result.rss_end_kb > 0  # measured, not judged


def test_the_soak_command_writes_its_result_as_json(tmp_path):
    out = tmp_path / 'soak.json'
    status = _soak().main(['--robots', '2', '--steps', '40', '--warmup', '10', '--integrity-every',
                   '10', '--image-size', '16', '--json', str(out)])  # fmt: skip
    assert status == 0
    result = json.loads(out.read_text())
    assert result['num_steps_sent'] == 40 and result['num_lost'] == 0
    assert result['num_integrity_checks'] >= 4
    assert {'rss_start_kb', 'rss_warm_kb', 'rss_end_kb'} <= result.keys()
