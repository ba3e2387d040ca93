"""Loading a pi0 / pi0.5 ``model.safetensors`` into ``Pi0Model``.

LeRobot's names (``checkpoint.py``) map onto the model's modules: the SigLIP tower's tensors
as transformers names them, q/k/v and gate/up concatenated into the merged projections as
the shared decoder holds them, the tied token embedding read from ``paligemma.lm_head``,
Gemma's norm weights stored as ``1 + w`` (Gemma scales by ``1 + w``), pi0.5's adaptive norms'
``dense`` as they are; the expert's unused LM head is skipped. Every tensor of the model
must be found, at its shape; the stored dtypes (bf16 and float32 mixed) are converted to the
model's.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn

from vla_sched.model.config.checkpoint_spec import CheckpointError
from vla_sched.model.config.lerobot_policy import WEIGHTS_PREFIX
from vla_sched.model.families.pi0.checkpoint import (
    EMBEDDING_NAME,
    EXPERT_HEAD_NAME,
    EXPERT_PREFIX,
    LANGUAGE_PREFIX,
    PROJECTOR_PREFIX,
    VISION_PREFIX,
    Pi0Spec,
    SiglipSize,
)
from vla_sched.model.families.pi0.model import SIGLIP_LAYER_NORM_EPS, Pi0Model

_HEADS = (
    'state_proj',
    'action_in_proj',
    'action_out_proj',
    'action_time_mlp_in',
    'action_time_mlp_out',
    'time_mlp_in',
    'time_mlp_out',
)


def build_siglip_tower(size: SiglipSize, *, device: torch.device | str) -> nn.Module:
    """transformers' ``SiglipVisionModel`` of PaliGemma's sizes (no pooling head), float32."""
    from transformers import SiglipVisionConfig, SiglipVisionModel

    config = SiglipVisionConfig(
        hidden_size=size.hidden_size,
        intermediate_size=size.intermediate_size,
        num_hidden_layers=size.num_layers,
        num_attention_heads=size.num_heads,
        image_size=size.image_size,
        patch_size=size.patch_size,
        num_channels=3,
        hidden_act='gelu_pytorch_tanh',
        layer_norm_eps=SIGLIP_LAYER_NORM_EPS,
        vision_use_head=False,
    )
    config._attn_implementation = 'eager'
    return SiglipVisionModel(config).to(device=device, dtype=torch.float32).eval()


def _gemma_state(
    stored: Mapping[str, torch.Tensor], prefix: str, *, depth: int, adaptive: bool
) -> dict[str, torch.Tensor]:
    """A Gemma stack's layers and final norm under the shared decoder's names."""
    out: dict[str, torch.Tensor] = {}

    def norm(name: str) -> None:
        if adaptive:
            for leaf in ('weight', 'bias'):
                out[f'{name}.dense.{leaf}'] = stored[f'{prefix}{name}.dense.{leaf}']
        else:
            out[f'{name}.weight'] = 1.0 + stored[f'{prefix}{name}.weight'].float()

    for i in range(depth):
        layer = f'layers.{i}.'
        norm(f'{layer}input_layernorm')
        norm(f'{layer}post_attention_layernorm')
        attn = f'{prefix}{layer}self_attn.'
        out[f'{layer}self_attn.qkv_proj.weight'] = torch.cat(
            [stored[f'{attn}{p}_proj.weight'] for p in ('q', 'k', 'v')]
        )
        out[f'{layer}self_attn.o_proj.weight'] = stored[f'{attn}o_proj.weight']
        mlp = f'{prefix}{layer}mlp.'
        out[f'{layer}mlp.gate_up_proj.weight'] = torch.cat(
            [stored[f'{mlp}gate_proj.weight'], stored[f'{mlp}up_proj.weight']]
        )
        out[f'{layer}mlp.down_proj.weight'] = stored[f'{mlp}down_proj.weight']
    norm('norm')
    return out


def pi0_state_dict(
    stored: Mapping[str, torch.Tensor], spec: Pi0Spec, *, tower_prefix: str = 'vision_tower.'
) -> dict[str, torch.Tensor]:
    """The model's state dict from the folder's tensors (names without ``model.``);
    ``tower_prefix``: where the tower's own names start in the model's state dict.

    Raises:
        CheckpointError: naming a tensor the model needs and the file lacks.
    """
    pi05 = spec.policy_type == 'pi05'
    try:
        state = {
            f'{tower_prefix}{name[len(VISION_PREFIX) :]}': tensor
            for name, tensor in stored.items()
            if name.startswith(VISION_PREFIX)
        }
        state['projector.weight'] = stored[PROJECTOR_PREFIX + 'weight']
        state['projector.bias'] = stored[PROJECTOR_PREFIX + 'bias']
        language = _gemma_state(
            stored, LANGUAGE_PREFIX, depth=spec.paligemma.depth, adaptive=False
        )
        state.update({f'language.{k}': v for k, v in language.items()})
        state['language.embed_tokens.weight'] = stored[EMBEDDING_NAME]
        expert = _gemma_state(stored, EXPERT_PREFIX, depth=spec.expert.depth, adaptive=pi05)
        state.update({f'expert.{k}': v for k, v in expert.items()})
    except KeyError as exc:
        raise CheckpointError(f'{spec.weights_file} has no tensor {exc.args[0]!r}') from None
    for head in _HEADS:
        for leaf in ('weight', 'bias'):
            name = f'{head}.{leaf}'
            if name in stored:
                state[name] = stored[name]
    return state


def load_pi0_model(
    folder: str | Path,
    spec: Pi0Spec,
    *,
    device: torch.device | str = 'cpu',
    dtype: torch.dtype = torch.float32,
) -> Pi0Model:
    """The folder's ``Pi0Model`` on ``device``, its Gemma stacks in ``dtype``.

    Raises:
        CheckpointError: for a missing, unexpected or misshapen tensor (named).
    """
    from safetensors.torch import load_file

    path = Path(folder) / spec.weights_file
    stored = {
        name[len(WEIGHTS_PREFIX) :] if name.startswith(WEIGHTS_PREFIX) else name: tensor
        for name, tensor in load_file(str(path)).items()
    }
    stored.pop(EXPERT_HEAD_NAME, None)
    model = Pi0Model(
        policy_type=spec.policy_type,
        sizes=spec.sizes,
        max_state_dim=spec.max_state_dim,
        max_action_dim=spec.max_action_dim,
        min_period=spec.min_period,
        max_period=spec.max_period,
        vision_tower=build_siglip_tower(spec.vision, device=device),
        device=device,
        dtype=dtype,
    )
    own = model.state_dict()
    # transformers' SiglipVisionModel holds its tower under ``vision_model.`` in some
    # versions and directly in others.
    wrapped = any(name.startswith('vision_tower.vision_model.') for name in own)
    prefix = 'vision_tower.vision_model.' if wrapped else 'vision_tower.'
    state = pi0_state_dict(stored, spec, tower_prefix=prefix)
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    if missing or unexpected:
        raise CheckpointError(
            f'{path.name} does not match a {spec.policy_type} model of its sizes: '
            f'missing {missing[:4]}, unexpected {unexpected[:4]}'
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
