"""The seam benchmark's report: its table, its plot and where it ran (``bench.chunk_seams``)."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

from bench.lib.tables import markdown_table


def seam_table(rows: list[dict[str, object]]) -> str:
    headers = [
        'mode',
        'delay ms (actions)',
        'seams',
        'departure p50 / p99 / max',
        'jump p50',
        'own step p50',
        'excess p50 / p99',
        'velocity p50 / p99 / max',
        'jerk p50 / p99 / max',
        'held',
    ]

    def three(row, name, digits=2):
        keys = [f'{name}_p50', f'{name}_p99', f'{name}_max']
        return ' / '.join(f'{row[k]:.{digits}f}' for k in keys if k in row)

    def two(row, name):
        return f'{row[f"{name}_p50"]:.2f} / {row[f"{name}_p99"]:.2f}'

    body = [
        [
            row['mode'],
            f'{row["delay_ms"]} ({row["delay_actions"]})',
            row['num_seams'],
            three(row, 'departure'),
            row['jump_p50'],
            row['own_step_p50'],
            two(row, 'excess'),
            three(row, 'velocity'),
            three(row, 'jerk', 0),
            f'{100 * row["held_fraction"]:.1f}%',
        ]
        for row in rows
    ]
    return markdown_table(headers, body)


def write_plot(rows: list[dict[str, object]], path: Path) -> bool:
    """Departure, excess, jerk p99 and the time held against the delay, one line per mode;
    False when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use('Agg')
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    panels = (
        ('departure_p50', 'seam departure p50 (rad)'),
        ('excess_p50', 'jump beyond own step p50 (rad)'),
        ('jerk_p99', 'executed jerk p99 (rad/s^3)'),
        ('held_fraction', 'fraction of time held'),
    )
    fig, axes = plt.subplots(2, 2, figsize=(10, 7), sharex=True)
    for ax, (key, title) in zip(axes.flat, panels, strict=True):
        for mode in dict.fromkeys(r['mode'] for r in rows):
            mine = [r for r in rows if r['mode'] == mode]
            ax.plot([r['delay_ms'] for r in mine], [r[key] for r in mine], marker='o', label=mode)
        ax.set_title(title)
        ax.grid(alpha=0.3)
    for ax in axes[1]:
        ax.set_xlabel('inference delay (ms)')
    axes[0][0].legend(fontsize=8)
    fig.suptitle('Seams between chunks: tiny pi0 on a simulated clock')
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


def machine() -> dict[str, object]:
    import torch

    return {
        'platform': platform.platform(),
        'processor': platform.processor() or platform.machine(),
        'cpus': os.cpu_count(),
        'load_average': os.getloadavg()[0] if hasattr(os, 'getloadavg') else None,
        'python': platform.python_version(),
        'torch': torch.__version__,
        'torch_threads': torch.get_num_threads(),
    }


def commit() -> str:
    try:
        out = subprocess.run(
            ['git', 'rev-parse', '--short', 'HEAD'], capture_output=True, text=True, check=True
        )
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return 'unknown'
