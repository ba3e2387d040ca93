"""Reading a SmolVLA folder with its VLM's config: the sizes LeRobot derives (the expert's
width and MLP, the cross-attention layers, the image tokens), the real folder's numbers, and
refusals that name what disagrees."""

from __future__ import annotations

import json

import pytest

from vla_sched.model.config.checkpoint_spec import CheckpointError
from vla_sched.model.families.smolvla.checkpoint import (
    cross_layer_indices,
    expert_intermediate_size,
    read_smolvla_spec,
    read_vlm_sizes,
    smolvla_weight_shapes,
)
from vla_sched.testing.smolvla_writer import write_smolvla_checkpoint
from vla_sched.testing.smolvlm_files import smolvlm_config


@pytest.fixture()
def folder(tmp_path):
    return write_smolvla_checkpoint(tmp_path / 'tiny', seed=1)


def _edit(path, **fields):
    data = json.loads(path.read_text())
    data.update(fields)
    path.write_text(json.dumps(data))


def test_the_spec_holds_the_sizes_lerobot_derives_from_the_vlm_config(folder):
    spec = read_smolvla_spec(folder, vlm_folder=folder / 'vlm')
    sizes = spec.sizes
    assert sizes.text.depth == 4  # num_vlm_layers of the VLM's 6
    assert (sizes.expert.width, sizes.expert.mlp_dim) == (48, 256)  # int(64 * 0.75)
    assert sizes.cross_layers == (1, 3)  # every odd layer with self_attn_every_n_layers 2
    assert spec.num_image_tokens == 4  # (32 / 8) ** 2 patches / 2 ** 2
    assert spec.camera_keys == ('observation.images.top', 'observation.images.wrist')
    assert (spec.state_dim, spec.action_dim, spec.num_inference_steps) == (6, 6, 3)
    assert spec.state_statistics['mean'].shape == (6,)


def test_the_real_smolvla_base_sizes_give_lerobots_numbers(tmp_path):
    config = smolvlm_config()
    config['scale_factor'] = 4
    config['text_config'].update(
        hidden_size=960, num_hidden_layers=32, num_attention_heads=15, num_key_value_heads=5,
        head_dim=64, intermediate_size=2560, vocab_size=49280,
    )  # fmt: skip
    config['vision_config'].update(
        hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
        patch_size=16, image_size=512,
    )  # fmt: skip
    (tmp_path / 'config.json').write_text(json.dumps(config))
    sizes = read_vlm_sizes(
        tmp_path, num_vlm_layers=16, expert_width_multiplier=0.75, attention_mode='cross_attn',
        self_attn_every_n_layers=2, image_size=512,
    )  # fmt: skip
    assert (sizes.expert.width, sizes.expert.mlp_dim) == (720, 2048)
    assert sizes.num_image_tokens == 64
    assert len(sizes.cross_layers) == 8
    shapes = smolvla_weight_shapes(sizes, max_state_dim=32, max_action_dim=32)
    assert shapes['vlm_with_expert.vlm.model.connector.modality_projection.proj.weight'] == (
        960,
        12288,
    )
    assert shapes['vlm_with_expert.lm_expert.layers.1.self_attn.k_proj.weight'] == (320, 320)
    assert shapes['vlm_with_expert.lm_expert.layers.0.self_attn.k_proj.weight'] == (320, 720)
    assert shapes['state_proj.weight'] == (960, 32)
    assert not any('text_model.layers.16.' in name for name in shapes)


def test_lerobots_intermediate_size_and_layer_pattern():
    assert expert_intermediate_size(720) == 2048
    assert expert_intermediate_size(48) == 256
    assert cross_layer_indices(4, attention_mode='self_attn', every_n=2) == ()
    assert cross_layer_indices(4, attention_mode='cross_attn', every_n=0) == (0, 1, 2, 3)


def test_a_missing_vlm_config_is_refused_naming_the_repository(folder, tmp_path):
    with pytest.raises(CheckpointError, match=r'SmolVLM2-500M-Video-Instruct'):
        read_smolvla_spec(folder, vlm_folder=tmp_path / 'nowhere')


def test_more_vlm_layers_than_the_vlm_has_are_refused(folder):
    _edit(folder / 'config.json', num_vlm_layers=7)
    with pytest.raises(CheckpointError, match=r'num_vlm_layers 7 is not 1\.\.6'):
        read_smolvla_spec(folder, vlm_folder=folder / 'vlm')


def test_weights_of_another_vlm_config_are_refused_naming_the_tensor(folder):
    _edit(folder / 'config.json', expert_width_multiplier=0.5)
    with pytest.raises(CheckpointError, match=r'lm_expert\.layers\.0\..* has shape'):
        read_smolvla_spec(folder, vlm_folder=folder / 'vlm')


def test_an_image_size_other_than_the_towers_is_refused(folder):
    _edit(folder / 'config.json', resize_imgs_with_padding=[64, 64])
    with pytest.raises(CheckpointError, match=r'resize_imgs_with_padding 64 .* image_size 32'):
        read_smolvla_spec(folder, vlm_folder=folder / 'vlm')


@pytest.mark.parametrize(
    ('field', 'value', 'message'),
    [
        ('add_image_special_tokens', True, r'add_image_special_tokens True is not served'),
        ('adapt_to_pi_aloha', True, r'adapt_to_pi_aloha True is not served'),
        ('empty_cameras', 1, r'empty_cameras 1 is not served'),
        ('num_expert_layers', 2, r'num_expert_layers 2 differs from num_vlm_layers 4'),
    ],
)
def test_options_that_change_the_computation_are_refused(folder, field, value, message):
    _edit(folder / 'config.json', **{field: value})
    with pytest.raises(CheckpointError, match=message):
        read_smolvla_spec(folder, vlm_folder=folder / 'vlm')


def test_an_inference_time_rtc_config_is_served(folder):
    """LeRobot's rtc_config is real-time chunking at inference, which the engine does with its
    own rtc_* settings: the folder is read as without it."""
    _edit(folder / 'config.json', rtc_config={'enabled': True, 'execution_horizon': 10})
    assert read_smolvla_spec(folder, vlm_folder=folder / 'vlm').policy_type == 'smolvla'


def test_a_tokenizer_length_other_than_the_configs_is_refused(folder):
    path = folder / 'policy_preprocessor.json'
    pre = json.loads(path.read_text())
    for step in pre['steps']:
        if step['registry_name'] == 'tokenizer_processor':
            step['config']['max_length'] = 30
    path.write_text(json.dumps(pre))
    with pytest.raises(CheckpointError, match=r'max_length 30 disagrees .* 48'):
        read_smolvla_spec(folder, vlm_folder=folder / 'vlm')


def test_a_missing_statistics_file_is_refused_naming_it(folder):
    (folder / 'policy_postprocessor_step_0_unnormalizer_processor.safetensors').unlink()
    with pytest.raises(CheckpointError, match=r'missing policy_postprocessor_step_0'):
        read_smolvla_spec(folder, vlm_folder=folder / 'vlm')
