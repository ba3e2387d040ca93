"""OpenVLA's vision tensors: the timm names a checkpoint holds and their transformers names.

An OpenVLA checkpoint stores each tower as a timm ``VisionTransformer`` state dict, the first
under ``vision_backbone.featurizer.`` and the second (fused backbone) under
``vision_backbone.fused_featurizer.``; the projector is ``projector.fc1|fc2|fc3``. Our
towers are transformers' ``Dinov2WithRegistersModel`` and ``SiglipVisionModel`` (built in
``vision``), so each timm tensor is renamed and, where the layouts differ, converted:

- ``blocks.N.attn.qkv`` (q, k and v stacked on the output axis) is split into three
  projections;
- LayerScale weights (``blocks.N.ls1|ls2.scale_factor``, timm's ``gamma``) become
  ``layer_scale1|2.lambda1``;
- DINOv2's ``pos_embed`` covers the patches only (the class and register tokens get no
  position), while transformers keeps a class position as row 0: that row is zero;
- ``norm`` (the final LayerNorm) is loaded into the transformers model's final norm, which
  the feature path never applies (features come from the second-to-last block);
- SigLIP's ``attn_pool.*`` pooling head is unused and ignored.

Everything else a tower holds is refused by the caller's name and shape checks.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

import torch

from vla_sched.model.config.checkpoint_spec import CheckpointError
from vla_sched.model.config.openvla_towers import OpenVLAVisionSpec, TowerSpec
from vla_sched.model.loading.weights import OPENVLA_TOWER_PREFIX

TOWER_PARTS = ('featurizer', 'fused_featurizer')  # the towers' names, in channel order
IGNORED_SIGLIP_PREFIXES = ('attn_pool.',)
# Tensors the transformers towers have and OpenVLA's timm towers do not (unused here):
# DINOv2's mask token (masked-image pre-training only) is loaded as zeros.
_UNUSED_HF_TENSORS = ('embeddings.mask_token',)
# Older transformers releases spell DINOv2's attention projections differently.
_LEGACY_SPELLINGS = (
    ('.attention.q_proj.', '.attention.attention.query.'),
    ('.attention.k_proj.', '.attention.attention.key.'),
    ('.attention.v_proj.', '.attention.attention.value.'),
    ('.attention.o_proj.', '.attention.output.dense.'),
)
_LEGACY_SIGLIP_PREFIX = 'vision_model.'


def tower_prefix(index: int) -> str:
    """Canonical name prefix of tower ``index`` (0: ``featurizer``, 1: ``fused_featurizer``)."""
    return f'{OPENVLA_TOWER_PREFIX}{TOWER_PARTS[index]}.'


def split_tower_names(found: Mapping[str, str], spec: OpenVLAVisionSpec) -> list[dict[str, str]]:
    """Sort ``vision_backbone``-relative names into one timm-name mapping per tower.

    Args:
        found: ``split_names(...)['tower']``: names relative to ``vision_backbone.`` mapped
            to their canonical names.
        spec: The backbone (one or two towers).

    Returns:
        Per tower, timm name (``blocks.0.attn.qkv.weight``) -> canonical name, without the
        ignored tensors (SigLIP's ``attn_pool.*``).

    Raises:
        CheckpointError: naming tensors that belong to no tower of the spec.
    """
    towers: list[dict[str, str]] = [{} for _ in spec.towers]
    outside = []
    for name, canonical in found.items():
        part, _, rest = name.partition('.')
        index = TOWER_PARTS.index(part) if part in TOWER_PARTS else len(towers)
        if index >= len(towers) or not rest:
            outside.append(canonical)
            continue
        if spec.towers[index].kind == 'siglip' and rest.startswith(IGNORED_SIGLIP_PREFIXES):
            continue
        towers[index][rest] = canonical
    if outside:
        raise CheckpointError(
            f'vision backbone: checkpoint has {len(outside)} tensors outside the '
            f'{len(towers)} towers config.json describes, e.g. {sorted(outside)[:3]}'
        )
    return towers


def timm_tower_shapes(tower: TowerSpec) -> dict[str, tuple[int, ...]]:
    """timm names (relative to the tower) and shapes of every tensor a tower must hold."""
    d, inner, p = tower.embed_dim, tower.mlp_hidden, tower.patch_size
    shapes: dict[str, tuple[int, ...]] = {}
    if tower.has_class_token:
        shapes['cls_token'] = (1, 1, d)
    if tower.num_registers:
        shapes['reg_token'] = (1, tower.num_registers, d)
    shapes['pos_embed'] = (1, tower.num_patches, d)
    shapes['patch_embed.proj.weight'] = (d, 3, p, p)
    shapes['patch_embed.proj.bias'] = (d,)
    for i in range(tower.depth):
        block = {
            'norm1.weight': (d,),
            'norm1.bias': (d,),
            'attn.qkv.weight': (3 * d, d),
            'attn.qkv.bias': (3 * d,),
            'attn.proj.weight': (d, d),
            'attn.proj.bias': (d,),
            'norm2.weight': (d,),
            'norm2.bias': (d,),
            'mlp.fc1.weight': (inner, d),
            'mlp.fc1.bias': (inner,),
            'mlp.fc2.weight': (d, inner),
            'mlp.fc2.bias': (d,),
        }
        if tower.has_layer_scale:
            block.update({'ls1.scale_factor': (d,), 'ls2.scale_factor': (d,)})
        shapes.update({f'blocks.{i}.{name}': shape for name, shape in block.items()})
    shapes['norm.weight'] = (d,)
    shapes['norm.bias'] = (d,)
    return shapes


def openvla_projector_shapes(spec: OpenVLAVisionSpec) -> dict[str, tuple[int, ...]]:
    """Names (relative to ``projector.``) and shapes of the projector's tensors.

    Fused: fc1 ``F -> 4F``, fc2 ``4F -> H``, fc3 ``H -> H``; one tower: fc1 ``F -> H``,
    fc2 ``H -> H`` (``F``: concatenated feature width, ``H``: the decoder's width).
    """
    f, h = spec.feature_dim, spec.text_hidden_size
    widths = [(f, 4 * f), (4 * f, h), (h, h)] if spec.fused else [(f, h), (h, h)]
    shapes: dict[str, tuple[int, ...]] = {}
    for i, (w_in, w_out) in enumerate(widths, start=1):
        shapes[f'fc{i}.weight'] = (w_out, w_in)
        shapes[f'fc{i}.bias'] = (w_out,)
    return shapes


def hf_tower_state(
    tower: TowerSpec, tensors: Mapping[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """A tower's transformers state dict from its timm tensors (already shape-checked).

    Names are transformers 5's (``Dinov2WithRegistersModel``, ``SiglipVisionModel`` without
    the ``vision_model.`` level); ``match_module_names`` adapts them to the built module.
    """
    if tower.kind == 'dinov2_reg':
        return _dinov2_state(tower, tensors)
    return _siglip_state(tower, tensors)


def _split_qkv(state: dict, prefix: str, t: Mapping[str, torch.Tensor], i: int) -> None:
    """timm's fused ``qkv`` (rows: q, then k, then v) -> ``q_proj``, ``k_proj``, ``v_proj``."""
    for kind in ('weight', 'bias'):
        parts = t[f'blocks.{i}.attn.qkv.{kind}'].chunk(3, dim=0)
        for name, part in zip(('q_proj', 'k_proj', 'v_proj'), parts, strict=True):
            state[f'{prefix}{name}.{kind}'] = part.contiguous()


def _dinov2_state(tower: TowerSpec, t: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    pos = t['pos_embed']
    state = {
        'embeddings.cls_token': t['cls_token'],
        'embeddings.mask_token': pos.new_zeros(1, tower.embed_dim),
        'embeddings.position_embeddings': torch.cat([torch.zeros_like(pos[:, :1]), pos], dim=1),
        'embeddings.register_tokens': t['reg_token'] if tower.num_registers else pos[:, :0],
        'embeddings.patch_embeddings.projection.weight': t['patch_embed.proj.weight'],
        'embeddings.patch_embeddings.projection.bias': t['patch_embed.proj.bias'],
        'layernorm.weight': t['norm.weight'],
        'layernorm.bias': t['norm.bias'],
    }
    for i in range(tower.depth):
        hf, timm = f'encoder.layer.{i}.', f'blocks.{i}.'
        _split_qkv(state, f'{hf}attention.', t, i)
        renames = {
            'norm1': 'norm1', 'norm2': 'norm2', 'attn.proj': 'attention.o_proj',
            'mlp.fc1': 'mlp.fc1', 'mlp.fc2': 'mlp.fc2',
        }  # fmt: skip
        for old, new in renames.items():
            state[f'{hf}{new}.weight'] = t[f'{timm}{old}.weight']
            state[f'{hf}{new}.bias'] = t[f'{timm}{old}.bias']
        state[f'{hf}layer_scale1.lambda1'] = t[f'{timm}ls1.scale_factor']
        state[f'{hf}layer_scale2.lambda1'] = t[f'{timm}ls2.scale_factor']
    return state


def _siglip_state(tower: TowerSpec, t: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    state = {
        'embeddings.patch_embedding.weight': t['patch_embed.proj.weight'],
        'embeddings.patch_embedding.bias': t['patch_embed.proj.bias'],
        'embeddings.position_embedding.weight': t['pos_embed'][0],
        'post_layernorm.weight': t['norm.weight'],
        'post_layernorm.bias': t['norm.bias'],
    }
    for i in range(tower.depth):
        hf, timm = f'encoder.layers.{i}.', f'blocks.{i}.'
        _split_qkv(state, f'{hf}self_attn.', t, i)
        renames = {
            'norm1': 'layer_norm1', 'norm2': 'layer_norm2', 'attn.proj': 'self_attn.out_proj',
            'mlp.fc1': 'mlp.fc1', 'mlp.fc2': 'mlp.fc2',
        }  # fmt: skip
        for old, new in renames.items():
            state[f'{hf}{new}.weight'] = t[f'{timm}{old}.weight']
            state[f'{hf}{new}.bias'] = t[f'{timm}{old}.bias']
    return state


def match_module_names(
    state: Mapping[str, torch.Tensor], module_names: Collection[str]
) -> dict[str, torch.Tensor]:
    """Respell a transformers-5 tower state dict as the built module names its tensors.

    Handles the spellings of older transformers releases (DINOv2's
    ``attention.attention.query`` ... ``attention.output.dense``, SigLIP's ``vision_model.``
    level) and drops the unused tensors a release's module lacks.

    Raises:
        RuntimeError: when the installed transformers names the tower's tensors in a way
            this mapping does not know (a version problem, not a checkpoint problem).
    """
    module_names = set(module_names)
    legacy_siglip = any(n.startswith(_LEGACY_SIGLIP_PREFIX) for n in module_names)
    matched: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        candidates = [name]
        if legacy_siglip:
            candidates.append(_LEGACY_SIGLIP_PREFIX + name)
        for new, old in _LEGACY_SPELLINGS:
            if new in name:
                candidates.append(name.replace(new, old))
        hit = next((c for c in candidates if c in module_names), None)
        if hit is not None:
            matched[hit] = tensor
        elif name not in _UNUSED_HF_TENSORS:
            raise RuntimeError(f'the installed transformers tower has no tensor for {name!r}')
    missing = sorted(module_names - set(matched))
    if missing:
        raise RuntimeError(
            f'the installed transformers tower has {len(missing)} tensors the timm mapping does '
            f'not fill, e.g. {missing[:3]}'
        )
    return matched
