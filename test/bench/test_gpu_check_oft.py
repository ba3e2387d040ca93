"""The prepared GPU run's OpenVLA-OFT part: the floor of a pass, the OFT folder made on an
OpenVLA folder, the runners it times beside the engine core's (padded and eager: what they
ran, how far apart their outputs are), and its report section and information rows."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from bench.gpu_check import oft, targets
from bench.lib.device_timing import MeasuredRates
from bench.lib.oft_checkpoints import oft_folder_once, write_oft_folder_from_openvla
from bench.lib.oft_cost import OFTShape, oft_pass_floor, oft_shape, robots_at_period
from bench.lib.oft_pass import oft_relative_error, runner_beside, time_oft_pass
from vla_sched.model.config.presets import openvla_config
from vla_sched.model.families.openvla_oft.checkpoint import oft_preset
from vla_sched.model.families.openvla_oft.graphs import NUM_OFT_PADDING_SLOTS
from vla_sched.model.families.openvla_oft.model import load_oft_checkpoint
from vla_sched.model.families.openvla_oft.passes import OFTPassSizes
from vla_sched.model.families.openvla_oft.prompt import OFTPromptBuilder
from vla_sched.model.families.openvla_oft.runner import ParallelActionRunner
from vla_sched.model.runner.padding_stats import PaddingStats
from vla_sched.testing.openvla_oft_writer import OFT_DATASET
from vla_sched.testing.openvla_writer import write_openvla_checkpoint

H200 = MeasuredRates(4138.8, 753.5, 'bfloat16')  # run B's rates
STATE = np.linspace(-0.2, 0.3, 8)


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


def _engine_runner(model, num_slots: int) -> ParallelActionRunner:
    """A runner whose caches the timed runners share, as the engine core's (eager)."""
    table = torch.zeros((1, 8), dtype=torch.int32)
    return ParallelActionRunner(model, req_to_token=table, num_kv_slots=num_slots)


@pytest.fixture(scope='module')
def tiny_oft(tmp_path_factory):
    """The tiny OpenVLA folder, two OFT folders on it (heads of seeds 0 and 1), each
    loaded, and the paced robots' prompt."""
    tmp = tmp_path_factory.mktemp('oft_pass')
    base = write_openvla_checkpoint(tmp / 'openvla-tiny', tiny=True)
    settings = oft_preset('libero')
    models = []
    for seed in (0, 1):
        folder = write_oft_folder_from_openvla(
            base, tmp / f'oft-{seed}', settings=settings, device='cpu', dtype=torch.float32,
            seed=seed,
        )  # fmt: skip
        models.append(load_oft_checkpoint(folder, settings=settings))
    prompt = OFTPromptBuilder.from_checkpoint(folder, models[0].spec).build(oft.INSTRUCTION)
    return models, prompt


def test_timed_calls_count_only_their_own_passes_padded_or_eager(tiny_oft):
    (model, _), prompt = tiny_oft
    seq_len = len(prompt.token_ids)  # 590: sizes of one and two robots hold 640 and 1280
    engine = _engine_runner(model, 3 * seq_len + NUM_OFT_PADDING_SLOTS)
    padded = runner_beside(
        engine, num_robots=3, seq_len=seq_len, pass_sizes=OFTPassSizes(robot_counts=(1, 2))
    )
    assert padded.kv_caches is engine.kv_caches and padded.model is model
    times = time_oft_pass(padded, prompt, num_robots=3, state=STATE, warmup=1, reps=1)
    assert times.chunk_shape == (8, 7) and len(times.times_ms) == 1
    # The timed call only (not the warm-up): passes of two robots and one; six images
    # through the encoder padded to eight.
    assert times.padding == {
        'oft': PaddingStats(
            num_padded_runs=2, num_real=3 * seq_len, num_padding=1280 + 640 - 3 * seq_len
        ),
        'vision': PaddingStats(num_padded_runs=1, num_real=6, num_padding=2),
    }
    eager = runner_beside(engine, num_robots=3, seq_len=seq_len)
    times = time_oft_pass(eager, prompt, num_robots=1, state=STATE, warmup=0, reps=2)
    assert times.padding['oft'] == PaddingStats(num_eager_runs=2, num_eager=2 * seq_len)
    with pytest.raises(ValueError, match='4 robots, the slot table of the runner has 3 rows'):
        time_oft_pass(eager, prompt, num_robots=4, state=STATE)


