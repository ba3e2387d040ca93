"""The tiny checkpoint builder and the loader's errors."""

from __future__ import annotations

import json

import pytest
import torch

from vla_sched.model.config.action_space import ActionStatisticsError
from vla_sched.model.config.architecture import UnsupportedArchitectureError
from vla_sched.model.config.checkpoint_spec import CheckpointError
from vla_sched.model.config.formats import read_checkpoint_spec
from vla_sched.model.config.presets import preset_spec
from vla_sched.model.families.openvla.action_tokenizer import ActionChunkDecoder
from vla_sched.model.loading.checkpoint import load_checkpoint
from vla_sched.model.loading.tiny_checkpoint import build_tiny_checkpoint, random_model


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
        ActionChunkDecoder.for_checkpoint(spec)
    assert spec.with_unnorm_key('other_robot').action_dim == 6
    assert ActionChunkDecoder.for_checkpoint(spec, 'tiny_sim').action_dim == 7


def test_random_model_of_the_tiny_preset_equals_the_seed_0_checkpoint(tiny_model):
    model = random_model(preset_spec('tiny'), seed=0)
    ours, saved = model.state_dict(), tiny_model.state_dict()
    assert ours.keys() == saved.keys()
    assert all(torch.equal(ours[k], saved[k]) for k in ours)


# --- OpenVLA folders (model_type "openvla"): config.json as OpenVLA saves it ---------------


def _openvla_folder(folder, *, variant='fused', tiny=True, datasets=('bridge_orig',)):
    """An OpenVLA-format folder's JSON files (config with norm_stats, tokenizer), no weights."""
    from vla_sched.model.config.presets import openvla_config, openvla_norm_stats
    from vla_sched.testing.llama_tokenizer_files import llama_like_tokenizer_json

    folder.mkdir(parents=True, exist_ok=True)
    config = openvla_config(variant, tiny=tiny, norm_stats=openvla_norm_stats(datasets))
    (folder / 'config.json').write_text(json.dumps(config))
    (folder / 'tokenizer.json').write_text(llama_like_tokenizer_json())
    return folder


def test_openvla_text_config_takes_the_missing_values_from_llama_config(tmp_path):
    from transformers import LlamaConfig

    spec = read_checkpoint_spec(_openvla_folder(tmp_path, tiny=False))
    llama = LlamaConfig()
    decoder = spec.decoder
    assert decoder.vocab_size == 32064  # given in text_config
    assert (decoder.hidden_size, decoder.num_layers) == (
        llama.hidden_size,
        llama.num_hidden_layers,
    )
    assert (decoder.num_heads, decoder.num_kv_heads, decoder.intermediate_size) == (
        llama.num_attention_heads,
        llama.num_key_value_heads,
        llama.intermediate_size,
    )
    assert decoder.rms_norm_eps == llama.rms_norm_eps == 1e-6
    assert decoder.max_position_embeddings == llama.max_position_embeddings
    assert decoder.rope.theta == llama.rope_parameters['rope_theta']
    assert decoder.tie_word_embeddings is False
    assert not (decoder.qkv_bias or decoder.o_bias or decoder.mlp_bias)


def test_openvla_tiny_text_config_keeps_its_own_dims(tmp_path):
    spec = read_checkpoint_spec(_openvla_folder(tmp_path))
    d = spec.decoder
    assert (d.hidden_size, d.num_layers, d.num_heads, d.intermediate_size) == (64, 2, 4, 128)
    assert d.rms_norm_eps == 1e-6 and d.vocab_size == 32064


def test_openvla_folder_gets_openvlas_tokens_image_span_pixels_prompt_and_decoding(tmp_path):
    spec = read_checkpoint_spec(_openvla_folder(tmp_path))
    assert spec.action_token_range == (31744, 32000)  # 32064 - pad_to_multiple_of 64
    assert (spec.action_horizon, spec.action_dim, spec.num_action_tokens) == (1, 7, 7)
    assert spec.image_token_id == 32000 and spec.num_image_tokens == 256
    pre = spec.preprocessing
    assert pre.image_size == 224 and pre.num_channels == 6
    assert pre.mean == (0.485, 0.456, 0.406, 0.5, 0.5, 0.5)
    assert pre.std == (0.229, 0.224, 0.225, 0.5, 0.5, 0.5)
    assert spec.prompt.image_first and spec.prompt.suffix == ''
    assert spec.prompt.prefix.endswith('{instruction}?\nOut:')
    assert spec.prompt.append_token_id == 29871
    assert spec.default_action_decoding == 'whole_vocab'
    assert spec.sampled_token_range(whole_vocab=True) == (0, 32064)
    assert spec.sampled_token_range(whole_vocab=False) == (31744, 32000)


