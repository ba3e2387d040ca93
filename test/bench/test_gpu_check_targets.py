"""Issue 22's targets in the prepared GPU run's report (bench/gpu_check/targets.py), the floor
of a batched step they are set against, and the parts' limits."""

from __future__ import annotations

import pytest

from bench.gpu_check import targets
from bench.gpu_check.parts import DEFAULT_BUDGET_S, PARTS
from bench.lib.cost_model import batch_floor, openvla_7b_shape, step_floor
from bench.lib.device_timing import MeasuredRates

H200 = MeasuredRates(4138.8, 753.5, 'bfloat16')  # run B's rates
KEYS = [
    'decode_step_1', 'decode_step_batch', 'prefill_1', 'step_1', 'step_batch',
    'decode_kernel_copy_share', 'extend_kernel_over_sdpa', 'capacity_separate',
    'capacity_mixed', 'engine_step_1', 'oft_step_1', 'oft_step_batch', 'oft_capacity',
]  # fmt: skip


def _graphs(prefill_ms: float, decode_ms: float, step_ms: float) -> dict:
    return {'graphs': {'prefill_ms': prefill_ms, 'decode_step_ms': decode_ms, 'step_ms': step_ms}}


def _results() -> dict:
    """Run B's H200 numbers where it measured them, in the parts' JSON layout."""
    model = {
        'floor': {'prefill_ms': 5.45, 'decode_ms': 3.19, 'step_ms': 24.6},
        'batches': [
            {'robots': 1, **_graphs(21.5, 7.48, 66.75)},
            {'robots': 16, **_graphs(145.51, 9.58, 203.9),
             'batch_floor': {'prefill_ms': 87.1, 'decode_ms': 3.76, 'step_ms': 109.7}},
        ],
    }  # fmt: skip
    kernels = {
        'decode_worst_copy_share': 0.49,
        'rows': [
            {'kernel': 'extend', 'batch': 8, 'context': '256+256', 'ms': 0.257,
             'baseline_ms': 0.231},
            {'kernel': 'extend', 'batch': 8, 'context': '2048+256', 'ms': 0.848,
             'baseline_ms': 0.458},
            {'kernel': 'extend', 'batch': 8, 'context': '8192+256', 'ms': 2.746,
             'baseline_ms': 1.100},
            {'kernel': 'extend', 'batch': 1, 'context': '8192+256', 'ms': 9.0,
             'baseline_ms': 1.0},
            {'kernel': 'decode', 'batch': 32, 'context': '2048', 'ms': 1.0, 'baseline_ms': 0.1},
        ],
    }  # fmt: skip
    serving = {
        'capacity_separate': 1,
        'capacity_mixed': 12,
        'robots_bound': 18.0,
        'robots_pass_bound': 14.3,
        'floor': {'step_ms': 24.6},
        'one_robot_step_over_floor': 2.5,
    }
    parts = {'model': model, 'kernels': kernels, 'serving': serving}
    return {'parts': {name: {'status': 'ok', 'data': data} for name, data in parts.items()}}


def test_every_issue_target_has_its_value_floor_and_verdict_from_the_parts():
    rows = {t['key']: t for t in targets.issue_targets(_results())}
    assert list(rows) == KEYS
    assert rows['decode_step_1']['value'] == 7.48 and rows['decode_step_1']['met'] is False
    assert rows['decode_step_1']['over_floor'] == pytest.approx(7.48 / 3.19)
    assert rows['decode_step_batch']['measure'].startswith('decode step, 16 requests')
    assert rows['decode_step_batch']['floor'] == 3.76
    assert rows['step_1']['over_floor'] == pytest.approx(66.75 / 24.6)
    assert rows['step_batch']['over_floor'] == pytest.approx(203.9 / 109.7)
    assert rows['decode_kernel_copy_share']['met'] is False
    # The worst extend at batch >= 8 over >= 2048 cached tokens; batch 1 is not judged.
    assert rows['extend_kernel_over_sdpa']['value'] == pytest.approx(2.746 / 1.100)
    assert (rows['capacity_separate']['met'], rows['capacity_mixed']['met']) == (False, True)
    assert (rows['capacity_separate']['floor'], rows['capacity_mixed']['floor']) == (14.3, 18.0)
    assert rows['engine_step_1']['value'] == pytest.approx(2.5 * 24.6)


def test_targets_are_met_at_their_bounds_and_a_part_that_failed_measures_nothing():
    results = _results()
    model = results['parts']['model']['data']
    model['batches'][0]['graphs'].update(decode_step_ms=4.0, prefill_ms=9.0, step_ms=33.2)
    results['parts']['kernels'] = {'status': 'failed', 'output_tail': ['CUDA error']}
    rows = {t['key']: t for t in targets.issue_targets(results)}
    assert rows['decode_step_1']['met'] and rows['prefill_1']['met'] and rows['step_1']['met']
    for key in ('decode_kernel_copy_share', 'extend_kernel_over_sdpa'):
        assert rows[key]['value'] is None and rows[key]['met'] is None
    table = '\n'.join(targets.markdown_lines(list(rows.values())))
    row = '| decode step, 1 request, CUDA graph | 4.00 ms | 3.19 ms | 1.25x | <= 4.0 ms | yes |'
    assert row in table
    assert '| - | 100% | - | >= 70% | not measured |' in table
    assert '| 1 | 14.3 | - | >= 10 | **no** |' in table


def test_the_floor_of_a_batch_adds_every_robots_prefill_and_kv_reads():
    shape = openvla_7b_shape()
    one, sixteen = step_floor(shape, H200), batch_floor(shape, H200, 16)
    assert batch_floor(shape, H200, 1).prefill_ms == pytest.approx(one.prefill_ms)
    assert sixteen.prefill_ms == pytest.approx(16 * one.prefill_ms)  # FLOP bound
    kv_ms = 16 * (shape.prompt_len + 1) * shape.kv_bytes_per_token / (H200.copy_gb_per_s * 1e6)
    assert sixteen.decode_ms == pytest.approx(one.decode_ms + kv_ms)
    assert sixteen.step_ms > sixteen.prefill_ms + 6 * sixteen.decode_ms  # the KV grows
    with pytest.raises(ValueError, match='num_robots'):
        batch_floor(shape, H200, 0)


def test_the_parts_limits_fill_the_default_budget_and_profile_follows_model():
    assert sum(p.limit_s for p in PARTS) == DEFAULT_BUDGET_S
    names = [p.name for p in PARTS]
    assert names.index('profile') == names.index('model') + 1
    assert not next(p for p in PARTS if p.name == 'profile').needs_checkpoint
