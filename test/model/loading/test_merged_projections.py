"""Checkpoints keep q/k/v and gate/up apart; the decoder holds them merged, rows in order."""

from __future__ import annotations

import dataclasses

import torch

from vla_sched.model.config.presets import preset_spec
from vla_sched.model.loading.checkpoint import load_checkpoint
from vla_sched.model.loading.tiny_checkpoint import build_tiny_checkpoint
from vla_sched.model.loading.weights import (
    checkpoint_views,
    decoder_merge_plan,
    decoder_shapes,
    merged_row_splits,
)


def test_merge_plan_concatenates_q_k_v_and_gate_up_in_order_with_their_biases():
    decoder = preset_spec('tiny').decoder
    spec = dataclasses.replace(decoder, qkv_bias=True, mlp_bias=True, num_layers=2)
    plan = decoder_merge_plan(reversed(list(decoder_shapes(spec))))
    attn, mlp = 'layers.1.self_attn.', 'layers.1.mlp.'
    assert plan[attn + 'qkv_proj.bias'] == tuple(f'{attn}{p}_proj.bias' for p in 'qkv')
    assert plan[attn + 'qkv_proj.weight'] == tuple(f'{attn}{p}_proj.weight' for p in 'qkv')
    assert plan[mlp + 'gate_up_proj.bias'] == (mlp + 'gate_proj.bias', mlp + 'up_proj.bias')
    assert plan[mlp + 'down_proj.weight'] == (mlp + 'down_proj.weight',)
    assert plan['layers.0.input_layernorm.weight'] == ('layers.0.input_layernorm.weight',)
    assert plan['embed_tokens.weight'] == ('embed_tokens.weight',)
    assert sum(len(parts) for parts in plan.values()) == len(decoder_shapes(spec))


def test_loaded_qwen2_decoder_holds_the_checkpoints_tensors_as_rows_of_its_merged_ones(
    tmp_path,
):
    from safetensors.torch import load_file

    folder = build_tiny_checkpoint(tmp_path, seed=3, text_model_type='qwen2')
    stored = load_file(folder / 'model.safetensors')
    model = load_checkpoint(folder)
    layer = model.decoder.layers[1]
    prefix = 'model.language_model.layers.1.'
    q, k, v = (stored[f'{prefix}self_attn.{p}_proj.bias'] for p in 'qkv')
    assert torch.equal(layer.self_attn.qkv_proj.bias, torch.cat([q, k, v]))
    gate, up = stored[prefix + 'mlp.gate_proj.weight'], stored[prefix + 'mlp.up_proj.weight']
    assert torch.equal(layer.mlp.gate_up_proj.weight, torch.cat([gate, up]))


def test_checkpoint_views_give_back_the_checkpoint_names_sharing_the_decoders_memory(
    tiny_dir, tiny_model
):
    from safetensors.torch import load_file

    stored = load_file(tiny_dir / 'model.safetensors')
    decoder = tiny_model.decoder
    views = checkpoint_views(decoder.state_dict(), decoder.spec)
    assert set(views) == set(decoder_shapes(decoder.spec))
    for name, view in views.items():
        canonical = name if name == 'lm_head.weight' else f'model.language_model.{name}'
        assert torch.equal(view, stored[canonical]), name
    k_rows = merged_row_splits(decoder.spec)['self_attn.qkv_proj'][0]
    qkv = decoder.layers[0].self_attn.qkv_proj.weight
    assert views['layers.0.self_attn.k_proj.weight'].data_ptr() == qkv[k_rows].data_ptr()
