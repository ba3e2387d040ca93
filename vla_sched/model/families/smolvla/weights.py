"""Loading a SmolVLA ``model.safetensors`` into ``SmolVLAModel``.

LeRobot's names (``checkpoint.py``) map onto the model's modules: the vision tower's tensors as
transformers' ``SmolVLMVisionTransformer`` names them, the connector's projection, the text
layers' and the joint expert layers' q/k/v and gate/up concatenated into the merged projections
the shared decoder holds, the cross layers' q/k/v/o as they are, the Llama norms' ``w`` as it is.
Every tensor of the model must be found, at its shape; the stored dtypes are converted.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn

from vla_sched.model.config.checkpoint_spec import CheckpointError
from vla_sched.model.families.smolvla.checkpoint import (
    CONNECTOR_NAME,
    EMBEDDING_NAME,
    EXPERT_PREFIX,
    HEAD_NAMES,
    TEXT_PREFIX,
    UNUSED_NAMES,
    VISION_LAYER_NORM_EPS,
    VISION_PREFIX,
    WEIGHTS_PREFIX,
    SmolVLASizes,
    SmolVLASpec,
)
from vla_sched.model.families.smolvla.model import SmolVLAModel


def build_vision_tower(
    sizes: SmolVLASizes, *, device: torch.device | str, dtype: torch.dtype
) -> nn.Module:
    """transformers' ``SmolVLMVisionTransformer`` of the folder's sizes."""
    from transformers.models.smolvlm.configuration_smolvlm import SmolVLMVisionConfig
    from transformers.models.smolvlm.modeling_smolvlm import SmolVLMVisionTransformer

    v = sizes.vision
    config = SmolVLMVisionConfig(
        hidden_size=v.hidden_size,
        intermediate_size=v.intermediate_size,
        num_hidden_layers=v.num_layers,
        num_attention_heads=v.num_heads,
        num_channels=3,
        image_size=v.image_size,
        patch_size=v.patch_size,
        hidden_act='gelu_pytorch_tanh',
        layer_norm_eps=VISION_LAYER_NORM_EPS,
    )
    config._attn_implementation = 'eager'
    return SmolVLMVisionTransformer(config).to(device=device, dtype=dtype).eval()


def _layer_state(
    stored: Mapping[str, torch.Tensor], prefix: str, i: int, *, merged: bool
) -> dict[str, torch.Tensor]:
    layer, out = f'layers.{i}.', {}
    for norm in ('input_layernorm', 'post_attention_layernorm'):
        out[f'{layer}{norm}.weight'] = stored[f'{prefix}{layer}{norm}.weight']
    attn = f'{prefix}{layer}self_attn.'
    if merged:
        out[f'{layer}self_attn.qkv_proj.weight'] = torch.cat(
            [stored[f'{attn}{p}_proj.weight'] for p in ('q', 'k', 'v')]
        )
    else:
        for p in ('q', 'k', 'v'):
            out[f'{layer}self_attn.{p}_proj.weight'] = stored[f'{attn}{p}_proj.weight']
    out[f'{layer}self_attn.o_proj.weight'] = stored[f'{attn}o_proj.weight']
    mlp = f'{prefix}{layer}mlp.'
    out[f'{layer}mlp.gate_up_proj.weight'] = torch.cat(
        [stored[f'{mlp}gate_proj.weight'], stored[f'{mlp}up_proj.weight']]
    )
    out[f'{layer}mlp.down_proj.weight'] = stored[f'{mlp}down_proj.weight']
    return out


def smolvla_state_dict(
    stored: Mapping[str, torch.Tensor], sizes: SmolVLASizes
) -> dict[str, torch.Tensor]:
    """The model's state dict from the folder's tensors (names without ``model.``).

    Raises:
        CheckpointError: naming a tensor the model needs and the file lacks.
    """
    try:
        state = {
            f'vision_tower.{name[len(VISION_PREFIX) :]}': tensor
            for name, tensor in stored.items()
            if name.startswith(VISION_PREFIX)
        }
        state['connector.weight'] = stored[CONNECTOR_NAME]
        state['language.embed_tokens.weight'] = stored[EMBEDDING_NAME]
        for i in range(sizes.text.depth):
            layer = _layer_state(stored, TEXT_PREFIX, i, merged=True)
            state.update({f'language.{k}': v for k, v in layer.items()})
        state['language.norm.weight'] = stored[TEXT_PREFIX + 'norm.weight']
        for i in range(sizes.expert.depth):
            layer = _layer_state(stored, EXPERT_PREFIX, i, merged=i not in sizes.cross_layers)
            state.update({f'expert.{k.removeprefix("layers.")}': v for k, v in layer.items()})
        state['expert_norm.weight'] = stored[EXPERT_PREFIX + 'norm.weight']
        for head in HEAD_NAMES:
            for leaf in ('weight', 'bias'):
                state[f'{head}.{leaf}'] = stored[f'{head}.{leaf}']
    except KeyError as exc:
        raise CheckpointError(f'model.safetensors has no tensor {exc.args[0]!r}') from None
    return state


def load_smolvla_model(
    folder: str | Path,
    spec: SmolVLASpec,
    *,
    device: torch.device | str = 'cpu',
    dtype: torch.dtype = torch.float32,
) -> SmolVLAModel:
    """The folder's ``SmolVLAModel`` on ``device`` in ``dtype`` (the heads in float32).

    Raises:
        CheckpointError: for a missing, unexpected or misshapen tensor (named).
    """
    from safetensors.torch import load_file

    path = Path(folder) / spec.weights_file
    stored = {
        name.removeprefix(WEIGHTS_PREFIX): tensor for name, tensor in load_file(str(path)).items()
    }
    for name in UNUSED_NAMES:
        stored.pop(name, None)
    model = SmolVLAModel(
        sizes=spec.sizes,
        max_state_dim=spec.max_state_dim,
        max_action_dim=spec.max_action_dim,
        min_period=spec.min_period,
        max_period=spec.max_period,
        vision_tower=build_vision_tower(spec.sizes, device=device, dtype=dtype),
        device=device,
        dtype=dtype,
    )
    own = model.state_dict()
    state = smolvla_state_dict(stored, spec.sizes)
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    if missing or unexpected:
        raise CheckpointError(
            f'{path.name} does not match a SmolVLA model of its sizes: missing {missing[:4]}, '
            f'unexpected {unexpected[:4]}'
        )
    for name, tensor in state.items():
        if tuple(tensor.shape) != tuple(own[name].shape):
            raise CheckpointError(
                f'{path.name}: {name} has shape {tuple(tensor.shape)}, the model '
                f'{tuple(own[name].shape)}'
            )
        state[name] = tensor.to(dtype=own[name].dtype)
    model.load_state_dict(state, strict=True)
    return model.eval()
