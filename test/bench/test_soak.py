"""The engine soak, in-process: every step ends exactly once, the core's holdings stay
bounded, and the probe's invariant checks and memory tracing report what they saw."""

from __future__ import annotations

import importlib
import json

import pytest

pytestmark = pytest.mark.slow


def _soak():
    """``bench.soak``, imported when a test runs."""
    return importlib.import_module('bench.soak')


def test_a_short_soak_loses_no_step_and_holds_only_what_its_robots_need():
    soak = _soak()
    config = soak.SoakConfig(num_robots=3, num_steps=300, warmup_steps=60, integrity_every=20,
                             image_size=16, kv_pool_tokens=1024,
                             transport='inprocess')  # fmt: skip
    result = soak.run_soak(config)
    assert result.passed, soak.report(result)
    assert result.num_lost == 0
    assert result.num_steps_sent == 300
    assert result.num_results + result.num_failures == 300
    assert result.num_integrity_checks >= 300 // 20 // 2 and result.num_integrity_failures == 0
    held = result.held
    assert held['sessions'] == held['metrics_robots'] == 3  # per robot, not per step
    assert held['live_requests'] == held['in_flight_robots'] == held['request_kv'] == 0
    assert held['feature_cache_entries'] <= 64
    assert held['radix_nodes'] <= 1024 // 16 + 1
    assert result.rss_start_kb > 0 and result.rss_end_kb > 0  # measured, not judged


def test_a_traced_soak_names_the_lines_that_hold_memory():
    soak = _soak()
    config = soak.SoakConfig(num_robots=2, num_steps=40, warmup_steps=10, integrity_every=10,
                             image_size=16, kv_pool_tokens=1024, transport='inprocess',
                             trace_frames=3)  # fmt: skip
    result = soak.run_soak(config)
    assert result.passed, soak.report(result)
    memory = result.engine_memory
    assert memory['traced_kb_warm'] > 0 and memory['traced_kb_end'] > 0
    for site in memory['top_growth']:
        assert site['size_diff_kb'] > 0 and site['stack'][-1] == site['site']


def test_the_soak_command_writes_its_result_as_json(tmp_path):
    out = tmp_path / 'soak.json'
    status = _soak().main(['--transport', 'inprocess', '--robots', '2', '--steps', '40',
                           '--warmup', '10', '--integrity-every', '10', '--image-size', '16',
                           '--json', str(out)])  # fmt: skip
    assert status == 0
    result = json.loads(out.read_text())
    assert result['num_steps_sent'] == 40 and result['num_lost'] == 0
    assert result['num_integrity_checks'] >= 4
    assert {'rss_start_kb', 'rss_warm_kb', 'rss_end_kb'} <= result.keys()