def test_the_padded_runner_matches_the_eager_one_and_another_head_does_not(tiny_oft):
    (model, other_model), prompt = tiny_oft
    seq_len = len(prompt.token_ids)
    engine = _engine_runner(model, 2 * seq_len + NUM_OFT_PADDING_SLOTS)
    padded = runner_beside(engine, num_robots=2, seq_len=seq_len, pass_sizes=OFTPassSizes())
    eager = runner_beside(engine, num_robots=2, seq_len=seq_len)
    assert oft_relative_error(padded, eager, prompt, num_robots=2, state=STATE) <= 1e-5
    other = runner_beside(_engine_runner(other_model, 2 * seq_len), num_robots=2, seq_len=seq_len)
    assert oft_relative_error(other, eager, prompt, num_robots=2, state=STATE) > 0.1


def test_a_runner_beside_needs_the_shared_caches_to_hold_its_robots_and_the_padding(tiny_oft):
    (model, _), prompt = tiny_oft
    seq_len = len(prompt.token_ids)
    engine = _engine_runner(model, 2 * seq_len + 10)
    runner_beside(engine, num_robots=2, seq_len=seq_len)  # eager: no padding slots
    with pytest.raises(ValueError, match=f'need {2 * seq_len + 64} KV slots with the padding'):
        runner_beside(engine, num_robots=2, seq_len=seq_len, pass_sizes=OFTPassSizes())


def _oft_data() -> dict:
    floor_1 = {'pass_ms': 11.4, 'compute_ms': 11.4, 'weights_ms': 3.6}
    floor_16 = {'pass_ms': 182.0, 'compute_ms': 182.0, 'weights_ms': 3.6}

    def padded(robots: int, ms: float, floor: dict, passes: list, share: float) -> dict:
        stats = {'num_padded_runs': 5, 'num_eager_runs': 0}
        return {
            'robots': robots, 'path': 'padded', 'pass_ms': ms, 'floor': floor,
            'over_floor': ms / floor['pass_ms'], 'pass_robots': passes,
            'padding': {'oft': {**stats, 'padding_share': share},
                        'vision': {**stats, 'padding_share': 0.0}},
        }  # fmt: skip

    return {
        'num_images': 2,
        'chunk_len': 8,
        'cuda_graphs': True,
        'robots_bound': 8.8,
        'steps': [
            padded(1, 30.0, floor_1, [1], 0.078),
            padded(16, 260.0, floor_16, [8, 8], 0.054),
        ],
        'capacity': {'period_s': 0.1, 'deadline_ms': 100.0, 'capacity': 5},
    }


def test_the_oft_rows_inform_without_a_target_and_read_as_dashes():
    rows = {t['key']: t for t in targets.oft_rows(_oft_data())}
    assert list(rows) == ['oft_step_1', 'oft_step_batch', 'oft_capacity']
    assert all(t['target'] is None and t['met'] is None for t in rows.values())
    assert rows['oft_step_1']['over_floor'] == pytest.approx(30.0 / 11.4)
    assert rows['oft_step_batch']['measure'] == (
        'OpenVLA-OFT: 16 robots in one batch (2 cameras, chunk 8, CUDA graphs)'
    )
    assert (rows['oft_capacity']['value'], rows['oft_capacity']['floor']) == (5, 8.8)
    table = '\n'.join(targets.markdown_lines(list(rows.values())))
    assert '| 30.00 ms | 11.40 ms | 2.63x | - | - |' in table
    assert '| 5 | 8.8 | 0.57x | - | - |' in table
    uncaptured = targets.oft_rows({**_oft_data(), 'cuda_graphs': False})
    assert uncaptured[0]['measure'].endswith('(2 cameras, chunk 8, no graphs)')


