"""The OpenVLA-format writer: files, config fields, tensor names and shapes, tokenizer ids."""

from __future__ import annotations

import json
import math

import pytest
from safetensors import safe_open

from vla_sched.model.config.presets import openvla_7b_config, openvla_config
from vla_sched.testing.openvla_writer import (
    openvla_tensor_shapes,
    write_openvla_checkpoint,
)

FILES = {
    'config.json',
    'model.safetensors',
    'tokenizer.json',
    'tokenizer_config.json',
    'special_tokens_map.json',
    'preprocessor_config.json',
    'generation_config.json',
}
DINO = 'vision_backbone.featurizer.'
SIGLIP = 'vision_backbone.fused_featurizer.'


@pytest.fixture(scope='module')
def fused_dir(tmp_path_factory):
    return write_openvla_checkpoint(tmp_path_factory.mktemp('openvla_fused'), seed=0)


def stored_shapes(folder) -> dict[str, tuple[int, ...]]:
    shapes = {}
    for path in folder.glob('*.safetensors'):
        with safe_open(str(path), 'pt') as f:
            shapes.update({name: tuple(f.get_slice(name).get_shape()) for name in f.keys()})  # noqa: SIM118
    return shapes


def read_config(folder) -> dict:
    return json.loads((folder / 'config.json').read_text())


def test_fused_folder_holds_openvla_files_and_config_fields(fused_dir):
    assert {p.name for p in fused_dir.iterdir()} == FILES
    config = read_config(fused_dir)
    assert config['model_type'] == 'openvla'
    assert config['architectures'] == ['OpenVLAForActionPrediction']
    assert config['vision_backbone_id'] == 'dinosiglip-vit-so-224px'
    assert config['llm_backbone_id'] == 'llama2-7b-pure'
    assert config['timm_model_ids'] == [
        'vit_large_patch14_reg4_dinov2.lvd142m',
        'vit_so400m_patch14_siglip_224',
    ]
    assert config['image_sizes'] == [224, 224] and config['use_fused_vision_backbone'] is True
    assert config['image_resize_strategy'] == 'resize-naive'
    assert (config['pad_to_multiple_of'], config['n_action_bins']) == (64, 256)
    assert len(config['timm_model_args']) == 2
    stats = config['norm_stats']['bridge_orig']
    for part in ('action', 'proprio'):
        assert set(stats[part]) == {'q01', 'q99', 'mask', 'mean', 'std', 'min', 'max'}
        assert all(len(values) == 7 for values in stats[part].values())
    assert stats['action']['mask'] == [True] * 6 + [False]  # the gripper is not normalized


def test_fused_tensors_have_openvla_names_and_shapes(fused_dir):
    shapes = stored_shapes(fused_dir)
    assert shapes['language_model.model.embed_tokens.weight'] == (32064, 64)
    assert shapes['language_model.lm_head.weight'] == (32064, 64)
    assert 'language_model.model.layers.1.mlp.down_proj.weight' in shapes
    assert shapes['language_model.model.norm.weight'] == (64,)
    feature_dim = 48 + 40
    assert shapes['projector.fc1.weight'] == (4 * feature_dim, feature_dim)
    assert shapes['projector.fc2.weight'] == (64, 4 * feature_dim)
    assert shapes['projector.fc3.weight'] == (64, 64)
    assert shapes[DINO + 'cls_token'] == (1, 1, 48)
    assert shapes[DINO + 'reg_token'] == (1, 4, 48)
    assert shapes[DINO + 'pos_embed'] == (1, 256, 48)
    assert shapes[DINO + 'patch_embed.proj.weight'] == (48, 3, 14, 14)
    block = [n.removeprefix(DINO + 'blocks.2.') for n in shapes if DINO + 'blocks.2.' in n]
    assert {b.rsplit('.', 1)[0] for b in block} == {
        'norm1', 'attn.qkv', 'attn.proj', 'ls1', 'norm2', 'mlp.fc1', 'mlp.fc2', 'ls2',
    }  # fmt: skip
    assert shapes[DINO + 'blocks.0.ls1.scale_factor'] == (48,)
    assert not any(n.startswith(DINO + 'blocks.3.') for n in shapes)
    assert shapes[SIGLIP + 'pos_embed'] == (1, 256, 40)
    assert shapes[SIGLIP + 'blocks.0.mlp.fc1.weight'] == (120, 40)  # mlp_ratio 3.0
    assert shapes[SIGLIP + 'attn_pool.latent'] == (1, 1, 40)
    assert shapes[SIGLIP + 'attn_pool.kv.weight'] == (80, 40)
    for name in ('q', 'proj', 'norm', 'mlp.fc1', 'mlp.fc2'):
        assert SIGLIP + f'attn_pool.{name}.weight' in shapes
    assert not any(n.startswith(SIGLIP) and ('ls1' in n or 'cls_token' in n) for n in shapes)
    assert {SIGLIP + 'norm.weight', DINO + 'norm.bias'} <= set(shapes)


