"""Model configurations by name: the tiny test VLA and OpenVLA's real architecture.

Each preset is the content of a checkpoint's JSON files, so the same parser reads a preset
and a folder. ``tiny`` is a LLaVA-layout ``config.json`` with ``vla_config.json`` and action
statistics. ``openvla-7b`` is OpenVLA's own ``config.json`` (``model_type: "openvla"``): the
fused DINOv2-reg4 ViT-L/14 + SigLIP so400m/14 towers at 224 px (256 image tokens right after
BOS), the 3-layer projector and a Llama-2-7B decoder whose dims are transformers'
``LlamaConfig`` defaults (``text_config`` holds only what differs, as OpenVLA saves it);
7-dof actions over the last 256 of 32000 tokens. ``openvla_config`` also gives the v01
layout (one SigLIP tower) and tiny widths for tests
(``vla_sched.testing.openvla_writer`` writes such folders).
"""

from __future__ import annotations

from typing import Any

from vla_sched.model.config.checkpoint_spec import CheckpointSpec
from vla_sched.model.config.formats import spec_from_dicts

TINY_VOCAB_END = 516  # 4 specials + 256 byte symbols + 256 action tokens
TINY_IMAGE_TOKEN_ID = 516
TINY_TEXT_VOCAB = 520  # padded embedding size, larger than the tokenizer's (as OpenVLA's)
TINY_DATASET = 'tiny_sim'
TINY_ACTION_DIM = 7


def tiny_llava_config(
    *,
    text_model_type: str = 'llama',
    rope_parameters: dict[str, Any] | None = None,
    tie_word_embeddings: bool = False,
    num_layers: int = 2,
) -> dict[str, Any]:
    """``config.json`` of the tiny LLaVA: Llama (or Qwen2) text + SigLIP vision.

    Text: hidden 64, 4 heads / 2 KV heads (head_dim 16), SwiGLU 128, vocab 520. Vision:
    hidden 32, 2 layers, 32x32 images with 8x8 patches, so 16 image tokens.
    """
    rope = {'rope_type': 'default', 'rope_theta': 10000.0}
    rope.update(rope_parameters or {})
    text = {
        'model_type': text_model_type,
        'vocab_size': TINY_TEXT_VOCAB,
        'hidden_size': 64,
        'intermediate_size': 128,
        'num_hidden_layers': num_layers,
        'num_attention_heads': 4,
        'num_key_value_heads': 2,
        'head_dim': 16,
        'hidden_act': 'silu',
        'max_position_embeddings': 512,
        'rms_norm_eps': 1e-6,
        'rope_parameters': rope,
        'tie_word_embeddings': tie_word_embeddings,
        'bos_token_id': 1,
        'eos_token_id': 2,
        'pad_token_id': 0,
    }
    if text_model_type == 'llama':
        text.update({'attention_bias': False, 'mlp_bias': False})
    vision = {
        'model_type': 'siglip_vision_model',
        'hidden_size': 32,
        'intermediate_size': 64,
        'num_hidden_layers': 2,
        'num_attention_heads': 2,
        'num_channels': 3,
        'image_size': 32,
        'patch_size': 8,
        'hidden_act': 'gelu_pytorch_tanh',
        'layer_norm_eps': 1e-6,
        'vision_use_head': False,
    }
    return {
        'architectures': ['LlavaForConditionalGeneration'],
        'model_type': 'llava',
        'text_config': text,
        'vision_config': vision,
        'image_token_index': TINY_IMAGE_TOKEN_ID,
        'image_seq_length': 16,
        'projector_hidden_act': 'gelu',
        'multimodal_projector_bias': True,
        'vision_feature_layer': -1,
        'vision_feature_select_strategy': 'full',
        'tie_word_embeddings': tie_word_embeddings,
    }


def tiny_vla_config(*, action_horizon: int = 1) -> dict[str, Any]:
    """``vla_config.json`` of the tiny VLA (OpenVLA token scheme, session-prefix prompt)."""
    return {
        'action_tokens': {'vocab_end': TINY_VOCAB_END, 'num_bins': 256},
        'action_horizon': action_horizon,
        'unnorm_key': TINY_DATASET,
        'prompt': {
            'prefix': 'In: What action should the robot take to {instruction}?\n',
            'suffix': 'Out:',
            'image_first': False,
            'add_bos': True,
        },
    }


