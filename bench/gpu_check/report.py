"""The run's report: ``report.md`` (a table of the parts, the targets, each part's section)
and ``results.json`` (every number), rewritten after every part."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.gpu_check import environment
from bench.gpu_check.parts import PART_NAMES, part_module
from bench.lib.capacity import CapacityCriteria
from bench.lib.tables import cell, markdown_table

SECTION_PARTS = ('kernels', 'model', 'engine_core', 'serving', 'scheduler')


def targets(results: dict) -> list[dict[str, Any]]:
    """The GPU targets against what was measured (None: not measured)."""
    data = {n: e.get('data', {}) for n, e in results['parts'].items()}
    kernels, serving, model = (
        data.get('kernels', {}),
        data.get('serving', {}),
        data.get('model', {}),
    )
    share = kernels.get('decode_worst_copy_share')
    step_over_floor = serving.get('one_robot_step_over_floor')
    runner_over_floor = model.get('runner_step_over_floor')
    served = serving.get('bound_share_served')
    return [
        _target(
            'decode attention, batch >= 32, context >= 2048: worst share of copy bandwidth',
            share, '>= 70%', _ge(share, 0.7), percent=True,
        ),
        _target(
            "one robot's step on the engine core (p50) / floor",
            step_over_floor, '<= 1.5x', _le(step_over_floor, 1.5),
        ),
        _target(
            "one robot's runner step with decode graphs / floor",
            runner_over_floor, '<= 1.5x', _le(runner_over_floor, 1.5),
        ),
        _target(
            f'robots served at 10 Hz ({CapacityCriteria().describe()}) / robots the matmul '
            'rate allows',
            served, '>= 80%', _ge(served, 0.8), percent=True,
        ),
    ]  # fmt: skip


def _le(value, bound) -> bool | None:
    return None if value is None else value <= bound


def _ge(value, bound) -> bool | None:
    return None if value is None else value >= bound


def _target(name: str, value, wanted: str, met, *, percent: bool = False) -> dict[str, Any]:
    return {'target': name, 'value': value, 'wanted': wanted, 'met': met, 'percent': percent}


def _shown(t: dict[str, Any]) -> str:
    value = t['value']
    if value is None:
        return '-'
    return f'{100 * value:.0f}%' if t['percent'] else cell(float(value))


def report_markdown(results: dict) -> str:
    parts = results['parts']
    title = 'dry run on the CPU (tiny shapes: checks the script, not speed)'
    lines = [f'# GPU check: {title if results["dry_run"] else "GPU run"}', '']
    env = parts.get('environment', {}).get('data', {})
    if env:
        lines.append(environment.summary_line(env))
    lines += [f'Started {results["started"]}, budget {results["budget_s"]:.0f} s.', '']
    rows = []
    for name in PART_NAMES:
        e = parts.get(name, {'status': 'pending'})
        note = e.get('why') or ('; '.join(e['output_tail'][-2:]) if 'output_tail' in e else '')
        seconds = cell(e['seconds'], digits=1) if 'seconds' in e else '-'
        limit = cell(e['limit_s'], digits=0) if 'limit_s' in e else '-'
        rows.append([name, e['status'], seconds, limit, note.replace('|', '/')[:160]])
    lines.append(markdown_table(['part', 'status', 'seconds', 'limit s', 'note'], rows))
    met = {True: 'yes', False: 'no', None: 'not measured'}
    target_rows = [[t['target'], _shown(t), t['wanted'], met[t['met']]] for t in targets(results)]
    lines += ['', '## Targets', '']
    lines.append(markdown_table(['target', 'measured', 'wanted', 'met'], target_rows))
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
    results['targets'] = targets(results)
    for name, text in (
        ('results.json', json.dumps(results, indent=1, default=jsonable) + '\n'),
        ('report.md', report_markdown(results)),
    ):
        tmp = out / f'.{name}.tmp'
        tmp.write_text(text)
        tmp.replace(out / name)
