"""The engine soak through the real transport: an engine process started as the node starts
it, steps over ZMQ, every step answered exactly once, both processes' memory measured."""

from __future__ import annotations

import importlib
import json
import os

import pytest

pytestmark = pytest.mark.slow

RSS_FIELDS = ('rss_start_kb', 'rss_warm_kb', 'rss_end_kb', 'rss_fit_kb_per_step',
              'client_rss_start_kb', 'client_rss_warm_kb', 'client_rss_end_kb',
              'client_rss_fit_kb_per_step')  # fmt: skip


def _soak():
    """``bench.soak``, imported when a test runs."""
    return importlib.import_module('bench.soak')


def test_a_soak_through_zmq_answers_every_step_once_and_reports_both_processes_rss(tmp_path):
    out = tmp_path / 'soak.json'
    status = _soak().main(['--transport', 'zmq', '--robots', '4', '--steps', '240',
                           '--warmup', '80', '--integrity-every', '20', '--image-size', '16',
                           '--json', str(out)])  # fmt: skip
    result = json.loads(out.read_text())
    assert status == 0, result
    assert result['transport'] == 'zmq' and result['stopped_early'] == ''
    assert result['num_steps_sent'] == 240 and result['num_lost'] == 0
    assert result['num_results'] + result['num_failures'] == 240
    assert result['num_bad_results'] == 0
    assert result['num_integrity_checks'] >= 240 // 20 // 2
    assert result['num_integrity_failures'] == 0
    assert result['engine_pid'] not in (0, os.getpid())  # the engine ran in its own process
    assert result['num_engine_stats'] >= 1
    assert result['held']['sessions'] == 4
    for name in RSS_FIELDS:
        assert isinstance(result[name], float), name  # measured, not judged
    assert result['rss_samples_kb'] and result['client_rss_samples_kb']
