"""Reading a LeRobot pi0 / pi0.5 folder: its spec, its sizes, and what it refuses."""

from __future__ import annotations

import json
import shutil
import struct

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from vla_sched.model.config.checkpoint_spec import CheckpointError
from vla_sched.model.families.pi0.checkpoint import (
    GEMMA_VARIANTS,
    PI0_REAL_SIZES,
    TINY_PI0_SIZES,
    GemmaSize,
    Pi0Sizes,
    pi0_weight_shapes,
    read_pi0_spec,
)
from vla_sched.testing.pi0_writer import write_pi0_checkpoint


@pytest.fixture(scope='module')
def pi0_folder(tmp_path_factory):
    return write_pi0_checkpoint(tmp_path_factory.mktemp('pi0'), policy_type='pi0')


@pytest.fixture(scope='module')
def pi05_folder(tmp_path_factory):
    return write_pi0_checkpoint(tmp_path_factory.mktemp('pi05'), policy_type='pi05')


@pytest.fixture
def copy_of(tmp_path):
    def make(folder):
        target = tmp_path / 'copy'
        shutil.copytree(folder, target)
        return target

    return make


def _edit_json(path, **changes):
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


def _refusal(folder) -> str:
    with pytest.raises(CheckpointError) as info:
        read_pi0_spec(folder)
    return str(info.value)


def _write_header_only(path, shapes, dtype='BF16'):
    """A safetensors file whose header names ``shapes`` (the reader never reads the data)."""
    header = {'__metadata__': {'format': 'pt'}}
    for name, shape in shapes.items():
        header['model.' + name] = {'dtype': dtype, 'shape': list(shape), 'data_offsets': [0, 0]}
    data = json.dumps(header).encode()
    path.write_bytes(struct.pack('<Q', len(data)) + data)


def test_pi0_spec_reads_features_sizes_and_mean_std_statistics(pi0_folder):
    spec = read_pi0_spec(pi0_folder)
    assert spec.policy_type == 'pi0'
    assert spec.camera_keys == ('observation.images.image', 'observation.images.image2')
    assert (spec.state_dim, spec.action_dim, spec.max_state_dim, spec.max_action_dim) == (
        8,
        7,
        32,
        32,
    )
    assert (spec.chunk_size, spec.n_action_steps, spec.num_inference_steps) == (4, 4, 3)
    assert spec.sizes == TINY_PI0_SIZES and spec.num_image_tokens == 16
    assert (spec.tokenizer_max_length, spec.image_size, spec.dtype) == (48, 56, 'bfloat16')
    assert (spec.min_period, spec.max_period) == (0.004, 4.0)
    assert (spec.state_mode, spec.action_mode) == ('MEAN_STD', 'MEAN_STD')
    stats = load_file(
        str(pi0_folder / 'policy_postprocessor_step_0_unnormalizer_processor.safetensors')
    )
    assert set(spec.action_statistics) == {'mean', 'std'}
    np.testing.assert_array_equal(spec.action_statistics['std'], stats['action.std'])
    assert spec.state_statistics['mean'].dtype == np.float32


def test_pi05_spec_reads_quantiles_and_its_prompt_length(pi05_folder):
    spec = read_pi0_spec(pi05_folder)
    assert spec.policy_type == 'pi05' and spec.tokenizer_max_length == 200
    assert (spec.state_mode, spec.action_mode) == ('QUANTILES', 'QUANTILES')
    assert set(spec.state_statistics) == {'q01', 'q99'}
    assert spec.state_statistics['q99'].shape == (8,)


