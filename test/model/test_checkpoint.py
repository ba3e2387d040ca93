"""The tiny checkpoint builder and the loader's errors."""

from __future__ import annotations

import json

import pytest
import torch

from vla_sched.model.action_tokenizer import ActionStatisticsError
from vla_sched.model.architecture import UnsupportedArchitectureError
from vla_sched.model.checkpoint import load_checkpoint
from vla_sched.model.checkpoint_spec import CheckpointError, read_checkpoint_spec
from vla_sched.model.presets import preset_spec
from vla_sched.model.tiny_checkpoint import build_tiny_checkpoint, random_model


def _edit_config(folder, edit) -> None:
    path = folder / 'config.json'
    config = json.loads(path.read_text())
    edit(config)
    path.write_text(json.dumps(config))


def test_builder_is_deterministic_and_seeded(tmp_path):
    a = build_tiny_checkpoint(tmp_path / 'a', seed=3)
    b = build_tiny_checkpoint(tmp_path / 'b', seed=3)
    c = build_tiny_checkpoint(tmp_path / 'c', seed=4)
    for name in ('model.safetensors', 'tokenizer.json', 'config.json', 'vla_config.json'):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    assert (a / 'model.safetensors').read_bytes() != (c / 'model.safetensors').read_bytes()


def test_spec_reports_image_tokens_action_range_horizon_and_dof(tiny_dir):
    spec = read_checkpoint_spec(tiny_dir)
    assert spec.num_image_tokens == 16
    assert spec.action_token_range == (260, 516)
    assert (spec.action_horizon, spec.action_dim, spec.num_action_tokens) == (1, 7, 7)
    assert spec.decoder.vocab_size == 520  # padded beyond the tokenizer's 516 + <image>


def test_openvla_preset_has_openvla_dimensions():
    spec = preset_spec('openvla-7b')
    assert spec.num_image_tokens == 256
    assert spec.action_token_range == (31744, 32000)
    assert spec.action_dim == 7
    assert 6.6e9 < spec.decoder.num_params() < 6.8e9


def test_sharded_checkpoint_loads_the_same_weights(tmp_path, tiny_model):
    folder = build_tiny_checkpoint(tmp_path, seed=0, num_shards=3)
    sharded = load_checkpoint(folder)
    ours, theirs = tiny_model.state_dict(), sharded.state_dict()
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)


def test_missing_shard_is_named(tmp_path):
    folder = build_tiny_checkpoint(tmp_path, num_shards=2)
    (folder / 'model-00002-of-00002.safetensors').unlink()
    with pytest.raises(CheckpointError, match=r'missing shard model-00002-of-00002\.safetensors'):
        load_checkpoint(folder)


def test_shape_mismatch_names_the_tensor(tmp_path):
    folder = build_tiny_checkpoint(tmp_path)
    _edit_config(folder, lambda c: c['text_config'].update(intermediate_size=96))
    with pytest.raises(CheckpointError, match=r'shape mismatch for .*mlp\.\w+_proj\.weight'):
        load_checkpoint(folder)


def test_missing_tensor_is_named(tmp_path):
    folder = build_tiny_checkpoint(tmp_path)
    _edit_config(folder, lambda c: c['text_config'].update(num_hidden_layers=3))
    with pytest.raises(CheckpointError, match=r'lacks 9 tensors, e.g. \[.layers\.2\.'):
        load_checkpoint(folder)


@pytest.mark.parametrize(
    ('edit', 'message'),
    [
        (lambda c: c.update(model_type='idefics3'), "model_type='idefics3'"),
        (lambda c: c['text_config'].update(model_type='gemma'), "'gemma' is not supported"),
        (lambda c: c['vision_config'].update(model_type='dinov2'), "'dinov2' is not supported"),
        (
            lambda c: c['text_config'].update(rope_parameters={'rope_type': 'yarn'}),
            "rope_type 'yarn'",
        ),
    ],
)
def test_unsupported_architectures_are_refused(tmp_path, edit, message):
    folder = build_tiny_checkpoint(tmp_path)
    _edit_config(folder, edit)
    with pytest.raises(UnsupportedArchitectureError, match=message):
        load_checkpoint(folder)


def test_missing_action_statistics_are_reported(tmp_path):
    folder = build_tiny_checkpoint(tmp_path)
    (folder / 'dataset_statistics.json').unlink()
    with pytest.raises(ActionStatisticsError, match='missing action statistics'):
        read_checkpoint_spec(folder)


def test_statistics_inside_config_json_are_used_as_openvla_ships_them(tmp_path):
    folder = build_tiny_checkpoint(tmp_path)
    stats = json.loads((folder / 'dataset_statistics.json').read_text())
    (folder / 'dataset_statistics.json').unlink()
    _edit_config(folder, lambda c: c.update(norm_stats=stats))
    assert read_checkpoint_spec(folder).action_dim == 7


def test_pickle_weights_are_never_loaded(tmp_path):
    folder = build_tiny_checkpoint(tmp_path)
    (folder / 'model.safetensors').rename(folder / 'pytorch_model.bin')
    with pytest.raises(CheckpointError, match='only pickle weights'):
        load_checkpoint(folder)


def test_missing_config_is_reported(tmp_path):
    folder = build_tiny_checkpoint(tmp_path)
    (folder / 'config.json').unlink()
    with pytest.raises(CheckpointError, match=r'missing config\.json'):
        load_checkpoint(folder)


def test_legacy_llava_tensor_names_load(tmp_path, tiny_model):
    from safetensors.torch import load_file, save_file

    folder = build_tiny_checkpoint(tmp_path)
    tensors = load_file(folder / 'model.safetensors')
    renamed = {}
    for name, tensor in tensors.items():
        name = name.replace('model.language_model.', 'language_model.model.')
        name = name.replace('model.vision_tower.', 'vision_tower.vision_model.')
        name = name.replace('model.multi_modal_projector.', 'multi_modal_projector.')
        renamed[name.replace('lm_head.', 'language_model.lm_head.')] = tensor
    save_file(renamed, folder / 'model.safetensors')
    legacy = load_checkpoint(folder).state_dict()
    assert all(torch.equal(legacy[k], v) for k, v in tiny_model.state_dict().items())


def test_several_datasets_need_an_unnorm_key_before_actions_decode(tmp_path):
    folder = build_tiny_checkpoint(tmp_path)
    stats = json.loads((folder / 'dataset_statistics.json').read_text())
    stats['other_robot'] = {'action': {'q01': [0.0] * 6, 'q99': [1.0] * 6}}
    (folder / 'dataset_statistics.json').write_text(json.dumps(stats))
    vla = json.loads((folder / 'vla_config.json').read_text())
    vla.pop('unnorm_key')
    (folder / 'vla_config.json').write_text(json.dumps(vla))
    spec = read_checkpoint_spec(folder)
    with pytest.raises(ActionStatisticsError, match='pass an unnorm_key'):
        spec.action_decoder()
    assert spec.with_unnorm_key('other_robot').action_dim == 6
    assert spec.action_decoder('tiny_sim').action_dim == 7


def test_random_model_of_the_tiny_preset_equals_the_seed_0_checkpoint(tiny_model):
    model = random_model(preset_spec('tiny'), seed=0)
    ours, saved = model.state_dict(), tiny_model.state_dict()
    assert ours.keys() == saved.keys()
    assert all(torch.equal(ours[k], saved[k]) for k in ours)
