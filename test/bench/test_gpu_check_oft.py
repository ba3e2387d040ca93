"""The prepared GPU run's OpenVLA-OFT part: the floor of a pass, the OFT folder made on an
OpenVLA folder, and the information rows it adds to the targets table."""

from __future__ import annotations

import json

import pytest
import torch

from bench.gpu_check import oft, targets
from bench.lib.device_timing import MeasuredRates
from bench.lib.oft_checkpoints import oft_folder_once
from bench.lib.oft_cost import OFTShape, oft_pass_floor, oft_shape, robots_at_period
from vla_sched.model.config.openvla_oft import oft_preset
from vla_sched.model.config.presets import openvla_config
from vla_sched.model.loading.oft_model import load_oft_checkpoint
from vla_sched.testing.openvla_oft_writer import OFT_DATASET
from vla_sched.testing.openvla_writer import write_openvla_checkpoint

H200 = MeasuredRates(4138.8, 753.5, 'bfloat16')  # run B's rates


def _shape(**changes) -> OFTShape:
    fields = dict(
        decoder_params=1000, vision_params=100, head_params=50, proprio_params=10,
        num_images=2, num_image_tokens=4, seq_len=20, chunk_len=3, bytes_per_param=2,
    )  # fmt: skip
    return OFTShape(**{**fields, **changes})


def test_a_pass_costs_the_decoder_per_position_the_towers_per_patch_and_the_head_per_row():
    shape = _shape()
    # decoder 2 x 1000 x 20 positions; 2 images x 2 x 100 x 4 patches; head 2 x 50 x 3 rows
    # and the projector 2 x 10 for the one state
    assert shape.pass_flops == 40_000 + 1_600 + 300 + 20
    assert shape.weight_bytes == (1000 + 100 + 50 + 10) * 2
    assert _shape(proprio_params=0).pass_flops == shape.pass_flops - 20


def test_the_floor_is_the_longer_of_the_flops_at_the_matmul_rate_and_the_weights_copied():
    rates = MeasuredRates(copy_gb_per_s=1e-6, matmul_tflops=1e-9, matmul_dtype='bfloat16')
    shape = _shape()  # 41_920 FLOPs at 1000 FLOP/s; 2_320 bytes at 1000 B/s
    one = oft_pass_floor(shape, rates, 1)
    assert one.compute_ms == pytest.approx(41_920.0)
    assert one.weights_ms == pytest.approx(2_320.0)
    assert one.pass_ms == one.compute_ms
    assert oft_pass_floor(shape, rates, 4).pass_ms == pytest.approx(4 * 41_920.0)
    slow_copy = MeasuredRates(copy_gb_per_s=1e-8, matmul_tflops=1e-9, matmul_dtype='bfloat16')
    weights_bound = oft_pass_floor(shape, slow_copy, 1)  # 2_320 bytes at 10 B/s
    assert weights_bound.pass_ms == weights_bound.weights_ms == pytest.approx(232_000.0)
    assert robots_at_period(shape, rates, 100.0) == pytest.approx(100.0 * 1000 / 41_920)
    with pytest.raises(ValueError, match='num_robots'):
        oft_pass_floor(shape, rates, 0)


def test_openvla_7b_with_the_libero_preset_has_the_heads_151m_parameters_and_no_lm_head():
    config = openvla_config('fused', tiny=False)
    shape = oft_shape(config, oft_preset('libero'), seq_len=590)
    assert shape.head_params == pytest.approx(151e6, rel=0.01)
    # Llama-2-7B's decoder without its two 32000 x 4096 tables (embedding and LM head)
    assert shape.decoder_params == pytest.approx(6.74e9 - 2 * 32064 * 4096, rel=0.01)
    assert (shape.num_images, shape.chunk_len, shape.num_image_tokens) == (2, 8, 256)
    floor = oft_pass_floor(shape, H200, 1)
    assert floor.pass_ms == floor.compute_ms  # FLOP-bound even for one robot
    assert 10 < floor.pass_ms < 13 and 8 < robots_at_period(shape, H200, 0.1) < 10