def test_variant_names_map_to_the_real_sizes_checked_against_the_header(pi05_folder, copy_of):
    folder = copy_of(pi05_folder)
    (folder / 'model_sizes.json').unlink()
    _edit_json(folder / 'config.json', image_resolution=[224, 224])
    shapes = pi0_weight_shapes('pi05', PI0_REAL_SIZES, max_state_dim=32, max_action_dim=32)
    _write_header_only(folder / 'model.safetensors', shapes)
    spec = read_pi0_spec(folder)
    assert spec.paligemma == GEMMA_VARIANTS['gemma_2b'] == GemmaSize(2048, 18, 16384, 8, 1, 256)
    assert spec.expert == GEMMA_VARIANTS['gemma_300m'] == GemmaSize(1024, 18, 4096, 8, 1, 256)
    assert (spec.vision.hidden_size, spec.vision.num_layers, spec.vision.intermediate_size) == (
        1152,
        27,
        4304,
    )
    assert (spec.vision.num_heads, spec.vocab_size, spec.num_image_tokens) == (16, 257152, 256)


def test_tiny_weights_without_their_sizes_file_are_refused_naming_a_tensor(pi0_folder, copy_of):
    folder = copy_of(pi0_folder)
    (folder / 'model_sizes.json').unlink()
    message = _refusal(folder)
    assert 'paligemma_variant' in message and 'shape' in message and 'model.' in message


def test_sizes_file_is_checked_against_the_tensor_shapes(pi0_folder, copy_of):
    folder = copy_of(pi0_folder)
    sizes = json.loads((folder / 'model_sizes.json').read_text())
    sizes['paligemma']['mlp_dim'] = 96
    (folder / 'model_sizes.json').write_text(json.dumps(sizes))
    message = _refusal(folder)
    assert 'layers.0.mlp.gate_proj.weight' in message and 'model_sizes.json' in message
    assert '[128, 64]' in message and '[96, 64]' in message


def test_sizes_file_image_size_must_match_the_config(pi0_folder, copy_of):
    folder = copy_of(pi0_folder)
    sizes = json.loads((folder / 'model_sizes.json').read_text())
    sizes['vision']['image_size'] = 28
    (folder / 'model_sizes.json').write_text(json.dumps(sizes))
    assert 'image_resolution' in _refusal(folder)


def test_pi0_weights_in_a_pi05_folder_are_refused_naming_a_tensor(
    pi0_folder, pi05_folder, copy_of
):
    folder = copy_of(pi05_folder)
    shutil.copy(pi0_folder / 'model.safetensors', folder / 'model.safetensors')
    message = _refusal(folder)
    assert 'model.paligemma_with_expert.gemma_expert.model.layers.0.input_layernorm' in message


@pytest.mark.parametrize('policy_type', ['act', 'smolvla', None])
def test_unknown_type_is_refused_naming_it(pi0_folder, copy_of, policy_type):
    folder = copy_of(pi0_folder)
    _edit_json(folder / 'config.json', type=policy_type)
    assert f'type {policy_type!r}' in _refusal(folder)


@pytest.mark.parametrize(
    'name',
    [
        'config.json',
        'model.safetensors',
        'policy_preprocessor.json',
        'policy_postprocessor.json',
        'policy_preprocessor_step_5_normalizer_processor.safetensors',
        'policy_postprocessor_step_0_unnormalizer_processor.safetensors',
    ],
)
def test_a_missing_file_is_refused_naming_it(pi0_folder, copy_of, name):
    folder = copy_of(pi0_folder)
    (folder / name).unlink()
    assert name in _refusal(folder)


def test_unknown_variant_is_refused_naming_the_field(pi0_folder, copy_of):
    folder = copy_of(pi0_folder)
    (folder / 'model_sizes.json').unlink()
    _edit_json(folder / 'config.json', action_expert_variant='gemma_7b')
    message = _refusal(folder)
    assert 'action_expert_variant' in message and 'gemma_7b' in message


