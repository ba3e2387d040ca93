"""Tensor names of a LLaVA checkpoint: canonical spelling, per-part split, expected shapes.

Canonical names are transformers 5's ``LlavaForConditionalGeneration`` names::

    model.language_model.{embed_tokens,layers.N.*,norm}.weight   decoder
    lm_head.weight                                               decoder head (absent if tied)
    model.multi_modal_projector.linear_{1,2}.{weight,bias}       projector
    model.vision_tower.*                                         vision tower

Older LLaVA checkpoints (``language_model.model.*``, ``vision_tower.*``,
``multi_modal_projector.*``) and text-only Llama/Qwen2 checkpoints (``model.layers.*``) are
renamed to these. OpenVLA checkpoints keep their own vision names (their decoder names are
renamed like an older LLaVA's)::

    projector.fc{1,2,3}.{weight,bias}                            projector
    vision_backbone.{featurizer,fused_featurizer}.*              timm towers (openvla_weights)

Checkpoints keep transformers' separate ``q_proj``/``k_proj``/``v_proj`` and
``gate_proj``/``up_proj`` tensors; the decoder holds each group as one projection
(``qkv_proj``, ``gate_up_proj``), concatenated at load (``decoder_merge_plan``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from vla_sched.model.config.architecture import DecoderSpec, VisionSpec

if TYPE_CHECKING:
    import torch

DECODER_PREFIX = 'model.language_model.'
PROJECTOR_PREFIX = 'model.multi_modal_projector.'
TOWER_PREFIX = 'model.vision_tower.'
LM_HEAD = 'lm_head.weight'
OPENVLA_PROJECTOR_PREFIX = 'projector.'
OPENVLA_TOWER_PREFIX = 'vision_backbone.'

_RENAMES = (
    ('language_model.model.', DECODER_PREFIX),
    ('language_model.lm_head.', 'lm_head.'),
    ('vision_tower.', TOWER_PREFIX),
    ('multi_modal_projector.', PROJECTOR_PREFIX),
)
# Tensors some checkpoints carry that the model recomputes or does not use.
_IGNORED_SUFFIXES = ('.rotary_emb.inv_freq',)
_IGNORED_TOWER_PREFIXES = ('vision_model.head.', 'head.')
TOWER_LEGACY_PREFIX = 'vision_model.'


def canonical_name(name: str) -> str:
    """Rename an older LLaVA or a text-only checkpoint's tensor name to the canonical one."""
    for old, new in _RENAMES:
        if name.startswith(old):
            return new + name[len(old) :]
    if name.startswith('model.') and not name.startswith(
        (DECODER_PREFIX, PROJECTOR_PREFIX, TOWER_PREFIX)
    ):
        return DECODER_PREFIX + name[len('model.') :]
    return name


def is_ignored(name: str) -> bool:
    """Whether a canonical name is a tensor the model does not load."""
    if name.endswith(_IGNORED_SUFFIXES):
        return True
    return name.startswith(TOWER_PREFIX) and name[len(TOWER_PREFIX) :].startswith(
        _IGNORED_TOWER_PREFIXES
    )


def split_names(names: Iterable[str]) -> dict[str, dict[str, str]]:
    """Group canonical names by model part, mapping module-relative name -> canonical name.

    Returns:
        ``{'decoder': ..., 'projector': ..., 'tower': ..., 'unknown': ...}``; the decoder
        part includes ``lm_head.weight``. OpenVLA's projector names go to ``projector``
        (``fc1.weight``, ...) and its tower names to ``tower`` relative to
        ``vision_backbone.`` (``featurizer.blocks.0.attn.qkv.weight``, ...).
    """
    parts: dict[str, dict[str, str]] = {'decoder': {}, 'projector': {}, 'tower': {}, 'unknown': {}}
    for name in names:
        if is_ignored(name):
            continue
        if name == LM_HEAD:
            parts['decoder'][name] = name
        elif name.startswith(DECODER_PREFIX):
            parts['decoder'][name[len(DECODER_PREFIX) :]] = name
        elif name.startswith(PROJECTOR_PREFIX):
            parts['projector'][name[len(PROJECTOR_PREFIX) :]] = name
        elif name.startswith(TOWER_PREFIX):
            parts['tower'][name[len(TOWER_PREFIX) :]] = name
        elif name.startswith(OPENVLA_PROJECTOR_PREFIX):
            parts['projector'][name[len(OPENVLA_PROJECTOR_PREFIX) :]] = name
        elif name.startswith(OPENVLA_TOWER_PREFIX):
            parts['tower'][name[len(OPENVLA_TOWER_PREFIX) :]] = name
        else:
            parts['unknown'][name] = name
    return parts