def test_the_oft_folder_links_the_openvla_files_and_loads_with_the_libero_preset(tmp_path):
    base = write_openvla_checkpoint(tmp_path / 'openvla-tiny', tiny=True, num_shards=2)
    settings = oft_preset('libero')
    folder, reused = oft_folder_once(
        tmp_path, base, settings=settings, device='cpu', dtype=torch.bfloat16
    )
    assert not reused
    weights = sorted(folder.glob('*.safetensors'))
    assert len(weights) == 2 and all(p.is_symlink() for p in weights)
    assert all(p.resolve().parent == base.resolve() for p in weights)
    stats = json.loads((folder / 'dataset_statistics.json').read_text())
    assert list(stats) == [OFT_DATASET]
    dataset = stats[OFT_DATASET]
    assert (len(dataset['action']['q01']), len(dataset['proprio']['q01'])) == (7, 8)
    head = torch.load(folder / 'action_head--150000_checkpoint.pt', weights_only=True)
    assert all(k.startswith('module.') and t.dtype == torch.bfloat16 for k, t in head.items())
    model = load_oft_checkpoint(folder, settings=settings)
    assert model.spec.chunk_len == 8 and model.proprio_projector is not None
    again = oft_folder_once(tmp_path, base, settings=settings, device='cpu', dtype=torch.bfloat16)
    assert again == (folder, True)


def _oft_data() -> dict:
    floor_1 = {'pass_ms': 11.4, 'compute_ms': 11.4, 'weights_ms': 3.6}
    floor_16 = {'pass_ms': 182.0, 'compute_ms': 182.0, 'weights_ms': 3.6}
    return {
        'num_images': 2,
        'chunk_len': 8,
        'robots_bound': 8.8,
        'steps': [
            {'robots': 1, 'pass_ms': 30.0, 'floor': floor_1, 'over_floor': 30.0 / 11.4},
            {'robots': 16, 'pass_ms': 260.0, 'floor': floor_16, 'over_floor': 260.0 / 182.0},
        ],
        'capacity': {'period_s': 0.1, 'deadline_ms': 100.0, 'capacity': 5},
    }


def test_the_oft_rows_inform_without_a_target_and_read_as_dashes():
    rows = {t['key']: t for t in targets.oft_rows(_oft_data())}
    assert list(rows) == ['oft_step_1', 'oft_step_batch', 'oft_capacity']
    assert all(t['target'] is None and t['met'] is None for t in rows.values())
    assert rows['oft_step_1']['over_floor'] == pytest.approx(30.0 / 11.4)
    assert rows['oft_step_batch']['measure'].startswith('OpenVLA-OFT: 16 robots in one pass')
    assert (rows['oft_capacity']['value'], rows['oft_capacity']['floor']) == (5, 8.8)
    table = '\n'.join(targets.markdown_lines(list(rows.values())))
    assert '| 30.00 ms | 11.40 ms | 2.63x | - | - |' in table
    assert '| 5 | 8.8 | 0.57x | - | - |' in table


def test_a_run_without_the_oft_part_has_its_rows_unmeasured():
    results = {'parts': {'oft': {'status': 'skipped', 'why': 'not selected (--parts)'}}}
    rows = [t for t in targets.issue_targets(results) if t['key'].startswith('oft_')]
    assert [t['value'] for t in rows] == [None, None, None]
    assert all(t['met'] is None and not t['partial'] for t in rows)


def test_the_section_renders_a_part_stopped_before_its_capacity_search_ended():
    data = _oft_data()
    data.update(preset='libero', action_dim=7, proprio_dim=8, center_crop=True)
    data.update(dtype='bfloat16', cuda_graphs=False, load_s=12.0, seq_len=590, period_s=0.1)
    data.update(head_params_m=151.1, pass_tflop_per_robot=8.6, crop_ms_per_image=2.5)
    data['capacity'] = {
        'period_s': 0.1, 'deadline_ms': 100.0, 'warmup_s': 1.0, 'duration_s': 2.0,
        'criteria': 'the rule', 'max_robots': 9, 'points': [], 'capacity': None,
    }  # fmt: skip
    text = '\n'.join(oft.section(data))
    assert text.startswith('## OpenVLA-OFT (libero preset: 2 cameras, chunks of 8 x 7')
    assert 'allows 8.8 robots at 10 Hz' in text and '2.50 ms' in text
    assert '| 16 | 260.00 | 182.00 | 182.00 | 3.60 | 1.43x |' in text
    assert 'none found yet (its search did not end)' in text
