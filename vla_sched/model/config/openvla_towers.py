"""OpenVLA's vision backbone as ``config.json`` names it: one or two timm ViT towers.

An OpenVLA folder (``model_type: "openvla"``) names its towers by timm model id
(``timm_model_ids``); the shapes below are those ids' architectures at OpenVLA's 224 px. A
tiny test folder keeps the real ids and overrides the shapes with ``timm_model_args`` (a
list parallel to the ids of keyword arguments such as ``embed_dim``, ``depth``,
``num_heads``, ``mlp_ratio``). Only JSON is read here: no torch, timm or transformers.

Each tower yields the patch tokens of its second-to-last block (prefix and register tokens
dropped, no final norm); a fused backbone concatenates the two towers' patch features on
the channel axis and projects them with a three-layer MLP (two layers for one tower).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from vla_sched.model.config.architecture import UnsupportedArchitectureError

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
SIGLIP_MEAN = (0.5, 0.5, 0.5)
SIGLIP_STD = (0.5, 0.5, 0.5)
OPENVLA_IMAGE_SIZE = 224
RESIZE_STRATEGIES = ('resize-naive',)
TOWER_KINDS = ('dinov2_reg', 'siglip')


@dataclass(frozen=True, slots=True)
class TowerSpec:
    """One ViT tower as timm builds it for OpenVLA.

    Attributes:
        timm_model_id: The id in ``config.json`` (names the architecture).
        kind: ``dinov2_reg`` (class token, register tokens, LayerScale, exact GELU) or
            ``siglip`` (no class token, no LayerScale, tanh GELU).
        embed_dim, depth, num_heads: Width, number of blocks and attention heads.
        mlp_hidden: Width of each block's MLP.
        patch_size, image_size: Patches of ``patch_size`` pixels over a square image.
        num_registers: Register tokens after the class token (DINOv2 reg4: 4).
        norm_eps: LayerNorm epsilon (timm's ViTs: 1e-6).
        mean, std: Per-channel normalization of this tower's three pixel channels.
    """

    timm_model_id: str
    kind: str
    embed_dim: int
    depth: int
    num_heads: int
    mlp_hidden: int
    patch_size: int = 14
    image_size: int = OPENVLA_IMAGE_SIZE
    num_registers: int = 0
    norm_eps: float = 1e-6
    mean: tuple[float, float, float] = SIGLIP_MEAN
    std: tuple[float, float, float] = SIGLIP_STD

    def __post_init__(self) -> None:
        if self.kind not in TOWER_KINDS:
            raise UnsupportedArchitectureError(
                f'tower kind {self.kind!r} is not supported; use one of {TOWER_KINDS}'
            )
        for name in ('embed_dim', 'depth', 'num_heads', 'mlp_hidden', 'patch_size'):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise UnsupportedArchitectureError(
                    f'{self.timm_model_id}: {name} must be a positive integer, got {value!r}'
                )
        if self.embed_dim % self.num_heads:
            raise UnsupportedArchitectureError(
                f'{self.timm_model_id}: embed_dim {self.embed_dim} is not a multiple of '
                f'num_heads {self.num_heads}'
            )
        if self.image_size % self.patch_size:
            raise UnsupportedArchitectureError(
                f'{self.timm_model_id}: image_size {self.image_size} is not a multiple of the '
                f'patch size {self.patch_size}'
            )
        if self.depth < 2:
            raise UnsupportedArchitectureError(
                f'{self.timm_model_id}: the second-to-last block needs depth >= 2'
            )

    @property
    def has_class_token(self) -> bool:
        return self.kind == 'dinov2_reg'

    @property
    def has_layer_scale(self) -> bool:
        return self.kind == 'dinov2_reg'

    @property
    def num_prefix_tokens(self) -> int:
        """Class and register tokens before the patches (dropped from the features)."""
        return int(self.has_class_token) + self.num_registers

    @property
    def num_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    @property
    def feature_layer(self) -> int:
        """Index into a ``hidden_states`` tuple (0: embeddings) of the second-to-last block."""
        return self.depth - 1


# The architectures of the timm ids OpenVLA uses, at OpenVLA's 224 px (timm's defaults for
# these ids; LayerNorm eps 1e-6 throughout).
KNOWN_TOWERS: dict[str, dict[str, Any]] = {
    'vit_large_patch14_reg4_dinov2.lvd142m': {
        'kind': 'dinov2_reg', 'embed_dim': 1024, 'depth': 24, 'num_heads': 16,
        'mlp_ratio': 4.0, 'num_registers': 4, 'mean': IMAGENET_MEAN, 'std': IMAGENET_STD,
    },
    'vit_so400m_patch14_siglip_224': {
        'kind': 'siglip', 'embed_dim': 1152, 'depth': 27, 'num_heads': 16,
        'mlp_hidden': 4304, 'mean': SIGLIP_MEAN, 'std': SIGLIP_STD,
    },
}  # fmt: skip
TOWER_ARGS = ('embed_dim', 'depth', 'num_heads', 'mlp_ratio')


def tower_spec(timm_model_id: str, overrides: Mapping[str, Any] | None = None) -> TowerSpec:
    """The tower of a timm id, with ``timm_model_args`` overrides (tiny test folders).

    Raises:
        UnsupportedArchitectureError: an unknown id, or an override this loader cannot apply.
    """
    known = KNOWN_TOWERS.get(timm_model_id)
    if known is None:
        raise UnsupportedArchitectureError(
            f'vision tower timm_model_ids entry {timm_model_id!r} is not supported; use one of '
            f'{sorted(KNOWN_TOWERS)}'
        )
    args = dict(known)
    overrides = dict(overrides or {})
    unknown = sorted(set(overrides) - set(TOWER_ARGS))
    if unknown:
        raise UnsupportedArchitectureError(
            f'timm_model_args for {timm_model_id!r}: unsupported keys {unknown}; '
            f'supported: {list(TOWER_ARGS)}'
        )
    args.update(overrides)
    if 'mlp_ratio' in overrides or 'mlp_hidden' not in args:
        args.pop('mlp_hidden', None)
        args['mlp_hidden'] = int(args['embed_dim'] * float(args['mlp_ratio']))
    args.pop('mlp_ratio', None)
    return TowerSpec(timm_model_id=timm_model_id, **args)


@dataclass(frozen=True, slots=True)
class OpenVLAVisionSpec:
    """OpenVLA's vision backbone and projector.

    Attributes:
        towers: One tower (v01: SigLIP) or two (fused: DINOv2 then SigLIP, in the order of
            ``timm_model_ids``, which is also the order of the six pixel channels and of the
            concatenated features).
        text_hidden_size: Width of the decoder the projector feeds.
        image_resize_strategy: How a frame becomes 224 x 224 (``resize-naive``: a plain
            bicubic resize).
    """

    towers: tuple[TowerSpec, ...]
    text_hidden_size: int
    image_resize_strategy: str = 'resize-naive'

    def __post_init__(self) -> None:
        if len(self.towers) not in (1, 2):
            raise UnsupportedArchitectureError(
                f'OpenVLA has one or two vision towers, got {len(self.towers)}'
            )
        if len({(t.image_size, t.num_patches) for t in self.towers}) != 1:
            raise UnsupportedArchitectureError(
                'the fused towers must see the same image size and patch grid'
            )
        if self.image_resize_strategy not in RESIZE_STRATEGIES:
            raise UnsupportedArchitectureError(
                f'image_resize_strategy {self.image_resize_strategy!r} is not supported; use '
                f'one of {RESIZE_STRATEGIES}'
            )

    @property
    def fused(self) -> bool:
        return len(self.towers) == 2

    @property
    def feature_dim(self) -> int:
        """Width of the concatenated patch features (the projector's input)."""
        return sum(t.embed_dim for t in self.towers)

    @property
    def image_size(self) -> int:
        return self.towers[0].image_size

    @property
    def num_channels(self) -> int:
        """Pixel channels: three per tower (six for the fused backbone)."""
        return 3 * len(self.towers)

    @property
    def num_image_tokens(self) -> int:
        """Projected patch embeddings one image adds to the sequence."""
        return self.towers[0].num_patches


def openvla_vision_spec(config: Mapping[str, Any], *, text_hidden_size: int) -> OpenVLAVisionSpec:
    """The vision spec of an OpenVLA ``config.json`` (``timm_model_ids`` and optional
    ``timm_model_args``, ``image_sizes``, ``image_resize_strategy``).

    Raises:
        UnsupportedArchitectureError: naming the field that this loader cannot serve.
    """
    ids = config.get('timm_model_ids')
    if not isinstance(ids, Sequence) or isinstance(ids, str) or not ids:
        raise UnsupportedArchitectureError('OpenVLA config.json needs a list timm_model_ids')
    args = config.get('timm_model_args') or [{}] * len(ids)
    if not isinstance(args, Sequence) or len(args) != len(ids):
        raise UnsupportedArchitectureError(
            'timm_model_args must be a list parallel to timm_model_ids'
        )
    towers = tuple(tower_spec(str(i), a) for i, a in zip(ids, args, strict=True))
    sizes = config.get('image_sizes')
    if sizes is not None:
        if not isinstance(sizes, Sequence) or len(sizes) != len(towers):
            raise UnsupportedArchitectureError(
                'image_sizes must be a list parallel to timm_model_ids'
            )
        towers = tuple(
            dataclasses.replace(t, image_size=int(s)) for s, t in zip(sizes, towers, strict=True)
        )
    fused = bool(config.get('use_fused_vision_backbone', len(towers) == 2))
    if fused != (len(towers) == 2):
        raise UnsupportedArchitectureError(
            f'use_fused_vision_backbone={fused} does not match {len(towers)} timm_model_ids'
        )
    return OpenVLAVisionSpec(
        towers=towers,
        text_hidden_size=text_hidden_size,
        image_resize_strategy=str(config.get('image_resize_strategy', 'resize-naive')),
    )