def tiny_statistics(action_dim: int = TINY_ACTION_DIM) -> dict[str, Any]:
    """OpenVLA-layout statistics with a masked gripper (last dimension)."""
    q01 = [round(-0.05 * (i + 1), 4) for i in range(action_dim)]
    q99 = [round(0.04 * (i + 1), 4) for i in range(action_dim)]
    mask = [True] * (action_dim - 1) + [False]
    action = {'q01': q01, 'q99': q99, 'mask': mask, 'mean': [0.0] * action_dim}
    action.update({'std': [0.1] * action_dim, 'min': q01, 'max': q99})
    proprio = {'q01': [-1.0] * action_dim, 'q99': [1.0] * action_dim}
    entry = {'action': action, 'proprio': proprio, 'num_transitions': 0, 'num_trajectories': 0}
    return {TINY_DATASET: entry}


# OpenVLA's config.json (``model_type: "openvla"``), by backbone variant: the fused
# DINOv2 + SigLIP backbone of openvla-7b, or the single SigLIP tower of openvla-v01-7b.
OPENVLA_VARIANTS: dict[str, dict[str, Any]] = {
    'fused': {
        'vision_backbone_id': 'dinosiglip-vit-so-224px',
        'llm_backbone_id': 'llama2-7b-pure',
        'hf_llm_id': 'meta-llama/Llama-2-7b-hf',
        'arch_specifier': 'no-align+fused-gelu-mlp',
        'timm_model_ids': [
            'vit_large_patch14_reg4_dinov2.lvd142m',
            'vit_so400m_patch14_siglip_224',
        ],
    },
    'v01': {
        'vision_backbone_id': 'siglip-vit-so400m',
        'llm_backbone_id': 'vicuna-v15-7b',
        'hf_llm_id': 'lmsys/vicuna-7b-v1.5',
        'arch_specifier': 'gelu-mlp',
        'timm_model_ids': ['vit_so400m_patch14_siglip_224'],
    },
}
OPENVLA_PAD_TOKEN_ID = 32000  # '<PAD>', added after Llama-2's 32000 pieces
OPENVLA_VOCAB_SIZE = 32064  # the embedding padded to a multiple of 64
OPENVLA_PAD_TO_MULTIPLE_OF = 64
OPENVLA_DATASET = 'bridge_orig'
# Tiny test folders: small Llama dims (the rest stays LlamaConfig's default) and timm shape
# overrides per tower id.
OPENVLA_TINY_TEXT: dict[str, int] = {
    'hidden_size': 64,
    'intermediate_size': 128,
    'num_hidden_layers': 2,
    'num_attention_heads': 4,
    'num_key_value_heads': 4,
}
OPENVLA_TINY_TOWERS: dict[str, dict[str, Any]] = {
    'vit_large_patch14_reg4_dinov2.lvd142m': {'embed_dim': 48, 'depth': 3, 'num_heads': 3},
    'vit_so400m_patch14_siglip_224': {
        'embed_dim': 40, 'depth': 3, 'num_heads': 2, 'mlp_ratio': 3.0,
    },
}  # fmt: skip


