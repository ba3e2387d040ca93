"""The run itself: every selected part in order, each in its own process under its share of
the budget; the report rewritten after each part. The same module is the part's process
(``--run-part``), which runs one part and writes its data as JSON."""

from __future__ import annotations

import argparse
import collections
import datetime
import importlib.util
import json
import platform
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.gpu_check.isolation import HIDDEN_MODULES, Progress, hide_modules, run_child
from bench.gpu_check.json_files import json_text, read_json, write_whole
from bench.gpu_check.parts import (
    DEFAULT_BUDGET_S,
    PART_NAMES,
    PARTS,
    Part,
    PartContext,
    part_module,
    partial_file_of,
)
from bench.gpu_check.report import write_outputs


def run_part(
    name: str, *, dry_run: bool, workdir: Path, prior_file: Path, result_file: Path, hang: bool,
    partial_then_hang: Path | None = None,
) -> int:  # fmt: skip
    """The part's process: run part ``name``, write its data as JSON to ``result_file``; what
    it saves on the way (``PartContext.save_partial``) goes beside it."""
    hide_modules(HIDDEN_MODULES)
    prior = json.loads(prior_file.read_text()) if prior_file.exists() else {}
    ctx = PartContext(
        dry_run=dry_run, workdir=workdir, prior=prior, partial_file=partial_file_of(result_file)
    )
    if partial_then_hang is not None:
        ctx.save_partial(json.loads(partial_then_hang.read_text()))
        print(f'{name}: saved partial data, hanging on purpose (--inject-partial)', flush=True)
        hang = True
    if hang:
        print(f'{name}: hanging on purpose (--inject-hang)', flush=True)
        while True:
            time.sleep(3600)
    data = part_module(name).run(ctx)
    residency = sys.modules.get('vla_sched.kernels.residency')
    if residency is not None and residency.launched_builds():
        data['launched_kernel_builds'] = residency.launched_builds()
    write_whole(result_file, json_text(data))
    return 0


def part_limits(budget_s: float, overrides: dict[str, float]) -> dict[str, float]:
    """Each part's limit: its share of the default budget scaled to ``budget_s``."""
    scale = budget_s / DEFAULT_BUDGET_S
    return {p.name: overrides.get(p.name, p.limit_s * scale) for p in PARTS}


def _entry(status: str, **fields: Any) -> dict[str, Any]:
    return {'status': status, **fields}


def result_file_of(workdir: Path, name: str) -> Path:
    return workdir / f'{name}.json'


def keep_partial(entry: dict[str, Any], partial_file: Path) -> None:
    """A part that did not end ok keeps what it saved on the way (``partial``), if anything."""
    partial = read_json(partial_file)
    if partial is not None:
        entry['partial'] = partial


def run_one(
    part: Part, args: argparse.Namespace, results: dict, limit_s: float, workdir: Path, log,
    progress: Progress,
) -> None:  # fmt: skip
    """Run ``part`` (or skip it, saying why) and record its entry in ``results``."""
    parts = results['parts']
    remaining = args.budget_s - progress.elapsed_s()
    limit = min(limit_s, remaining)
    checkpoint_status = parts.get('checkpoint', {}).get('status', 'not run')
    if part.needs_checkpoint and checkpoint_status != 'ok':
        why = f'needs the checkpoint folder; the checkpoint part is {checkpoint_status}'
        parts[part.name] = _entry('skipped', why=why)
    elif limit < 3:
        parts[part.name] = _entry('skipped', why=f'budget spent ({remaining:.0f} s left)')
    else:
        progress.say(f'{part.name}: start, limit {limit:.0f} s')
        parts[part.name] = _entry('running', limit_s=limit)
        prior_file = workdir / 'prior.json'
        prior_file.write_text(json.dumps(parts))
        result_file = result_file_of(workdir, part.name)
        result_file.unlink(missing_ok=True)
        partial_file_of(result_file).unlink(missing_ok=True)
        argv = ['--run-part', part.name, '--workdir', str(workdir)]
        argv += ['--prior', str(prior_file), '--result', str(result_file)]
        argv += ['--dry-run'] if args.dry_run else []
        argv += ['--inject-hang', part.name] if part.name in (args.inject_hang or []) else []
        injected = dict(args.inject_partial or []).get(part.name)
        argv += ['--inject-partial', f'{part.name}={injected}'] if injected else []
        status, seconds, tail = run_child(part.name, argv, limit, log, dry_run=args.dry_run)
        if status == 'ok' and not result_file.exists():
            status, tail = 'failed', [*tail, 'the part wrote no result']
        entry = _entry(status, seconds=seconds, limit_s=limit)
        if status == 'ok':
            entry['data'] = json.loads(result_file.read_text())
        else:
            entry['output_tail'] = tail
            keep_partial(entry, partial_file_of(result_file))
        parts[part.name] = entry
    entry = parts[part.name]
    note = entry.get('why') or (entry['output_tail'][-1] if entry.get('output_tail') else '')
    note += '; kept its partial data' if 'partial' in entry else ''
    took = f' in {entry["seconds"]:.1f} s' if 'seconds' in entry else ''
    progress.say(f'{part.name}: {entry["status"]}{took}{"; " + note if note else ""}')


