"""An independent float32 reference of OpenVLA's vision path, written in plain torch.

It reads timm-named state dicts as an OpenVLA checkpoint stores them and follows timm's
``VisionTransformer`` forward as OpenVLA calls it (``get_intermediate_layers`` of the
second-to-last block): patch embedding convolution; for DINOv2 with registers the patch
positions are added to the patches only and then the class and register tokens are put in
front (timm's ``no_embed_class``), for SigLIP the positions are added to the patches (no
prefix tokens); pre-norm blocks with fused ``qkv`` attention written out as matrix products
and LayerScale where present; the prefix tokens dropped, no final norm. It shares no code
with ``vla_sched.model`` beyond reading the dimensions of a ``TowerSpec``.

Public functions:

- ``reference_patch_features(state_dict, tower, pixel_values, prefix='')``: one tower's
  ``[N, patches, embed_dim]`` features from 3-channel pixels.
- ``reference_projector(state_dict, features, fused, prefix='')``: OpenVLA's projector.
- ``reference_image_embeddings(state_dict, towers, pixel_values)``: the whole path from a
  full checkpoint state dict (``vision_backbone.featurizer.``,
  ``vision_backbone.fused_featurizer.``, ``projector.``) and ``[N, 3 * towers, S, S]``
  pixels to ``[N, patches, text_hidden]`` embeddings.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch
from torch.nn import functional as F

from vla_sched.model.config.openvla_towers import TowerSpec

TOWER_PREFIXES = ('vision_backbone.featurizer.', 'vision_backbone.fused_featurizer.')
PROJECTOR_PREFIX = 'projector.'


def _gelu(kind: str, x: torch.Tensor) -> torch.Tensor:
    # DINOv2 uses the exact erf GELU; SigLIP so400m uses the tanh approximation.
    if kind == 'siglip':
        inner = math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3))
        return 0.5 * x * (1.0 + torch.tanh(inner))
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


def _layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float):
    mean = x.mean(dim=-1, keepdim=True)
    var = (x - mean).pow(2).mean(dim=-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * weight + bias


def _linear(x: torch.Tensor, sd: Mapping[str, torch.Tensor], name: str) -> torch.Tensor:
    return x @ sd[f'{name}.weight'].T + sd[f'{name}.bias']


def _attention(x: torch.Tensor, sd: Mapping[str, torch.Tensor], p: str, heads: int):
    n, length, dim = x.shape
    head_dim = dim // heads
    qkv = _linear(x, sd, f'{p}attn.qkv').reshape(n, length, 3, heads, head_dim)
    q, k, v = qkv.permute(2, 0, 3, 1, 4)  # each [N, heads, L, head_dim]
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(head_dim)
    out = scores.softmax(dim=-1) @ v
    return _linear(out.transpose(1, 2).reshape(n, length, dim), sd, f'{p}attn.proj')


def _block(x: torch.Tensor, sd: Mapping[str, torch.Tensor], p: str, tower: TowerSpec):
    eps = tower.norm_eps
    h = _layer_norm(x, sd[f'{p}norm1.weight'], sd[f'{p}norm1.bias'], eps)
    h = _attention(h, sd, p, tower.num_heads)
    if f'{p}ls1.scale_factor' in sd:
        h = h * sd[f'{p}ls1.scale_factor']
    x = x + h
    h = _layer_norm(x, sd[f'{p}norm2.weight'], sd[f'{p}norm2.bias'], eps)
    h = _linear(_gelu(tower.kind, _linear(h, sd, f'{p}mlp.fc1')), sd, f'{p}mlp.fc2')
    if f'{p}ls2.scale_factor' in sd:
        h = h * sd[f'{p}ls2.scale_factor']
    return x + h


@torch.no_grad()
def reference_patch_features(
    state_dict: Mapping[str, torch.Tensor],
    tower: TowerSpec,
    pixel_values: torch.Tensor,
    *,
    prefix: str = '',
) -> torch.Tensor:
    """One tower's patch features after its second-to-last block, in float32.

    Args:
        state_dict: timm-named tensors (``pos_embed``, ``blocks.0.attn.qkv.weight``, ...),
            each name preceded by ``prefix``.
        tower: The tower's dimensions and kind.
        pixel_values: ``[N, 3, S, S]`` normalized pixels for this tower.

    Returns:
        ``[N, patches, embed_dim]`` (class and register tokens dropped, no final norm).
    """
    sd = {k[len(prefix) :]: v.float() for k, v in state_dict.items() if k.startswith(prefix)}
    x = F.conv2d(
        pixel_values.float(),
        sd['patch_embed.proj.weight'],
        sd['patch_embed.proj.bias'],
        stride=tower.patch_size,
    )
    x = x.flatten(2).transpose(1, 2)  # [N, patches, D], rows in raster order
    x = x + sd['pos_embed']
    prefix_tokens = []
    if 'cls_token' in sd:
        prefix_tokens.append(sd['cls_token'].expand(x.shape[0], -1, -1))
    if 'reg_token' in sd:
        prefix_tokens.append(sd['reg_token'].expand(x.shape[0], -1, -1))
    num_prefix = sum(t.shape[1] for t in prefix_tokens)
    x = torch.cat([*prefix_tokens, x], dim=1)
    for i in range(tower.depth - 1):  # up to and including the second-to-last block
        x = _block(x, sd, f'blocks.{i}.', tower)
    return x[:, num_prefix:]


@torch.no_grad()
def reference_projector(
    state_dict: Mapping[str, torch.Tensor],
    features: torch.Tensor,
    *,
    fused: bool,
    prefix: str = '',
) -> torch.Tensor:
    """OpenVLA's projector in float32: fc1, GELU, fc2 (then GELU, fc3 when fused)."""
    sd = {k[len(prefix) :]: v.float() for k, v in state_dict.items() if k.startswith(prefix)}
    x = _linear(_gelu('exact', _linear(features.float(), sd, 'fc1')), sd, 'fc2')
    if fused:
        x = _linear(_gelu('exact', x), sd, 'fc3')
    return x


@torch.no_grad()
def reference_image_embeddings(
    state_dict: Mapping[str, torch.Tensor],
    towers: Sequence[TowerSpec],
    pixel_values: torch.Tensor,
) -> torch.Tensor:
    """The full vision path from a checkpoint's state dict: ``[N, patches, text_hidden]``.

    ``pixel_values`` is ``[N, 3 * len(towers), S, S]``: channels ``3i..3i+2`` feed tower
    ``i`` (stored under ``TOWER_PREFIXES[i]``); the towers' features are concatenated on the
    channel axis in that order before the projector.
    """
    features = [
        reference_patch_features(
            state_dict, tower, pixel_values[:, 3 * i : 3 * i + 3], prefix=TOWER_PREFIXES[i]
        )
        for i, tower in enumerate(towers)
    ]
    return reference_projector(
        state_dict, torch.cat(features, dim=-1), fused=len(towers) == 2, prefix=PROJECTOR_PREFIX
    )
