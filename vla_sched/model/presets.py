"""Model configurations by name: the tiny test VLA and an OpenVLA-7B-shaped one.

Each preset is the content of a checkpoint's JSON files (LLaVA ``config.json``,
``vla_config.json``, action statistics), so the same parser reads a preset and a folder.
``openvla-7b`` has OpenVLA's dimensions (Llama-2-7B decoder, 256 image tokens at 224 px,
7-dof actions over the last 256 of 32000 tokens) with a SigLIP-so400m tower standing in
for OpenVLA's fused DINOv2+SigLIP one; its weights are random, for benchmarks only.
"""

from __future__ import annotations

from typing import Any

from vla_sched.model.checkpoint_spec import CheckpointSpec, spec_from_dicts

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


def openvla_7b_config() -> dict[str, Any]:
    """LLaVA ``config.json`` with OpenVLA-7B's decoder and token counts."""
    text = {
        'model_type': 'llama',
        'vocab_size': 32064,
        'hidden_size': 4096,
        'intermediate_size': 11008,
        'num_hidden_layers': 32,
        'num_attention_heads': 32,
        'num_key_value_heads': 32,
        'head_dim': 128,
        'hidden_act': 'silu',
        'max_position_embeddings': 2048,
        'rms_norm_eps': 1e-5,
        'rope_parameters': {'rope_type': 'default', 'rope_theta': 10000.0},
        'tie_word_embeddings': False,
        'bos_token_id': 1,
        'eos_token_id': 2,
        'pad_token_id': 32000,
    }
    vision = {
        'model_type': 'siglip_vision_model',
        'hidden_size': 1152,
        'intermediate_size': 4304,
        'num_hidden_layers': 27,
        'num_attention_heads': 16,
        'num_channels': 3,
        'image_size': 224,
        'patch_size': 14,
        'hidden_act': 'gelu_pytorch_tanh',
        'layer_norm_eps': 1e-6,
        'vision_use_head': False,
    }
    return {
        'architectures': ['LlavaForConditionalGeneration'],
        'model_type': 'llava',
        'text_config': text,
        'vision_config': vision,
        'image_token_index': 32001,
        'image_seq_length': 256,
        'projector_hidden_act': 'gelu',
        'multimodal_projector_bias': True,
        'vision_feature_layer': -2,
        'vision_feature_select_strategy': 'full',
        'tie_word_embeddings': False,
    }


def openvla_7b_vla_config() -> dict[str, Any]:
    """OpenVLA's conventions: 256 bins below token 32000, one 7-dof action, image first."""
    return {
        'action_tokens': {'vocab_end': 32000, 'num_bins': 256},
        'action_horizon': 1,
        'unnorm_key': TINY_DATASET,
        'prompt': {'image_first': True, 'add_bos': True},
    }


def preset_spec(name: str) -> CheckpointSpec:
    """The ``CheckpointSpec`` of a named preset: ``tiny`` or ``openvla-7b``."""
    if name == 'tiny':
        return spec_from_dicts(tiny_llava_config(), tiny_vla_config(), tiny_statistics())
    if name == 'openvla-7b':
        return spec_from_dicts(openvla_7b_config(), openvla_7b_vla_config(), tiny_statistics())
    raise ValueError(f'unknown preset {name!r}; use tiny or openvla-7b')