def test_openvla_v01_folder_gets_one_tower_and_the_chat_prompt(tmp_path):
    spec = read_checkpoint_spec(_openvla_folder(tmp_path, variant='v01'))
    assert spec.preprocessing.mean == (0.5, 0.5, 0.5) and len(spec.vision.towers) == 1
    assert spec.prompt.prefix.startswith('A chat between a curious user')
    assert spec.prompt.prefix.endswith('{instruction}? ASSISTANT:')


def test_openvla_action_vocabulary_follows_pad_to_multiple_of_and_n_action_bins(tmp_path):
    folder = _openvla_folder(tmp_path)
    _edit_config(folder, lambda c: c.update(pad_to_multiple_of=32, n_action_bins=128))
    spec = read_checkpoint_spec(folder)
    assert spec.action_token_range == (32032 - 128, 32032)
    assert spec.action_tokens.num_bins == 128


@pytest.mark.parametrize(
    ('edit', 'error', 'message'),
    [
        (lambda c: c.pop('text_config'), UnsupportedArchitectureError, 'text_config'),
        (
            lambda c: c['text_config'].update(model_type='mistral'),
            UnsupportedArchitectureError,
            r"text_config\.model_type 'mistral'",
        ),
        (
            lambda c: c['text_config'].update(hidden_size='wide'),
            UnsupportedArchitectureError,
            'hidden_size',
        ),
        (
            lambda c: c['text_config'].update(hidden_act='gelu'),
            UnsupportedArchitectureError,
            'hidden_act',
        ),
        (
            lambda c: c.update(timm_model_ids=['vit_base_patch16_224']),
            UnsupportedArchitectureError,
            'timm_model_ids',
        ),
        (lambda c: c.update(pad_to_multiple_of=0), CheckpointError, 'pad_to_multiple_of'),
        (lambda c: c.update(n_action_bins='many'), CheckpointError, 'n_action_bins'),
        (
            lambda c: c['text_config'].update(pad_token_id=None),
            CheckpointError,
            r'text_config\.pad_token_id',
        ),
    ],
)
def test_bad_openvla_config_fields_are_refused_by_name(tmp_path, edit, error, message):
    folder = _openvla_folder(tmp_path)
    _edit_config(folder, edit)
    with pytest.raises(error, match=message):
        read_checkpoint_spec(folder)


def test_openvla_folder_without_tokenizer_is_refused(tmp_path):
    folder = _openvla_folder(tmp_path)
    (folder / 'tokenizer.json').unlink()
    with pytest.raises(CheckpointError, match=r'missing tokenizer\.json .*OpenVLA'):
        read_checkpoint_spec(folder)


def test_openvla_statistics_file_wins_over_norm_stats_in_config(tmp_path):
    from vla_sched.model.config.presets import openvla_norm_stats

    folder = _openvla_folder(tmp_path, datasets=('a', 'b'))
    assert sorted(read_checkpoint_spec(folder).action_statistics) == ['a', 'b']
    (folder / 'dataset_statistics.json').write_text(json.dumps(openvla_norm_stats(('libero',))))
    spec = read_checkpoint_spec(folder)
    assert sorted(spec.action_statistics) == ['libero'] and spec.action_dim == 7


def test_openvla_folder_reads_an_unnorm_key_from_vla_config_and_refuses_other_keys(tmp_path):
    folder = _openvla_folder(tmp_path, datasets=('a', 'b'))
    (folder / 'vla_config.json').write_text(json.dumps({'unnorm_key': 'b'}))
    assert read_checkpoint_spec(folder).unnorm_key == 'b'
    (folder / 'vla_config.json').write_text(json.dumps({'action_horizon': 4}))
    with pytest.raises(CheckpointError, match=r"\['action_horizon'\]"):
        read_checkpoint_spec(folder)


def _tie_in_config(config) -> None:
    config['tie_word_embeddings'] = True
    config['text_config']['tie_word_embeddings'] = True


def test_a_stored_head_that_differs_from_the_tied_embedding_is_kept_as_transformers_does(
    tmp_path, caplog
):
    from safetensors.torch import load_file

    folder = build_tiny_checkpoint(tmp_path)
    _edit_config(folder, _tie_in_config)
    stored = load_file(folder / 'model.safetensors')['lm_head.weight']
    with caplog.at_level('WARNING'):
        model = load_checkpoint(folder)
    assert model.decoder.lm_head is not None
    assert torch.equal(model.decoder.lm_head.weight, stored)
    assert not model.spec.decoder.tie_word_embeddings
    assert 'lm_head.weight' in caplog.text


def test_a_stored_head_equal_to_the_embedding_stays_tied(tmp_path):
    from safetensors.torch import load_file, save_file

    folder = build_tiny_checkpoint(tmp_path)
    _edit_config(folder, _tie_in_config)
    tensors = load_file(folder / 'model.safetensors')
    tensors['lm_head.weight'] = tensors['model.language_model.embed_tokens.weight'].clone()
    save_file(tensors, folder / 'model.safetensors')
    model = load_checkpoint(folder)
    assert model.decoder.lm_head is None and model.spec.decoder.tie_word_embeddings