def test_a_run_without_the_oft_part_has_its_rows_unmeasured():
    results = {'parts': {'oft': {'status': 'skipped', 'why': 'not selected (--parts)'}}}
    rows = [t for t in targets.issue_targets(results) if t['key'].startswith('oft_')]
    assert [t['value'] for t in rows] == [None, None, None]
    assert all(t['met'] is None and not t['partial'] for t in rows)


def _section_data() -> dict:
    data = _oft_data()
    data.update(preset='libero', action_dim=7, proprio_dim=8, center_crop=True)
    data.update(dtype='bfloat16', core_cuda_graphs=True, load_s=12.0, seq_len=590)
    data.update(period_s=0.1, head_params_m=151.1, pass_tflop_per_robot=8.6)
    data.update(crop_ms_per_image=2.5, capture_s=1.5, pass_sizes=[[1, 640], [8, 4992]])
    data['check'] = {
        'tolerance': 5e-2, 'passed': True,
        'rows': [{'robots': 1, 'max_relative_error': 3e-3},
                 {'robots': 16, 'max_relative_error': 4e-3}],
    }  # fmt: skip
    data['eager_step'] = {
        'robots': 1, 'path': 'eager', 'pass_ms': 75.0, 'floor': data['steps'][0]['floor'],
        'over_floor': 75.0 / 11.4, 'over_graphs': 2.5,
        'padding': {'oft': {'num_padded_runs': 0, 'num_eager_runs': 5, 'padding_share': 0.0}},
    }  # fmt: skip
    data['capacity'] = {
        'period_s': 0.1, 'deadline_ms': 100.0, 'warmup_s': 1.0, 'duration_s': 2.0,
        'criteria': 'the rule', 'max_robots': 9, 'points': [], 'capacity': None,
    }  # fmt: skip
    return data


def test_the_section_shows_the_check_and_the_eager_step_beside_the_graphs_one():
    text = '\n'.join(oft.section(_section_data()))
    assert 'bfloat16, CUDA graphs on)' in text
    assert 'captured in 1.5 s' in text and '(robots / tokens: 1 / 640, 8 / 4992)' in text
    assert 'max relative error 3.00e-03 (1 robot), 4.00e-03 (16 robots)' in text
    assert 'tolerance 5e-02: passed.' in text
    lines = text.splitlines()
    graphs_one = lines.index(
        '| 1 | CUDA graphs | 1 | 30.00 | 11.40 | 11.40 | 3.60 | 2.63x | 7.8% | 0.0% |'
    )
    assert (
        lines[graphs_one + 1] == '| 1 | eager | - | 75.00 | 11.40 | 11.40 | 3.60 | 6.58x | - | - |'
    )
    assert lines[graphs_one + 2] == (
        '| 16 | CUDA graphs | 8 + 8 | 260.00 | 182.00 | 182.00 | 3.60 | 1.43x | 5.4% | 0.0% |'
    )
    assert "One robot's step eager / CUDA graphs: 2.50x (information)." in text


def test_the_section_renders_a_part_stopped_before_its_capacity_search_ended():
    data = _section_data()
    text = '\n'.join(oft.section(data))
    assert text.startswith('## OpenVLA-OFT (libero preset: 2 cameras, chunks of 8 x 7')
    assert 'allows 8.8 robots at 10 Hz' in text and '2.50 ms' in text
    assert 'none found yet (its search did not end)' in text
    data['capacity']['padding'] = {
        'oft': {'num_padded_runs': 40, 'num_eager_runs': 0, 'padding_share': 0.062}
    }
    text = '\n'.join(oft.section(data))
    assert 'the core ran 40 padded passes (padding 6.2% of their tokens) and 0 eager' in text


def test_the_section_of_a_part_stopped_before_its_passes_were_prepared():
    data = _section_data()
    for key in ('check', 'eager_step', 'capture_s', 'pass_sizes', 'cuda_graphs', 'capacity'):
        del data[key]
    data['steps'] = []
    text = '\n'.join(oft.section(data))
    assert 'CUDA graphs on)' in text and 'Padded passes' not in text and '| robots' not in text