def decoder_shapes(spec: DecoderSpec) -> dict[str, tuple[int, ...]]:
    """Module-relative names and shapes of every decoder tensor."""
    h, q, kv, inner = spec.hidden_size, spec.q_size, spec.kv_size, spec.intermediate_size
    shapes: dict[str, tuple[int, ...]] = {'embed_tokens.weight': (spec.vocab_size, h)}
    for i in range(spec.num_layers):
        p = f'layers.{i}.'
        layer = {
            'input_layernorm.weight': (h,),
            'post_attention_layernorm.weight': (h,),
            'self_attn.q_proj.weight': (q, h),
            'self_attn.k_proj.weight': (kv, h),
            'self_attn.v_proj.weight': (kv, h),
            'self_attn.o_proj.weight': (h, q),
            'mlp.gate_proj.weight': (inner, h),
            'mlp.up_proj.weight': (inner, h),
            'mlp.down_proj.weight': (h, inner),
        }
        if spec.qkv_bias:
            layer.update({'self_attn.q_proj.bias': (q,), 'self_attn.k_proj.bias': (kv,)})
            layer['self_attn.v_proj.bias'] = (kv,)
        if spec.o_bias:
            layer['self_attn.o_proj.bias'] = (h,)
        if spec.mlp_bias:
            layer.update({f'mlp.{n}_proj.bias': (inner,) for n in ('gate', 'up')})
            layer['mlp.down_proj.bias'] = (h,)
        shapes.update({p + name: shape for name, shape in layer.items()})
    shapes['norm.weight'] = (h,)
    if not spec.tie_word_embeddings:
        shapes[LM_HEAD] = (spec.vocab_size, h)
    return shapes


# The decoder's merged projections: each module tensor is its checkpoint tensors
# concatenated along the output dimension (rows), in this order. Checkpoints keep the
# separate names; ``decoder_merge_plan`` maps them onto the module at load.
MERGED_PROJECTIONS = {
    'self_attn.qkv_proj': ('self_attn.q_proj', 'self_attn.k_proj', 'self_attn.v_proj'),
    'mlp.gate_up_proj': ('mlp.gate_proj', 'mlp.up_proj'),
}
_MERGED_PART = {
    part: (merged, index)
    for merged, parts in MERGED_PROJECTIONS.items()
    for index, part in enumerate(parts)
}


def _layer_tensor(name: str) -> tuple[str, str, str] | None:
    """``layers.3.self_attn.k_proj.bias`` -> ``('layers.3.', 'self_attn.k_proj', 'bias')``;
    None for a tensor outside the layers."""
    if not name.startswith('layers.'):
        return None
    layer, _, rest = name[len('layers.') :].partition('.')
    module, _, tensor = rest.rpartition('.')
    return f'layers.{layer}.', module, tensor


def decoder_merge_plan(names: Iterable[str]) -> dict[str, tuple[str, ...]]:
    """Module-relative decoder names -> the checkpoint names whose tensors make each.

    A merged projection's tensor (``layers.N.self_attn.qkv_proj.weight``) is its checkpoint
    tensors concatenated along dim 0 in ``MERGED_PROJECTIONS`` order; every other tensor is
    its own checkpoint tensor under the same name.

    Args:
        names: module-relative checkpoint names of the decoder (``decoder_shapes``' keys,
            with ``lm_head.weight``), all parts of each merged projection present.
    """
    plan: dict[str, dict[int, str]] = {}
    for name in names:
        target, index = name, 0
        found = _layer_tensor(name)
        if found is not None and found[1] in _MERGED_PART:
            layer, module, tensor = found
            merged, index = _MERGED_PART[module]
            target = f'{layer}{merged}.{tensor}'
        plan.setdefault(target, {})[index] = name
    return {target: tuple(parts[i] for i in sorted(parts)) for target, parts in plan.items()}


