"""The ``oft`` part's report section: the check of the padded passes against the eager pass,
the steps against their floors (the padded path, one robot's eager step beside it, each
with its padding) and the capacity search (``bench.gpu_check.oft`` measures them)."""

from __future__ import annotations

from typing import Any

from bench.lib.capacity import CapacityCriteria, CapacityMeasure
from bench.lib.tables import cell, markdown_table


def _path_name(d: dict[str, Any], step: dict[str, Any]) -> str:
    if step.get('path') == 'eager':
        return 'eager'
    return 'CUDA graphs' if d.get('cuda_graphs') else 'padded, no graphs'


def _share(step: dict[str, Any], path: str) -> str:
    stats = step.get('padding', {}).get(path)
    if not stats or not stats['num_padded_runs']:
        return '-'
    return f'{100 * stats["padding_share"]:.1f}%'


def _step_rows(d: dict[str, Any]) -> list[list[Any]]:
    steps = list(d['steps'])
    if 'eager_step' in d:  # beside the one-robot step it compares with
        at = next((i + 1 for i, s in enumerate(steps) if s['robots'] == 1), len(steps))
        steps.insert(at, d['eager_step'])
    rows = []
    for s in steps:
        floor = s.get('floor')
        passes = ' + '.join(str(n) for n in s['pass_robots']) if 'pass_robots' in s else '-'
        rows.append([
            s['robots'], _path_name(d, s), passes, s['pass_ms'],
            floor['pass_ms'] if floor else '-', floor['compute_ms'] if floor else '-',
            floor['weights_ms'] if floor else '-',
            f'{s["over_floor"]:.2f}x' if 'over_floor' in s else '-',
            _share(s, 'oft'), _share(s, 'vision'),
        ])  # fmt: skip
    return rows


def _check_line(d: dict[str, Any]) -> str:
    check = d['check']
    errors = ', '.join(
        f'{r["max_relative_error"]:.2e} ({r["robots"]} robot{"s" if r["robots"] > 1 else ""})'
        for r in check['rows']
    )
    sizes = ', '.join(f'{n} / {t}' for n, t in d['pass_sizes'])
    made = 'captured' if d['cuda_graphs'] else 'prepared (no capture off CUDA)'
    return (
        f"Padded passes at the engine's sizes (robots / tokens: {sizes}), {made} in "
        f"{d['capture_s']:.1f} s. Their head output against the eager pass's on the same "
        f'batch: max relative error '
        f'{errors}; tolerance {check["tolerance"]:.0e}: '
        f'{"passed" if check["passed"] else "FAILED"}.'
    )


def _core_padding_line(padding: dict[str, Any]) -> str:
    oft = padding['oft']
    return (
        f'Over the search the core ran {oft["num_padded_runs"]} padded passes (padding '
        f'{100 * oft["padding_share"]:.1f}% of their tokens) and {oft["num_eager_runs"]} '
        'eager ones.'
    )


def _capacity_lines(c: dict[str, Any]) -> list[str]:
    from bench.engine_paced import PacedPoint
    from bench.engine_paced import markdown_table as paced_table

    found = c['capacity']
    result = (
        f'**{found}** robots' if found is not None else 'none found yet (its search did not end)'
    )
    share = c.get('bound_share_served')
    lines = [
        f'Capacity at {1 / c["period_s"]:g} Hz of chunks (deadline {c["deadline_ms"]:.0f} ms; '
        f'{c["criteria"]}; bisection from 1 robot up to {c["max_robots"]}; '
        f'{c["warmup_s"]:g} s warm-up and {c["duration_s"]:g} s window per count): {result}'
        + (f', {100 * share:.0f}% of the FLOP ceiling.' if share is not None else '.'),
    ]
    if 'padding' in c:
        lines[-1] += ' ' + _core_padding_line(c['padding'])
    points = sorted(c['points'], key=lambda p: p['num_robots'])
    if points:
        paced = [PacedPoint(**{**p, 'capacity': CapacityMeasure(**p['capacity'])}) for p in points]
        lines += ['', paced_table(paced, criteria=CapacityCriteria())]
    return lines


def section(d: dict[str, Any]) -> list[str]:
    lines = [
        f'## OpenVLA-OFT ({d["preset"]} preset: {d["num_images"]} cameras, chunks of '
        f'{d["chunk_len"]} x {d["action_dim"]}, proprio {d["proprio_dim"]}, center crop '
        f'{"on" if d["center_crop"] else "off"}; {d["dtype"]}, CUDA graphs '
        f'{"on" if d["core_cuda_graphs"] else "off"})',
        '',
        f'{d["seq_len"]} positions per step, head {d["head_params_m"]:.4g} M parameters, '
        f'{d["pass_tflop_per_robot"]:.3g} TFLOP per robot; core loaded (weights, KV pool, '
        f'graphs) in {d["load_s"]:.1f} s.'
        + (
            f' The matmul rate allows {d["robots_bound"]:.1f} robots at {1 / d["period_s"]:g} Hz.'
            if 'robots_bound' in d
            else ''
        ),
    ]
    if 'crop_ms_per_image' in d:
        lines[-1] += (
            f' Center crop of one camera image on the host: {cell(d["crop_ms_per_image"])} ms.'
        )
    if 'check' in d:
        lines += ['', _check_line(d)]
    if d['steps']:
        headers = ['robots in one call', 'path', 'passes (robots)', 'ms (median)', 'floor ms',
                   'FLOPs ms', 'weights ms', 'ms / floor', 'padding (tokens)',
                   'vision padding (images)']  # fmt: skip
        lines += ['', markdown_table(headers, _step_rows(d))]
    if 'eager_step' in d:
        lines += ['', f"One robot's step eager / {_path_name(d, d['steps'][0])}: "
                  f"{d['eager_step']['over_graphs']:.2f}x (information)."]  # fmt: skip
    if 'capacity' in d:
        lines += ['', *_capacity_lines(d['capacity'])]
    return lines
