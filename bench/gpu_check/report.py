"""The run's report: ``report.md`` (issue 22's targets, a table of the parts, each part's
section) and ``results.json`` (every number, the targets under ``targets``), rewritten after
every part."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.gpu_check import environment, targets
from bench.gpu_check.parts import PART_NAMES, part_module
from bench.lib.tables import cell, markdown_table

SECTION_PARTS = ('kernels', 'model', 'profile', 'engine_core', 'serving', 'scheduler')


def report_markdown(results: dict) -> str:
    parts = results['parts']
    title = 'dry run on the CPU (tiny shapes: checks the script, not speed)'
    lines = [f'# GPU check: {title if results["dry_run"] else "GPU run"}', '']
    env = parts.get('environment', {}).get('data', {})
    if env:
        lines.append(environment.summary_line(env))
    lines += [f'Started {results["started"]}, budget {results["budget_s"]:.0f} s.', '']
    lines += [*targets.markdown_lines(results['targets']), '', '## Parts', '']
    rows = []
    for name in PART_NAMES:
        e = parts.get(name, {'status': 'pending'})
        note = e.get('why') or ('; '.join(e['output_tail'][-2:]) if 'output_tail' in e else '')
        seconds = cell(e['seconds'], digits=1) if 'seconds' in e else '-'
        limit = cell(e['limit_s'], digits=0) if 'limit_s' in e else '-'
        rows.append([name, e['status'], seconds, limit, note.replace('|', '/')[:160]])
    lines.append(markdown_table(['part', 'status', 'seconds', 'limit s', 'note'], rows))
    for name in SECTION_PARTS:
        data = parts.get(name, {}).get('data')
        if data:
            lines += ['', *part_module(name).section(data)]
    return '\n'.join(lines) + '\n'


def jsonable(value: Any) -> Any:
    """JSON for what ``json`` cannot write itself (paths, tuples, sets; else the repr)."""
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, tuple | set):
        return list(value)
    return repr(value)


def write_outputs(out: Path, results: dict) -> None:
    """Rewrite results.json and report.md (each through a temporary file and a rename)."""
    results['targets'] = targets.issue_targets(results)
    for name, text in (
        ('results.json', json.dumps(results, indent=1, default=jsonable) + '\n'),
        ('report.md', report_markdown(results)),
    ):
        tmp = out / f'.{name}.tmp'
        tmp.write_text(text)
        tmp.replace(out / name)
