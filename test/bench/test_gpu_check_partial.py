"""What a part of the prepared GPU run saves on the way (``PartContext.save_partial``) and how
the report and the targets read a part that stopped before its end."""

from __future__ import annotations

import json
from pathlib import Path

from bench.gpu_check import report, targets
from bench.gpu_check.parts import PartContext, partial_file_of


def _context(partial_file: Path | None) -> PartContext:
    return PartContext(dry_run=True, workdir=Path('.'), prior={}, partial_file=partial_file)


def test_each_save_replaces_the_last_whole_beside_the_result_file(tmp_path):
    partial_file = partial_file_of(tmp_path / 'serving.json')
    assert partial_file == tmp_path / 'serving.partial.json'
    ctx = _context(partial_file)
    ctx.save_partial({'points': [{'num_robots': 1}], 'where': tmp_path})
    ctx.save_partial({'points': [{'num_robots': 1}, {'num_robots': 10}], 'pair': (1, 2)})
    saved = json.loads(partial_file.read_text())
    assert saved == {'points': [{'num_robots': 1}, {'num_robots': 10}], 'pair': [1, 2]}
    assert [p.name for p in tmp_path.iterdir()] == ['serving.partial.json']  # no temp file


def test_a_context_without_a_partial_file_saves_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _context(None).save_partial({'steps': []})
    assert list(tmp_path.iterdir()) == []


def _results(entry: dict) -> dict:
    return {'started': 'now', 'dry_run': True, 'budget_s': 510.0, 'parts': {'serving': entry}}


def test_a_partial_its_section_cannot_render_is_named_and_the_report_is_still_written(tmp_path):
    entry = {'status': 'failed', 'seconds': 3.5, 'output_tail': ['CUDA error'],
             'partial': {'period_s': 0.1}}  # fmt: skip
    report.write_outputs(tmp_path, _results(entry))
    text = (tmp_path / 'report.md').read_text()
    assert '## serving (partial)' in text
    assert '**partial (the part failed after 3.5 s)**' in text
    assert "could not be rendered from it (KeyError: 'first_probe')" in text
    assert '`parts.serving.partial`' in text


def test_the_whole_run_stopped_reads_as_the_why_of_a_partial_part():
    entry = {'status': 'timed out', 'why': 'stopped with the whole run'}
    assert report.partial_mark(entry) == (
        'partial (the part ran out of time; stopped with the whole run)'
    )


def test_targets_read_a_parts_data_before_its_partial_and_nothing_without_either():
    serving = {'capacity_separate': 12, 'capacity_mixed': None, 'robots_pass_bound': 14.0}
    ok = {'status': 'ok', 'data': serving, 'partial': {'capacity_separate': 3}}
    assert targets.part_data(ok) == (serving, False)
    stopped = {'status': 'timed out', 'partial': serving}
    rows = {t['key']: t for t in targets.issue_targets({'parts': {'serving': stopped}})}
    assert (rows['capacity_separate']['value'], rows['capacity_separate']['met']) == (12, True)
    assert rows['capacity_separate']['partial'] and rows['capacity_mixed']['met'] is None
    assert not rows['decode_step_1']['partial']  # the model part did not run
    failed = {'status': 'failed', 'output_tail': ['CUDA error']}
    assert targets.part_data(failed) == ({}, False)
