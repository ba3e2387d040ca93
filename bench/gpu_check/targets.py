"""Issue 22's targets against what the run measured: each with its value, its floor, the
target and whether it is met (None: not measured in this run), in one table; after them
OpenVLA-OFT's measures as information rows.

Each target reads the data of the part that measures it:

=========================== ========= ======================================================
key                         part      value (JSON path in ``parts.<part>.data``)
=========================== ========= ======================================================
decode_step_1               model     ``batches[robots=1].graphs.decode_step_ms``
decode_step_batch           model     ``batches[largest].graphs.decode_step_ms``
prefill_1                   model     ``batches[robots=1].graphs.prefill_ms``
step_1                      model     ``batches[robots=1].graphs.step_ms`` / ``floor.step_ms``
step_batch                  model     ``batches[largest].graphs.step_ms`` / its batch floor
decode_kernel_copy_share    kernels   ``decode_worst_copy_share``
extend_kernel_over_sdpa     kernels   worst ``ms / baseline_ms`` of the extend ``rows`` at
                                      batch >= 8 over >= 2048 cached tokens
capacity_separate           serving   ``capacity_separate`` (bound: ``robots_pass_bound``)
capacity_mixed              serving   ``capacity_mixed`` (bound: ``robots_bound``)
engine_step_1               serving   ``one_robot_step_over_floor``
oft_step_1                  oft       ``steps[robots=1].pass_ms`` / ``floor.pass_ms``
oft_step_batch              oft       ``steps[largest].pass_ms`` / its ``floor.pass_ms``
oft_capacity                oft       ``capacity.capacity`` (bound: ``robots_bound``)
=========================== ========= ======================================================

The ``oft_*`` rows are information rows (issue 24 sets OpenVLA-OFT no numeric target): they
show the measure, its floor and their ratio, with ``target`` None ("-") and ``met`` None.

"largest" is the model (oft) part's largest robot count (16 on a GPU, 2 in the dry run). A part
that did not end ok gives its targets from the data it saved before it stopped (its entry's
``partial``): such rows say so (``partial``, and a note in the table).
"""

from __future__ import annotations

from typing import Any

from bench.lib.tables import markdown_table

PARTIAL_NOTE = ' (from a partial part: it stopped before its end)'
EXTEND_MIN_BATCH = 8
EXTEND_MIN_PREFIX = 2048


def _row(
    key: str, measure: str, value: float | None, *, floor: float | None, unit: str,
    wanted: str | None, met: bool | None, over_floor: float | None = None,
) -> dict[str, Any]:  # fmt: skip
    return {
        'key': key, 'measure': measure, 'value': value, 'unit': unit, 'floor': floor,
        'over_floor': over_floor, 'target': wanted, 'met': None if value is None else met,
    }  # fmt: skip


def _at_most(value: float | None, bound: float) -> bool | None:
    return None if value is None else value <= bound


def _at_least(value: float | None, bound: float) -> bool | None:
    return None if value is None else value >= bound


def _ratio(value: float | None, floor: float | None) -> float | None:
    return None if value is None or not floor else value / floor


def _batch(model: dict[str, Any], robots: int | None) -> dict[str, Any]:
    return next((b for b in model.get('batches', []) if b['robots'] == robots), {})


