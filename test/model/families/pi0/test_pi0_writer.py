"""The tiny pi0 / pi0.5 writer writes LeRobot's files, names, shapes and dtypes."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from safetensors.numpy import load_file

from vla_sched.model.families.pi0.checkpoint import (
    EMBEDDING_NAME,
    LANGUAGE_PREFIX,
    TINY_PI0_SIZES,
    pi0_weight_shapes,
)
from vla_sched.testing.paligemma_tokenizer_files import (
    BOS_TOKEN_ID,
    EOS_TOKEN_ID,
    PAD_TOKEN_ID,
)
from vla_sched.testing.pi0_writer import write_pi0_checkpoint

EXPERT = 'model.paligemma_with_expert.gemma_expert.'


def _header(path):
    with safe_open(str(path), framework='pt') as f:
        names = f.keys()
        return {k: f.get_slice(k) for k in names}, f.metadata()


@pytest.fixture(scope='module', params=['pi0', 'pi05'])
def folder(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    return write_pi0_checkpoint(path, policy_type=request.param, tokenizer=True)


def test_folder_holds_lerobot_files(folder):
    config = json.loads((folder / 'config.json').read_text())
    names = {p.name for p in folder.iterdir()}
    pre = json.loads((folder / 'policy_preprocessor.json').read_text())
    post = json.loads((folder / 'policy_postprocessor.json').read_text())
    state_files = [s['state_file'] for s in pre['steps'] + post['steps'] if 'state_file' in s]
    assert {'config.json', 'model.safetensors', 'model_sizes.json', *state_files} <= names
    assert config['type'] in ('pi0', 'pi05')
    assert config['tokenizer_max_length'] == {'pi0': 48, 'pi05': 200}[config['type']]
    assert config['image_resolution'] == [56, 56]
    assert list(config['input_features']) == [
        'observation.images.image',
        'observation.images.image2',
        'observation.state',
    ]
    assert config['output_features']['action']['shape'] == [7]
    assert config['rtc_config'] is None
    mode = {'pi0': 'MEAN_STD', 'pi05': 'QUANTILES'}[config['type']]
    assert config['normalization_mapping'] == {'VISUAL': 'IDENTITY', 'STATE': mode, 'ACTION': mode}


def test_statistics_are_flat_float32_per_feature(folder):
    pre = json.loads((folder / 'policy_preprocessor.json').read_text())
    (step,) = [s for s in pre['steps'] if s['registry_name'] == 'normalizer_processor']
    stats = load_file(str(folder / step['state_file']))
    for stat in ('mean', 'std', 'min', 'max', 'q01', 'q99'):
        assert stats[f'observation.state.{stat}'].shape == (8,)
        assert stats[f'action.{stat}'].shape == (7,)
        assert stats[f'action.{stat}'].dtype == 'float32'


def test_tensor_names_and_shapes_are_lerobots(folder):
    config = json.loads((folder / 'config.json').read_text())
    tensors, _ = _header(folder / 'model.safetensors')
    expected = pi0_weight_shapes(
        config['type'], TINY_PI0_SIZES, max_state_dim=32, max_action_dim=32
    )
    assert {k: tuple(s.get_shape()) for k, s in tensors.items()} == {
        'model.' + k: v for k, v in expected.items()
    }
    vision = 'model.paligemma_with_expert.paligemma.model.vision_tower.vision_model.'
    assert tensors[vision + 'embeddings.patch_embedding.weight'].get_shape() == [32, 3, 14, 14]
    assert tensors[vision + 'embeddings.position_embedding.weight'].get_shape() == [16, 32]
    proj = 'model.paligemma_with_expert.paligemma.model.multi_modal_projector.linear.weight'
    assert tensors[proj].get_shape() == [64, 32]
    assert tensors[EXPERT + 'lm_head.weight'].get_shape() == [512, 32]


def test_pi0_and_pi05_heads_differ_as_lerobots(folder):
    config = json.loads((folder / 'config.json').read_text())
    tensors, _ = _header(folder / 'model.safetensors')
    norm = EXPERT + 'model.layers.1.post_attention_layernorm.'
    if config['type'] == 'pi0':
        assert tensors['model.state_proj.weight'].get_shape() == [32, 32]
        assert tensors['model.action_time_mlp_in.weight'].get_shape() == [32, 64]
        assert norm + 'weight' in tensors and EXPERT + 'model.norm.weight' in tensors
        assert not any('time_mlp_in' in k and 'action' not in k for k in tensors)
    else:
        assert 'model.state_proj.weight' not in tensors
        assert tensors['model.time_mlp_in.weight'].get_shape() == [32, 32]
        assert tensors[norm + 'dense.weight'].get_shape() == [96, 32]
        assert tensors[EXPERT + 'model.norm.dense.bias'].get_shape() == [96]
        assert norm + 'weight' not in tensors
    language_norm = 'model.' + LANGUAGE_PREFIX + 'layers.0.input_layernorm.weight'
    assert tensors[language_norm].get_shape() == [64]


def test_tied_embedding_is_stored_once_as_lm_head(folder):
    tensors, metadata = _header(folder / 'model.safetensors')
    embed = 'model.' + LANGUAGE_PREFIX + 'embed_tokens.weight'
    assert embed not in tensors
    assert tensors['model.' + EMBEDDING_NAME].get_shape() == [512, 64]
    assert metadata[embed] == 'model.' + EMBEDDING_NAME


def test_mixed_dtypes_follow_lerobots_bfloat16_folders(folder):
    tensors, _ = _header(folder / 'model.safetensors')
    dtypes = {k: s.get_dtype() for k, s in tensors.items()}
    assert dtypes['model.' + EMBEDDING_NAME] == 'BF16'
    assert dtypes['model.' + LANGUAGE_PREFIX + 'layers.0.self_attn.q_proj.weight'] == 'BF16'
    assert dtypes[EXPERT + 'model.layers.0.mlp.down_proj.weight'] == 'BF16'
    assert dtypes['model.' + LANGUAGE_PREFIX + 'layers.0.input_layernorm.weight'] == 'F32'
    assert dtypes['model.action_out_proj.weight'] == 'F32'
    vision = [d for k, d in dtypes.items() if 'vision_tower' in k or 'multi_modal' in k]
    assert set(vision) == {'F32'}


def test_float32_option_stores_everything_in_float32(tmp_path):
    folder = write_pi0_checkpoint(tmp_path, policy_type='pi05', weights_dtype='float32')
    tensors, _ = _header(folder / 'model.safetensors')
    assert {s.get_dtype() for s in tensors.values()} == {'F32'}
    assert json.loads((folder / 'config.json').read_text())['dtype'] == 'float32'


def test_same_seed_same_weights_other_seed_other_weights(tmp_path):
    from safetensors.torch import load_file as load_tensors

    a, b, c = (
        load_tensors(str(write_pi0_checkpoint(tmp_path / name, seed=seed) / 'model.safetensors'))
        for name, seed in (('a', 3), ('b', 3), ('c', 4))
    )
    name = 'model.action_in_proj.weight'
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a[name], c[name])


def test_weights_are_finite_and_of_moderate_scale(folder):
    with safe_open(str(folder / 'model.safetensors'), framework='pt') as f:
        names = f.keys()
        for name in names:
            t = f.get_tensor(name).float()
            assert torch.isfinite(t).all(), name
            assert t.abs().max() < 10.0, name


def test_tokenizer_has_paligemma_special_ids_and_the_model_vocab(folder):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder / 'tokenizer')
    assert len(tokenizer) == TINY_PI0_SIZES.vocab_size
    assert (tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.bos_token_id) == (
        PAD_TOKEN_ID,
        EOS_TOKEN_ID,
        BOS_TOKEN_ID,
    )
    ids = tokenizer('pick up the red block\n')['input_ids']
    assert ids[0] == BOS_TOKEN_ID and len(ids) == 7
    assert tokenizer.decode(ids, skip_special_tokens=True) == 'pick up the red block\n'
    prompt = 'Task: pick up the cup, State: 12 250 -1;\nAction: '
    assert tokenizer.decode(tokenizer(prompt)['input_ids'][1:]) == prompt