def test_text_config_is_a_diff_against_llama_defaults(fused_dir):
    from transformers import LlamaConfig

    defaults = LlamaConfig().to_dict()
    text = read_config(fused_dir)['text_config']
    assert text['model_type'] == 'llama'
    assert (text['pad_token_id'], text['vocab_size']) == (32000, 32064)
    assert all(text[key] != defaults[key] for key in text if key != 'model_type')
    real = openvla_config('fused')['text_config']
    assert real == {'model_type': 'llama', 'pad_token_id': 32000, 'vocab_size': 32064}
    assert 'timm_model_args' not in openvla_config('fused')


def test_tokenizer_has_llama_ids_and_tokenizes_prompts_into_word_pieces(fused_dir):
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(fused_dir / 'tokenizer.json'))
    assert tokenizer.token_to_id('<s>') == 1 and tokenizer.token_to_id('</s>') == 2
    assert tokenizer.token_to_id('\u2581') == 29871
    assert tokenizer.token_to_id('<PAD>') == 32000
    assert tokenizer.token_to_id('<0x0A>') == 13  # byte fallback pieces at 3..258
    assert tokenizer.get_vocab_size(with_added_tokens=False) == 32000
    prompt = 'In: What action should the robot take to pick up the block?\nOut:'
    encoding = tokenizer.encode(prompt)
    assert encoding.ids[0] == 1
    assert encoding.tokens[1:4] == ['\u2581In', ':', '\u2581What']
    assert '\u2581robot' in encoding.tokens and '<0x0A>' in encoding.tokens
    assert tokenizer.decode(encoding.ids) == prompt
    special = json.loads((fused_dir / 'special_tokens_map.json').read_text())
    assert special['pad_token']['content'] == '<PAD>'
    config = json.loads((fused_dir / 'tokenizer_config.json').read_text())
    assert (config['bos_token'], config['eos_token'], config['pad_token']) == (
        '<s>',
        '</s>',
        '<PAD>',
    )


def test_v01_folder_has_one_siglip_tower_two_layer_projector_and_sharded_statistics(tmp_path):
    folder = write_openvla_checkpoint(
        tmp_path, variant='v01', num_shards=2, statistics_file=True, datasets=('a', 'b')
    )
    config = read_config(folder)
    assert config['vision_backbone_id'] == 'siglip-vit-so400m'
    assert config['llm_backbone_id'] == 'vicuna-v15-7b'
    assert config['use_fused_vision_backbone'] is False and 'norm_stats' not in config
    assert sorted(json.loads((folder / 'dataset_statistics.json').read_text())) == ['a', 'b']
    index = json.loads((folder / 'model.safetensors.index.json').read_text())
    shapes = stored_shapes(folder)
    assert set(index['weight_map']) == set(shapes)
    assert len(set(index['weight_map'].values())) == 2
    assert shapes['projector.fc1.weight'] == (64, 40)
    assert shapes['projector.fc2.weight'] == (64, 64) and 'projector.fc3.weight' not in shapes
    assert DINO + 'attn_pool.latent' in shapes and DINO + 'reg_token' not in shapes
    assert not any(n.startswith(SIGLIP) for n in shapes)
    preprocessor = json.loads((folder / 'preprocessor_config.json').read_text())
    assert preprocessor['means'] == [[0.5, 0.5, 0.5]]


def test_same_seed_writes_the_same_weights(tmp_path, fused_dir):
    again = write_openvla_checkpoint(tmp_path / 'again', seed=0)
    other = write_openvla_checkpoint(tmp_path / 'other', seed=1)
    same = (fused_dir / 'model.safetensors').read_bytes()
    assert (again / 'model.safetensors').read_bytes() == same
    assert (other / 'model.safetensors').read_bytes() != same


def test_real_shapes_are_openvla_7b():
    shapes = openvla_tensor_shapes(openvla_7b_config())
    assert shapes['language_model.model.embed_tokens.weight'] == (32064, 4096)
    assert shapes['language_model.model.layers.31.mlp.up_proj.weight'] == (11008, 4096)
    assert shapes['projector.fc1.weight'] == (4 * 2176, 2176)
    assert shapes[DINO + 'reg_token'] == (1, 4, 1024)
    assert shapes[DINO + 'pos_embed'] == (1, 256, 1024)
    assert DINO + 'blocks.23.ls2.scale_factor' in shapes
    assert shapes[SIGLIP + 'blocks.26.mlp.fc1.weight'] == (4304, 1152)
    total = sum(math.prod(s) for s in shapes.values())
    assert 7.5e9 < total < 7.6e9  # openvla-7b: 7.54 B parameters