def model_targets(model: dict[str, Any]) -> list[dict[str, Any]]:
    """The runner's decode, prefill and step against their floors (the ``model`` part)."""
    one = _batch(model, 1).get('graphs', {})
    floor = model.get('floor', {})
    largest = max((b['robots'] for b in model.get('batches', [])), default=None)
    batch = _batch(model, largest) if largest and largest > 1 else {}
    many, batch_floor = batch.get('graphs', {}), batch.get('batch_floor', {})
    n = largest if batch else 16
    decode_1, decode_n = one.get('decode_step_ms'), many.get('decode_step_ms')
    prefill_1 = one.get('prefill_ms')
    step_1, step_n = one.get('step_ms'), many.get('step_ms')
    step_1_over = _ratio(step_1, floor.get('step_ms'))
    step_n_over = _ratio(step_n, batch_floor.get('step_ms'))
    return [
        _row('decode_step_1', 'decode step, 1 request, CUDA graph', decode_1,
             floor=floor.get('decode_ms'), unit='ms', wanted='<= 4.0 ms',
             met=_at_most(decode_1, 4.0), over_floor=_ratio(decode_1, floor.get('decode_ms'))),
        _row('decode_step_batch', f'decode step, {n} requests, CUDA graph', decode_n,
             floor=batch_floor.get('decode_ms'), unit='ms', wanted='<= 4.5 ms',
             met=_at_most(decode_n, 4.5),
             over_floor=_ratio(decode_n, batch_floor.get('decode_ms'))),
        _row('prefill_1', 'prefill of one robot (280 tokens) with vision', prefill_1,
             floor=floor.get('prefill_ms'), unit='ms', wanted='<= 9 ms',
             met=_at_most(prefill_1, 9.0), over_floor=_ratio(prefill_1, floor.get('prefill_ms'))),
        _row('step_1', "one robot's whole step (prefill + 6 decode steps)", step_1,
             floor=floor.get('step_ms'), unit='ms', wanted='<= 1.35x floor',
             met=_at_most(step_1_over, 1.35), over_floor=step_1_over),
        _row('step_batch', f'{n} robots in one batched step', step_n,
             floor=batch_floor.get('step_ms'), unit='ms', wanted='<= 1.3x floor',
             met=_at_most(step_n_over, 1.3), over_floor=step_n_over),
    ]  # fmt: skip


def extend_over_sdpa(kernels: dict[str, Any]) -> float | None:
    """The extend kernel's worst time over SDPA's on the same slots, at batch >= 8 over
    prefixes of >= 2048 cached tokens (None: no such row)."""
    ratios = [
        r['ms'] / r['baseline_ms']
        for r in kernels.get('rows', [])
        if r['kernel'] == 'extend'
        and r['batch'] >= EXTEND_MIN_BATCH
        and int(str(r['context']).split('+')[0]) >= EXTEND_MIN_PREFIX
    ]
    return max(ratios, default=None)


def kernel_targets(kernels: dict[str, Any]) -> list[dict[str, Any]]:
    """The decode and extend attention kernels (the ``kernels`` part)."""
    share = kernels.get('decode_worst_copy_share')
    extend = extend_over_sdpa(kernels)
    return [
        _row('decode_kernel_copy_share',
             'decode attention kernel, batch >= 32, context >= 2048: worst share of copy '
             'bandwidth', share, floor=1.0, unit='%', wanted='>= 70%',
             met=_at_least(share, 0.7)),
        _row('extend_kernel_over_sdpa',
             f'extend kernel, batch {EXTEND_MIN_BATCH} over >= {EXTEND_MIN_PREFIX} cached '
             'tokens: worst time over SDPA on the same slots', extend, floor=None, unit='x',
             wanted='<= 1.0x (no slower than SDPA)', met=_at_most(extend, 1.0)),
    ]  # fmt: skip


def serving_targets(serving: dict[str, Any]) -> list[dict[str, Any]]:
    """Capacity at 10 Hz with and without mixed passes, one robot's step on the engine
    core against its floor (the ``serving`` part)."""
    # The most robots each schedule allows: separate prefill and decode passes (the pass
    # bound), every step's FLOPs at the matmul rate (what mixed passes approach).
    bounds = {'separate': serving.get('robots_pass_bound'), 'mixed': serving.get('robots_bound')}
    rows = [
        _row(f'capacity_{mode}',
             f'capacity: robots at 10 Hz on the engine core, {label} (>= 99% of the action '
             'rate and of steps within the 100 ms deadline)',
             serving.get(f'capacity_{mode}'), floor=bounds[mode], unit='robots',
             wanted='>= 10', met=_at_least(serving.get(f'capacity_{mode}'), 10))
        for mode, label in (('separate', 'separate passes'), ('mixed', 'mixed passes'))
    ]  # fmt: skip
    over = serving.get('one_robot_step_over_floor')
    floor = serving.get('floor', {}).get('step_ms')
    engine_step = None if over is None or floor is None else over * floor
    rows.append(
        _row('engine_step_1', "one robot's step on the engine core, paced at 10 Hz (p50)",
             engine_step, floor=floor, unit='ms', wanted='<= 1.35x floor',
             met=_at_most(over, 1.35), over_floor=over)
    )  # fmt: skip
    return rows