def merged_row_splits(spec: DecoderSpec) -> dict[str, tuple[int, ...]]:
    """Rows of each part of a merged projection, in ``MERGED_PROJECTIONS`` order."""
    inner = spec.intermediate_size
    return {
        'self_attn.qkv_proj': (spec.q_size, spec.kv_size, spec.kv_size),
        'mlp.gate_up_proj': (inner, inner),
    }


def checkpoint_views(
    state: Mapping[str, torch.Tensor], spec: DecoderSpec
) -> dict[str, torch.Tensor]:
    """A decoder's module state under checkpoint names, each merged projection split into
    views of its rows (no copies): what transformers' ``LlamaModel`` holds, sharing memory."""
    splits = merged_row_splits(spec)
    views: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        found = _layer_tensor(name)
        if found is None or found[1] not in splits:
            views[name] = tensor
            continue
        layer, merged, suffix = found
        parts = tensor.split(splits[merged], dim=0)
        for part, view in zip(MERGED_PROJECTIONS[merged], parts, strict=True):
            views[f'{layer}{part}.{suffix}'] = view
    return views


def projector_shapes(spec: VisionSpec) -> dict[str, tuple[int, ...]]:
    """Module-relative names and shapes of the projector's tensors."""
    h_in, h = spec.projector_in_size, spec.text_hidden_size
    shapes: dict[str, tuple[int, ...]] = {'linear_1.weight': (h, h_in), 'linear_2.weight': (h, h)}
    if spec.projector_bias:
        shapes.update({'linear_1.bias': (h,), 'linear_2.bias': (h,)})
    return shapes


def match_tower_names(found: dict[str, str], module_names: Iterable[str]) -> dict[str, str]:
    """Add or drop the ``vision_model.`` prefix of tower names to match the tower module.

    transformers 5 dropped that level from ``SiglipVisionModel``/``CLIPVisionModel``; older
    checkpoints still carry it.
    """
    module_has = any(n.startswith(TOWER_LEGACY_PREFIX) for n in module_names)
    found_has = any(n.startswith(TOWER_LEGACY_PREFIX) for n in found)
    if found_has and not module_has:
        return {n.removeprefix(TOWER_LEGACY_PREFIX): c for n, c in found.items()}
    if module_has and not found_has:
        return {TOWER_LEGACY_PREFIX + n: c for n, c in found.items()}
    return dict(found)


def siglip_tower_shapes(spec: VisionSpec) -> dict[str, tuple[int, ...]]:
    """Names (transformers 5 layout) and shapes of a SigLIP tower without its pooling head."""
    cfg = spec.tower_config
    h, inner = spec.hidden_size, int(cfg['intermediate_size'])
    p, c = spec.patch_size, spec.num_channels
    shapes: dict[str, tuple[int, ...]] = {
        'embeddings.patch_embedding.weight': (h, c, p, p),
        'embeddings.patch_embedding.bias': (h,),
        'embeddings.position_embedding.weight': (spec.num_patches, h),
    }
    for i in range(int(cfg['num_hidden_layers'])):
        pre = f'encoder.layers.{i}.'
        for proj in ('q_proj', 'k_proj', 'v_proj', 'out_proj'):
            shapes[f'{pre}self_attn.{proj}.weight'] = (h, h)
            shapes[f'{pre}self_attn.{proj}.bias'] = (h,)
        for norm in ('layer_norm1', 'layer_norm2'):
            shapes[f'{pre}{norm}.weight'] = (h,)
            shapes[f'{pre}{norm}.bias'] = (h,)
        shapes[f'{pre}mlp.fc1.weight'] = (inner, h)
        shapes[f'{pre}mlp.fc1.bias'] = (inner,)
        shapes[f'{pre}mlp.fc2.weight'] = (h, inner)
        shapes[f'{pre}mlp.fc2.bias'] = (h,)
    shapes['post_layernorm.weight'] = (h,)
    shapes['post_layernorm.bias'] = (h,)
    return shapes