@pytest.mark.parametrize(
    ('changes', 'named'),
    [
        ({'use_relative_actions': True}, 'use_relative_actions'),
        ({'training_time_rtc_enabled': True}, 'training_time_rtc_enabled'),
        ({'empty_cameras': 1}, 'empty_cameras'),
        ({'n_obs_steps': 2}, 'n_obs_steps'),
        ({'image_resolution': [56, 64]}, 'image_resolution'),
        ({'tokenizer_max_length': 64}, 'max_length'),
    ],
)
def test_options_not_served_are_refused_naming_the_field(pi0_folder, copy_of, changes, named):
    folder = copy_of(pi0_folder)
    _edit_json(folder / 'config.json', **changes)
    assert named in _refusal(folder)


@pytest.mark.parametrize('enabled', [False, True])
def test_an_inference_rtc_config_is_served_the_robots_settings_decide(
    pi0_folder, copy_of, enabled
):
    folder = copy_of(pi0_folder)
    _edit_json(folder / 'config.json', rtc_config={'enabled': enabled, 'execution_horizon': 10})
    assert read_pi0_spec(folder).policy_type == 'pi0'


def test_a_relative_action_processor_step_is_refused(pi0_folder, copy_of):
    folder = copy_of(pi0_folder)
    pre = json.loads((folder / 'policy_preprocessor.json').read_text())
    pre['steps'].insert(2, {'registry_name': 'relative_actions_processor', 'config': {}})
    (folder / 'policy_preprocessor.json').write_text(json.dumps(pre))
    assert 'relative_actions_processor' in _refusal(folder)


def test_missing_statistics_for_the_mode_are_refused_naming_them(pi05_folder, copy_of):
    folder = copy_of(pi05_folder)
    path = folder / 'policy_postprocessor_step_0_unnormalizer_processor.safetensors'
    stats = load_file(str(path))
    del stats['action.q99']
    save_file(stats, str(path))
    message = _refusal(folder)
    assert 'action.q99' in message and 'QUANTILES' in message


def test_statistics_of_the_wrong_size_are_refused(pi0_folder, copy_of):
    folder = copy_of(pi0_folder)
    path = folder / 'policy_preprocessor_step_5_normalizer_processor.safetensors'
    stats = load_file(str(path))
    stats['observation.state.std'] = np.ones(6, dtype=np.float32)
    save_file(stats, str(path))
    assert 'observation.state.std' in _refusal(folder)


def test_normalization_disagreeing_with_the_processor_files_is_refused(pi0_folder, copy_of):
    folder = copy_of(pi0_folder)
    mapping = {'VISUAL': 'IDENTITY', 'STATE': 'QUANTILES', 'ACTION': 'MEAN_STD'}
    _edit_json(folder / 'config.json', normalization_mapping=mapping)
    assert 'normalization_mapping STATE' in _refusal(folder)


def test_normalized_images_are_refused(pi0_folder, copy_of):
    folder = copy_of(pi0_folder)
    pre = json.loads((folder / 'policy_preprocessor.json').read_text())
    pre['steps'][5]['config']['norm_map']['VISUAL'] = 'MEAN_STD'
    (folder / 'policy_preprocessor.json').write_text(json.dumps(pre))
    assert 'IDENTITY' in _refusal(folder)


def test_pi0_without_its_newline_step_is_refused(pi0_folder, copy_of):
    folder = copy_of(pi0_folder)
    pre = json.loads((folder / 'policy_preprocessor.json').read_text())
    pre['steps'] = [s for s in pre['steps'] if s['registry_name'] != 'pi0_new_line_processor']
    (folder / 'policy_preprocessor.json').write_text(json.dumps(pre))
    assert 'pi0_new_line_processor' in _refusal(folder)


def test_sizes_whose_expert_differs_in_depth_are_invalid():
    expert = GemmaSize(width=32, depth=3, mlp_dim=64, num_heads=4, num_kv_heads=1, head_dim=16)
    with pytest.raises(ValueError, match='depth'):
        Pi0Sizes(TINY_PI0_SIZES.paligemma, expert, TINY_PI0_SIZES.vision, 512)
