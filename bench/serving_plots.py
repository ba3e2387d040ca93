"""PNG plots of the serving benchmarks from their ``--json`` outputs (matplotlib).

    python -m bench.serving_plots --control-loop cl.json --itl itl.json --cost cost.json \\
        --out docs/img --tag cpu

writes ``control_loop_<tag>.png`` (actions/s and p99 latency against the robot count, both
systems, the target rate dashed), ``itl_jump_<tag>.png`` (inter-token latency p99 without
and with a prefill in the gap, per scheduler variant) and ``scheduler_cost_<tag>.png`` (the
scheduler's host time per decode step against the batch size, and its share of a step with
the model). Each input is optional.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any


def _pyplot():
    try:
        import matplotlib
    except ImportError as exc:
        raise SystemExit('the plots need matplotlib (requirements/base.txt)') from exc
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    return plt


def plot_control_loop(record: dict[str, Any], path: Path) -> None:
    plt = _pyplot()
    points = record['points']
    fig, (rate_ax, lat_ax) = plt.subplots(1, 2, figsize=(10, 4))
    for system, marker in (('vla_sched', 'o'), ('baseline', 's')):
        rows = sorted((p for p in points if p['system'] == system), key=lambda p: p['num_robots'])
        if not rows:
            continue
        robots = [p['num_robots'] for p in rows]
        rates = [statistics.median(p['actions_per_s']) for p in rows]
        rate_ax.plot(robots, rates, marker=marker, label=system)
        lat_ax.plot(robots, [p['latency_ms_p99'] for p in rows], marker=marker, label=system)
    targets = sorted({(p['num_robots'], p['target_actions_per_s']) for p in points})
    rate_ax.plot(*zip(*targets, strict=True), linestyle='--', color='gray', label='target')
    rate_ax.set(xlabel='robots', ylabel='actions/s delivered', xscale='log', yscale='log')
    lat_ax.set(xlabel='robots', ylabel='chunk latency p99 (ms)', xscale='log', yscale='log')
    budget_ms = 1e3 * record['plan']['budget_s']
    lat_ax.axhline(budget_ms, linestyle='--', color='gray', label='deadline budget')
    rate_ax.set_yticks([round(t) for _, t in targets])
    for ax in (rate_ax, lat_ax):
        ax.set_xticks(sorted({p['num_robots'] for p in points}))
        ticker = plt.matplotlib.ticker
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_major_formatter(ticker.ScalarFormatter())
            axis.set_minor_formatter(ticker.NullFormatter())
        ax.grid(True, which='both', alpha=0.3)
        ax.legend()
    fig.suptitle(f'control loop at {1 / record["plan"]["period_s"]:.0f} Hz per robot')
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_itl(record: dict[str, Any], path: Path) -> None:
    plt = _pyplot()
    rows = record['results']
    names = [r['variant'] for r in rows]
    xs = range(len(rows))
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.4
    ax.bar(
        [x - width / 2 for x in xs],
        [r['itl_clean_p99'] for r in rows],
        width,
        label='ITL p99, no prefill in the gap',
    )
    ax.bar(
        [x + width / 2 for x in xs],
        [r['itl_prefill_p99'] for r in rows],
        width,
        label='ITL p99, a prefill in the gap',
    )
    ax.set_xticks(list(xs), names)
    ax.set_ylabel('ms')
    ax.set_title('inter-token latency of running robots when a new image arrives')
    ax.grid(True, axis='y', alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_cost(record: dict[str, Any], path: Path) -> None:
    plt = _pyplot()
    points = record['points']
    fig, (cost_ax, share_ax) = plt.subplots(1, 2, figsize=(10, 4))
    for runner, overlap in (('null', False), ('null', True), ('model', False), ('model', True)):
        rows = [p for p in points if p['runner'] == runner and p['overlap'] == overlap]
        if not rows:
            continue
        label = f'{runner} runner, overlap {"on" if overlap else "off"}'
        sizes = [p['batch_size'] for p in rows]
        if runner == 'null':
            cost_ax.plot(sizes, [p['sched_us'] for p in rows], marker='o', label=label)
        else:
            shares = [100 * p['sched_us'] / p['step_us'] for p in rows]
            share_ax.plot(sizes, shares, marker='o', label=label)
    cost_ax.set(
        xlabel='running requests',
        ylabel='scheduler us per decode step',
        xscale='log',
        yscale='log',
        title='without the model',
    )
    share_ax.set(
        xlabel='running requests',
        ylabel='scheduler share of the step (%)',
        xscale='log',
        ylim=(0, 100),
        title='with the model',
    )
    for ax in (cost_ax, share_ax):
        ax.grid(True, which='both', alpha=0.3)
        if ax.lines:
            ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--control-loop', default='', help='control_loop.py --json output')
    parser.add_argument('--itl', default='', help='itl_jump.py --json output')
    parser.add_argument('--cost', default='', help='scheduler_cost.py --json output')
    parser.add_argument('--out', default='docs/img', help='folder of the PNG files')
    parser.add_argument('--tag', default='cpu', help='file name suffix')
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    jobs = (
        (args.control_loop, plot_control_loop, 'control_loop'),
        (args.itl, plot_itl, 'itl_jump'),
        (args.cost, plot_cost, 'scheduler_cost'),
    )
    for source, plot, name in jobs:
        if source:
            path = out / f'{name}_{args.tag}.png'
            plot(json.loads(Path(source).read_text()), path)
            print(f'wrote {path}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
