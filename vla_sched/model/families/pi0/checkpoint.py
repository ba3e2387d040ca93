"""pi0 / pi0.5 checkpoints as LeRobot saves them: sizes, tensor names, and the folder's spec.

A folder holds ``config.json`` (``type`` ``pi0`` or ``pi05``), ``model.safetensors`` (keys
prefixed ``model.``, the tied token embedding stored once as ``paligemma.lm_head.weight``),
``policy_preprocessor.json`` / ``policy_postprocessor.json`` and the normalizer statistics file
each names in its ``state_file``. The config names its sizes only by variant
(``paligemma_variant`` / ``action_expert_variant``: ``gemma_2b``, ``gemma_300m``; the vision
tower is always SigLIP So400m/14). A folder of other sizes (a test folder) declares them in
``model_sizes.json`` beside ``config.json``::

    {"paligemma": {"width": 64, "depth": 2, "mlp_dim": 128, "num_heads": 4,
                   "num_kv_heads": 1, "head_dim": 16},
     "action_expert": {...same fields...},
     "vision": {"hidden_size": 32, "num_layers": 2, "intermediate_size": 64,
                "num_heads": 4, "patch_size": 14, "image_size": 56},
     "vocab_size": 512}

Whichever sizes are used are checked against the tensor shapes in the safetensors header.
This module reads JSON and the safetensors header only (no torch).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

POLICY_TYPES = ('pi0', 'pi05')
WEIGHTS_PREFIX = 'model.'
PALIGEMMA = 'paligemma_with_expert.paligemma.'
VISION_PREFIX = PALIGEMMA + 'model.vision_tower.vision_model.'
PROJECTOR_PREFIX = PALIGEMMA + 'model.multi_modal_projector.linear.'
LANGUAGE_PREFIX = PALIGEMMA + 'model.language_model.'
EMBEDDING_NAME = PALIGEMMA + 'lm_head.weight'  # the tied token embedding, stored once
EXPERT_PREFIX = 'paligemma_with_expert.gemma_expert.model.'
EXPERT_HEAD_NAME = 'paligemma_with_expert.gemma_expert.lm_head.weight'  # stored, unused
# The matrices LeRobot casts to bfloat16 under dtype "bfloat16" (Gemma's and the expert's
# projections and the token embeddings); everything else (the SigLIP tower, the projector,
# every norm, the action/state/time projections) stays float32.
BF16_SUFFIXES = (
    'q_proj.weight',
    'k_proj.weight',
    'v_proj.weight',
    'o_proj.weight',
    'gate_proj.weight',
    'up_proj.weight',
    'down_proj.weight',
    'lm_head.weight',
)


@dataclass(frozen=True, slots=True)
class GemmaSize:
    """One Gemma stack's sizes (openpi's ``gemma.Config``)."""

    width: int
    depth: int
    mlp_dim: int
    num_heads: int
    num_kv_heads: int
    head_dim: int

    def __post_init__(self) -> None:
        _check_positive(self, 'GemmaSize')
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f'GemmaSize num_heads {self.num_heads} is not a multiple of num_kv_heads '
                f'{self.num_kv_heads}'
            )


@dataclass(frozen=True, slots=True)
class SiglipSize:
    """The SigLIP vision tower's sizes; ``image_size`` is the square input side in pixels."""

    hidden_size: int
    num_layers: int
    intermediate_size: int
    num_heads: int
    patch_size: int
    image_size: int

    def __post_init__(self) -> None:
        _check_positive(self, 'SiglipSize')
        if self.image_size % self.patch_size:
            raise ValueError(
                f'SiglipSize image_size {self.image_size} is not a multiple of patch_size '
                f'{self.patch_size}'
            )
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f'SiglipSize hidden_size {self.hidden_size} is not a multiple of num_heads '
                f'{self.num_heads}'
            )

    @property
    def num_patches(self) -> int:
        """Image tokens of one camera: ``(image_size / patch_size) ** 2``."""
        return (self.image_size // self.patch_size) ** 2


@dataclass(frozen=True, slots=True)
class Pi0Sizes:
    """Every size a pi folder's weights have; the expert shares depth, heads and head_dim."""

    paligemma: GemmaSize
    expert: GemmaSize
    vision: SiglipSize
    vocab_size: int

    def __post_init__(self) -> None:
        if isinstance(self.vocab_size, bool) or not isinstance(self.vocab_size, int):
            raise ValueError(f'Pi0Sizes vocab_size must be an integer, got {self.vocab_size!r}')
        if self.vocab_size < 3:
            raise ValueError(
                f'Pi0Sizes vocab_size must hold <pad> <eos> <bos>, got {self.vocab_size}'
            )
        for name in ('depth', 'num_heads', 'num_kv_heads', 'head_dim'):
            a, b = getattr(self.paligemma, name), getattr(self.expert, name)
            if a != b:
                raise ValueError(
                    f'the action expert must share {name} with PaliGemma (joint attention): '
                    f'{b} != {a}'
                )

    def with_image_size(self, image_size: int) -> Pi0Sizes:
        vision = SiglipSize(
            hidden_size=self.vision.hidden_size,
            num_layers=self.vision.num_layers,
            intermediate_size=self.vision.intermediate_size,
            num_heads=self.vision.num_heads,
            patch_size=self.vision.patch_size,
            image_size=image_size,
        )
        return Pi0Sizes(self.paligemma, self.expert, vision, self.vocab_size)


def _check_positive(sizes: Any, kind: str) -> None:
    for name in sizes.__slots__:
        value = getattr(sizes, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f'{kind} {name} must be a positive integer, got {value!r}')


# openpi's / LeRobot's variants (``get_gemma_config``) and the tower PaliGemma-3B uses.
GEMMA_VARIANTS: Mapping[str, GemmaSize] = {
    'gemma_2b': GemmaSize(
        width=2048, depth=18, mlp_dim=16384, num_heads=8, num_kv_heads=1, head_dim=256
    ),
    'gemma_300m': GemmaSize(
        width=1024, depth=18, mlp_dim=4096, num_heads=8, num_kv_heads=1, head_dim=256
    ),
}
SIGLIP_SO400M_224 = SiglipSize(
    hidden_size=1152, num_layers=27, intermediate_size=4304, num_heads=16, patch_size=14,
    image_size=224,
)  # fmt: skip
PALIGEMMA_VOCAB_SIZE = 257152
PI0_REAL_SIZES = Pi0Sizes(
    paligemma=GEMMA_VARIANTS['gemma_2b'],
    expert=GEMMA_VARIANTS['gemma_300m'],
    vision=SIGLIP_SO400M_224,
    vocab_size=PALIGEMMA_VOCAB_SIZE,
)
# Tiny sizes for test folders: image 56 -> 16 patches of 14 pixels.
TINY_PI0_SIZES = Pi0Sizes(
    paligemma=GemmaSize(width=64, depth=2, mlp_dim=128, num_heads=4, num_kv_heads=1, head_dim=16),
    expert=GemmaSize(width=32, depth=2, mlp_dim=64, num_heads=4, num_kv_heads=1, head_dim=16),
    vision=SiglipSize(
        hidden_size=32, num_layers=2, intermediate_size=64, num_heads=4, patch_size=14,
        image_size=56,
    ),
    vocab_size=512,
)  # fmt: skip


def _linear(name: str, n_out: int, n_in: int, *, bias: bool) -> dict[str, tuple[int, ...]]:
    shapes: dict[str, tuple[int, ...]] = {f'{name}.weight': (n_out, n_in)}
    if bias:
        shapes[f'{name}.bias'] = (n_out,)
    return shapes


def _siglip_shapes(v: SiglipSize) -> dict[str, tuple[int, ...]]:
    """transformers' ``SiglipVisionModel`` names (no pooling head, as PaliGemma's)."""
    h, p = v.hidden_size, v.patch_size
    shapes: dict[str, tuple[int, ...]] = {
        'embeddings.patch_embedding.weight': (h, 3, p, p),
        'embeddings.patch_embedding.bias': (h,),
        'embeddings.position_embedding.weight': (v.num_patches, h),
    }
    for i in range(v.num_layers):
        layer = f'encoder.layers.{i}.'
        for norm in ('layer_norm1', 'layer_norm2'):
            shapes.update({f'{layer}{norm}.weight': (h,), f'{layer}{norm}.bias': (h,)})
        for proj in ('q_proj', 'k_proj', 'v_proj', 'out_proj'):
            shapes.update(_linear(f'{layer}self_attn.{proj}', h, h, bias=True))
        shapes.update(_linear(f'{layer}mlp.fc1', v.intermediate_size, h, bias=True))
        shapes.update(_linear(f'{layer}mlp.fc2', h, v.intermediate_size, bias=True))
    shapes.update({'post_layernorm.weight': (h,), 'post_layernorm.bias': (h,)})
    return shapes


def _norm_shapes(name: str, width: int, *, adaptive: bool) -> dict[str, tuple[int, ...]]:
    """A Gemma RMSNorm's weight, or pi0.5's adaptive norm ``dense`` (scale, shift, gate)."""
    if adaptive:
        return {f'{name}.dense.weight': (3 * width, width), f'{name}.dense.bias': (3 * width,)}
    return {f'{name}.weight': (width,)}


def _gemma_shapes(g: GemmaSize, *, adaptive: bool) -> dict[str, tuple[int, ...]]:
    """A Gemma decoder's layers and final norm (no embedding), as transformers names them."""
    w, q, kv = g.width, g.num_heads * g.head_dim, g.num_kv_heads * g.head_dim
    shapes: dict[str, tuple[int, ...]] = {}
    for i in range(g.depth):
        layer = f'layers.{i}.'
        shapes.update(_norm_shapes(f'{layer}input_layernorm', w, adaptive=adaptive))
        shapes.update(_linear(f'{layer}self_attn.q_proj', q, w, bias=False))
        shapes.update(_linear(f'{layer}self_attn.k_proj', kv, w, bias=False))
        shapes.update(_linear(f'{layer}self_attn.v_proj', kv, w, bias=False))
        shapes.update(_linear(f'{layer}self_attn.o_proj', w, q, bias=False))
        shapes.update(_norm_shapes(f'{layer}post_attention_layernorm', w, adaptive=adaptive))
        shapes.update(_linear(f'{layer}mlp.gate_proj', g.mlp_dim, w, bias=False))
        shapes.update(_linear(f'{layer}mlp.up_proj', g.mlp_dim, w, bias=False))
        shapes.update(_linear(f'{layer}mlp.down_proj', w, g.mlp_dim, bias=False))
    shapes.update(_norm_shapes('norm', w, adaptive=adaptive))
    return shapes


def pi0_weight_shapes(
    policy_type: str, sizes: Pi0Sizes, *, max_state_dim: int, max_action_dim: int
) -> dict[str, tuple[int, ...]]:
    """Every tensor of a pi0 / pi0.5 ``model.safetensors`` (names without the ``model.``
    prefix) and its shape.

    pi0 has ``state_proj`` and ``action_time_mlp_in/out`` (action and time concatenated);
    pi0.5 has ``time_mlp_in/out`` and adaptive expert norms (``*.dense``, [3w, w]).
    """
    if policy_type not in POLICY_TYPES:
        raise ValueError(f'policy type must be one of {POLICY_TYPES}, got {policy_type!r}')
    pi05 = policy_type == 'pi05'
    pg, ex = sizes.paligemma, sizes.expert
    shapes = {VISION_PREFIX + k: s for k, s in _siglip_shapes(sizes.vision).items()}
    shapes.update(_linear(PROJECTOR_PREFIX[:-1], pg.width, sizes.vision.hidden_size, bias=True))
    shapes.update({LANGUAGE_PREFIX + k: s for k, s in _gemma_shapes(pg, adaptive=False).items()})
    shapes[EMBEDDING_NAME] = (sizes.vocab_size, pg.width)
    shapes.update({EXPERT_PREFIX + k: s for k, s in _gemma_shapes(ex, adaptive=pi05).items()})
    shapes[EXPERT_HEAD_NAME] = (sizes.vocab_size, ex.width)
    w = ex.width
    if not pi05:
        shapes.update(_linear('state_proj', w, max_state_dim, bias=True))
    shapes.update(_linear('action_in_proj', w, max_action_dim, bias=True))
    shapes.update(_linear('action_out_proj', max_action_dim, w, bias=True))
    if pi05:
        shapes.update(_linear('time_mlp_in', w, w, bias=True))
        shapes.update(_linear('time_mlp_out', w, w, bias=True))
    else:
        shapes.update(_linear('action_time_mlp_in', w, 2 * w, bias=True))
        shapes.update(_linear('action_time_mlp_out', w, w, bias=True))
    return shapes


def is_bf16_weight(name: str) -> bool:
    """Whether LeRobot stores ``name`` in bfloat16 in a ``dtype: bfloat16`` folder."""
    return name.endswith(BF16_SUFFIXES) and 'vision_tower' not in name