def openvla_norm_stats(
    datasets: tuple[str, ...] = (OPENVLA_DATASET,), action_dim: int = TINY_ACTION_DIM
) -> dict[str, Any]:
    """``norm_stats`` in OpenVLA's layout: per dataset, ``action`` and ``proprio`` statistics.

    Values are made up but distinct per dataset; the gripper (last dimension) is not
    normalized (``mask`` False), as in OpenVLA's datasets.
    """
    stats: dict[str, Any] = {}
    for k, name in enumerate(datasets):
        scale = 1.0 + 0.5 * k
        q01 = [round(-0.05 * (i + 1) * scale, 4) for i in range(action_dim - 1)] + [0.0]
        q99 = [round(0.04 * (i + 1) * scale, 4) for i in range(action_dim - 1)] + [1.0]
        action = {
            'q01': q01,
            'q99': q99,
            'mask': [True] * (action_dim - 1) + [False],
            'mean': [round((a + b) / 2, 4) for a, b in zip(q01, q99, strict=True)],
            'std': [round(0.02 * (i + 1) * scale, 4) for i in range(action_dim)],
            'min': [round(1.5 * v, 4) for v in q01],
            'max': [round(1.5 * v, 4) for v in q99],
        }
        proprio = {
            'q01': [-1.0] * action_dim,
            'q99': [1.0] * action_dim,
            'mask': [True] * (action_dim - 1) + [False],
            'mean': [0.0] * action_dim,
            'std': [0.5] * action_dim,
            'min': [-1.5] * action_dim,
            'max': [1.5] * action_dim,
        }
        stats[name] = {
            'action': action,
            'proprio': proprio,
            'num_transitions': 1000 * (k + 1),
            'num_trajectories': 10 * (k + 1),
        }
    return stats


def openvla_config(
    variant: str = 'fused',
    *,
    tiny: bool = False,
    norm_stats: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """``config.json`` as OpenVLA saves it (``model_type: "openvla"``).

    ``text_config`` is a diff against transformers' ``LlamaConfig`` defaults, as OpenVLA
    writes it: for the real model only the model type, the pad token and the padded
    vocabulary (the 7B dims are LlamaConfig's defaults); a tiny folder adds its small dims
    and ``timm_model_args`` (tower shape overrides). ``norm_stats`` is left out when None
    (the statistics then live in ``dataset_statistics.json``).
    """
    if variant not in OPENVLA_VARIANTS:
        raise ValueError(
            f'unknown OpenVLA variant {variant!r}; use one of {list(OPENVLA_VARIANTS)}'
        )
    backbone = OPENVLA_VARIANTS[variant]
    ids = list(backbone['timm_model_ids'])
    text = {
        'model_type': 'llama',
        'pad_token_id': OPENVLA_PAD_TOKEN_ID,
        'vocab_size': OPENVLA_VOCAB_SIZE,
    }
    if tiny:
        text.update(OPENVLA_TINY_TEXT)
    config: dict[str, Any] = {
        'architectures': ['OpenVLAForActionPrediction'],
        'auto_map': {
            'AutoConfig': 'configuration_prismatic.OpenVLAConfig',
            'AutoModelForVision2Seq': 'modeling_prismatic.OpenVLAForActionPrediction',
        },
        'model_type': 'openvla',
        'vision_backbone_id': backbone['vision_backbone_id'],
        'llm_backbone_id': backbone['llm_backbone_id'],
        'hf_llm_id': backbone['hf_llm_id'],
        'arch_specifier': backbone['arch_specifier'],
        'timm_model_ids': ids,
        'timm_override_act_layers': [None] * len(ids),
        'image_sizes': [224] * len(ids),
        'use_fused_vision_backbone': len(ids) == 2,
        'image_resize_strategy': 'resize-naive',
        'llm_max_length': 2048,
        'output_projector_states': False,
        'pad_token_id': OPENVLA_PAD_TOKEN_ID,
        'pad_to_multiple_of': OPENVLA_PAD_TO_MULTIPLE_OF,
        'n_action_bins': 256,
        'text_config': text,
    }
    if tiny:
        config['timm_model_args'] = [dict(OPENVLA_TINY_TOWERS[i]) for i in ids]
    if norm_stats is not None:
        config['norm_stats'] = norm_stats
    return config


def openvla_7b_config() -> dict[str, Any]:
    """openvla-7b's ``config.json``: fused DINOv2 + SigLIP towers, Llama-2-7B, one dataset."""
    return openvla_config('fused', norm_stats=openvla_norm_stats())


def preset_spec(name: str) -> CheckpointSpec:
    """The ``CheckpointSpec`` of a named preset: ``tiny`` or ``openvla-7b``."""
    if name == 'tiny':
        return spec_from_dicts(tiny_llava_config(), tiny_vla_config(), tiny_statistics())
    if name == 'openvla-7b':
        config = openvla_7b_config()
        return spec_from_dicts(config, {}, config['norm_stats'])
    raise ValueError(f'unknown preset {name!r}; use tiny or openvla-7b')