def _stop(signum, frame) -> None:
    """SIGTERM (the wrapper's overall timeout): end the running part, keep the report."""
    raise SystemExit(128 + signum)


def run_all(args: argparse.Namespace) -> dict[str, Any]:
    """Every selected part in order; writes the report after each."""
    progress = Progress()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    keep_workdir = bool(args.workdir)
    workdir = Path(args.workdir) if keep_workdir else Path(tempfile.mkdtemp(prefix='vla_gpu_'))
    workdir.mkdir(parents=True, exist_ok=True)
    limits = part_limits(args.budget_s, dict(args.limit or []))
    results: dict[str, Any] = {
        'started': datetime.datetime.now().isoformat(timespec='seconds'),
        'dry_run': args.dry_run,
        'budget_s': args.budget_s,
        'host': platform.node(),
        'hidden_modules': list(HIDDEN_MODULES),
        'modules_present_here': {
            m: importlib.util.find_spec(m) is not None for m in HIDDEN_MODULES
        },
        'parts': {},
    }
    selected = [p for p in PARTS if p.name in (args.parts or PART_NAMES)]
    for part in PARTS:
        if part not in selected:
            results['parts'][part.name] = _entry('skipped', why='not selected (--parts)')
    progress.say(
        f'gpu_check: {len(selected)} parts, budget {args.budget_s:.0f} s, '
        f'work dir {workdir}, out {out}'
    )
    write_outputs(out, results)
    signal.signal(signal.SIGTERM, _stop)
    try:
        with open(out / 'gpu_check.log', 'a') as log:
            for part in selected:
                run_one(part, args, results, limits[part.name], workdir, log, progress)
                write_outputs(out, results)
    finally:
        for part in PARTS:
            entry = results['parts'].get(part.name)
            if entry is None:
                results['parts'][part.name] = _entry('skipped', why='the run was stopped first')
            elif entry['status'] == 'running':
                entry.update(status='timed out', why='stopped with the whole run')
                keep_partial(entry, partial_file_of(result_file_of(workdir, part.name)))
        results['seconds'] = progress.elapsed_s()
        write_outputs(out, results)
        if not keep_workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    counts = collections.Counter(e['status'] for e in results['parts'].values())
    progress.say('gpu_check: done, ' + ', '.join(f'{n} {s}' for s, n in counts.items()))
    return results


def _injected_partial(text: str) -> tuple[str, Path]:
    name, _, path = text.partition('=')
    if name not in PART_NAMES or not path:
        raise argparse.ArgumentTypeError(f'--inject-partial wants PART=FILE, PART in {PART_NAMES}')
    return name, Path(path).resolve()


def _limit_override(text: str) -> tuple[str, float]:
    name, _, seconds = text.partition('=')
    if name not in PART_NAMES or not seconds:
        raise argparse.ArgumentTypeError(f'--limit wants PART=SECONDS with PART in {PART_NAMES}')
    return name, float(seconds)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog='python -m bench.gpu_check',
        description='The prepared GPU run: correctness first, then measurements.',
    )
    parser.add_argument('--out', type=Path, help='folder for report.md, results.json, the log')
    parser.add_argument('--dry-run', action='store_true', help='tiny shapes on the CPU')
    parser.add_argument(
        '--budget-s',
        type=float,
        default=DEFAULT_BUDGET_S,
        help='seconds for all parts together (limits scale with it)',
    )
    parser.add_argument(
        '--workdir',
        default='',
        help='where the checkpoint goes (kept); default: a temporary folder, deleted at the end',
    )
    parser.add_argument('--parts', nargs='+', choices=PART_NAMES, help='run only these')
    parser.add_argument(
        '--limit',
        type=_limit_override,
        action='append',
        help="PART=SECONDS: this part's limit instead of its share",
    )
    # Checks of the runner itself: a part that never returns.
    parser.add_argument('--inject-hang', nargs='+', choices=PART_NAMES, help=argparse.SUPPRESS)
    # ... and one that saves this partial data (PART=JSON_FILE), then never returns.
    parser.add_argument(
        '--inject-partial', type=_injected_partial, action='append', help=argparse.SUPPRESS
    )
    # The part's process: set by the parent.
    parser.add_argument('--run-part', choices=PART_NAMES, help=argparse.SUPPRESS)
    parser.add_argument('--prior', type=Path, help=argparse.SUPPRESS)
    parser.add_argument('--result', type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.run_part is None and args.out is None:
        parser.error('--out is required')
    if args.budget_s <= 0:
        parser.error('--budget-s must be > 0')
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.run_part:
        return run_part(
            args.run_part,
            dry_run=args.dry_run,
            workdir=Path(args.workdir),
            prior_file=args.prior,
            result_file=args.result,
            hang=bool(args.inject_hang),
            partial_then_hang=dict(args.inject_partial or []).get(args.run_part),
        )
    results = run_all(args)
    return 0 if all(e['status'] in ('ok', 'skipped') for e in results['parts'].values()) else 1


if __name__ == '__main__':
    sys.exit(main())