def oft_rows(oft: dict[str, Any]) -> list[dict[str, Any]]:
    """OpenVLA-OFT's step of 1 and of N robots in one batch (the padded passes, replayed
    from CUDA graphs on a GPU) against their floors, and its capacity at 10 Hz of chunks
    against the FLOP ceiling (the ``oft`` part): information rows, no target."""
    steps = {s['robots']: s for s in oft.get('steps', [])}
    largest = max((n for n in steps if n > 1), default=None)
    n = largest or 16
    cameras, chunk = oft.get('num_images', 2), oft.get('chunk_len', 8)
    path = 'CUDA graphs' if oft.get('cuda_graphs') else 'no graphs'
    rows = []
    for key, count, measure in (
        ('oft_step_1', 1, "one robot's step"),
        ('oft_step_batch', largest, f'{n} robots in one batch'),
    ):
        step = steps.get(count, {})
        floor = step.get('floor', {}).get('pass_ms')
        rows.append(_row(
            key, f'OpenVLA-OFT: {measure} ({cameras} cameras, chunk {chunk}, {path})',
            step.get('pass_ms'), floor=floor, unit='ms', wanted=None, met=None,
            over_floor=_ratio(step.get('pass_ms'), floor),
        ))  # fmt: skip
    paced = oft.get('capacity', {})
    capacity, bound = paced.get('capacity'), oft.get('robots_bound')
    hz, deadline = 1 / paced.get('period_s', 0.1), paced.get('deadline_ms', 100.0)
    rows.append(_row(
        'oft_capacity', f'OpenVLA-OFT: robots at {hz:g} Hz of chunks on the engine core (>= '
        f'99% of the chunk rate and of steps within the {deadline:.0f} ms deadline)', capacity,
        floor=bound,
        unit='robots', wanted=None, met=None, over_floor=_ratio(capacity, bound),
    ))  # fmt: skip
    return rows


def part_data(entry: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """A part's data for the targets and whether it is partial: its data if it ended ok,
    else what it saved before it stopped (its ``partial``), else nothing."""
    if entry.get('status') == 'ok':
        return entry.get('data', {}), False
    partial = entry.get('partial')
    return (partial, True) if partial else ({}, False)


def issue_targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Every target of issue 22, in the issue's order, then OpenVLA-OFT's information rows,
    from the parts that ended ok, or from the data a part saved before it stopped (the row's
    ``partial`` is then true)."""
    data = {name: part_data(e) for name, e in results['parts'].items()}
    rows = []
    for part, targets_of in (
        ('model', model_targets), ('kernels', kernel_targets), ('serving', serving_targets),
        ('oft', oft_rows),
    ):  # fmt: skip
        found, partial = data.get(part, ({}, False))
        rows += [{**row, 'partial': partial} for row in targets_of(found)]
    return rows


def _shown(value: float | None, unit: str) -> str:
    if value is None:
        return '-'
    if unit == '%':
        return f'{100 * value:.0f}%'
    if unit == 'robots':
        return f'{value:.0f}' if float(value).is_integer() else f'{value:.1f}'
    return f'{value:.2f} {unit}'


def markdown_lines(targets: list[dict[str, Any]]) -> list[str]:
    """The targets as a table: measured, floor, measured / floor, target, met (an
    information row, without a target, shows "-" for both)."""
    met = {True: 'yes', False: '**no**', None: 'not measured'}
    rows = [
        [t['measure'] + (PARTIAL_NOTE if t.get('partial') else ''),
         _shown(t['value'], t['unit']), _shown(t['floor'], t['unit']),
         f'{t["over_floor"]:.2f}x' if t['over_floor'] is not None else '-',
         t['target'] or '-', met[t['met']] if t['target'] else '-']
        for t in targets
    ]  # fmt: skip
    headers = ['measure (issue 22; OpenVLA-OFT: information)', 'measured', 'floor',
               'measured / floor', 'target', 'met']  # fmt: skip
    return ['## Targets', '', markdown_table(headers, rows)]
