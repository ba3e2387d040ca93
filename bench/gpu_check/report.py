"""The run's report: ``report.md`` (issue 22's targets and OpenVLA-OFT's information rows, a
table of the parts, each part's section) and ``results.json`` (every number, the targets
under ``targets``), rewritten after every part.

A part that did not end ok but saved data on the way (its entry's ``partial``) still has its
section, rendered from that data under its heading and marked as partial."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.gpu_check import builds, environment, targets
from bench.gpu_check.json_files import json_text, write_whole
from bench.gpu_check.parts import PART_NAMES, part_module
from bench.lib.tables import cell, markdown_table

SECTION_PARTS = (
    'kernels', 'model', 'profile', 'engine_core', 'serving', 'oft', 'scheduler', 'pi0',
    'smolvla',
)  # fmt: skip
ENDED = {'timed out': 'ran out of time', 'failed': 'failed'}


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
        note = f'partial data kept; {note}' if 'partial' in e else note
        seconds = cell(e['seconds'], digits=1) if 'seconds' in e else '-'
        limit = cell(e['limit_s'], digits=0) if 'limit_s' in e else '-'
        rows.append([name, e['status'], seconds, limit, note.replace('|', '/')[:160]])
    lines.append(markdown_table(['part', 'status', 'seconds', 'limit s', 'note'], rows))
    launched = {
        name: parts[name]['data']['launched_kernel_builds']
        for name in PART_NAMES
        if 'launched_kernel_builds' in parts.get(name, {}).get('data', {})
    }
    if env.get('kernel_builds') or launched:
        lines += ['', *builds.markdown_lines(env.get('kernel_builds', {}), launched)]
    for name in SECTION_PARTS:
        entry = parts.get(name, {})
        if entry.get('data'):
            lines += ['', *part_module(name).section(entry['data'])]
        elif entry.get('partial'):
            lines += ['', *partial_section(name, entry)]
    return '\n'.join(lines) + '\n'


def partial_mark(entry: dict[str, Any]) -> str:
    """What a partial section says of itself, e.g. "partial (the part ran out of time after
    120.0 s)"."""
    ended = ENDED.get(entry['status'], entry['status'])
    after = f' after {entry["seconds"]:.1f} s' if 'seconds' in entry else ''
    why = f'; {entry["why"]}' if entry.get('why') else ''
    return f'partial (the part {ended}{after}{why})'


def partial_section(name: str, entry: dict[str, Any]) -> list[str]:
    """Part ``name``'s section from the data it saved before it stopped: its heading, the
    mark, then the rest. A part may stop between any two saves, so data its ``section``
    cannot render is named, not raised (the report must still be written)."""
    mark = f'**{partial_mark(entry)}**: what the part measured before it stopped.'
    try:
        lines = part_module(name).section(entry['partial'])
    except (KeyError, IndexError, TypeError, ValueError) as error:
        heading = f'## {name} (partial)'
        why = f'{type(error).__name__}: {error}'
        return [heading, '', mark, f'Its section could not be rendered from it ({why}); the '
                f'data is under `parts.{name}.partial` in results.json.']  # fmt: skip
    if lines and lines[0].startswith('#'):
        return [lines[0], '', mark, *lines[1:]]
    return [mark, '', *lines]


def write_outputs(out: Path, results: dict) -> None:
    """Rewrite results.json and report.md (each through a temporary file and a rename)."""
    results['targets'] = targets.issue_targets(results)
    write_whole(out / 'results.json', json_text(results))
    write_whole(out / 'report.md', report_markdown(results))
