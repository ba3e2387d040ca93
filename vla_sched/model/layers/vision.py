"""Vision towers (through transformers), projectors, image preprocessing, feature cache.

A tower runs once per image and has no KV cache; its selected hidden states go through an
MLP projector into the decoder's embedding space, where they replace the image placeholder
tokens. LLaVA checkpoints have one tower and a two-layer projector (``VisionEncoder``);
OpenVLA checkpoints have one or two timm ViT towers, rebuilt here as transformers'
``Dinov2WithRegistersModel`` and ``SiglipVisionModel``, and a two- or three-layer projector
(``OpenVLAVisionEncoder``). Images are resized and normalized in torch (no torchvision, no
PIL).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from vla_sched.model.config.architecture import UnsupportedArchitectureError, VisionSpec
from vla_sched.model.config.checkpoint_spec import ImagePreprocessing
from vla_sched.model.config.openvla_towers import OpenVLAVisionSpec, TowerSpec
from vla_sched.model.layers.transfer import to_device


def _activation(name: str) -> nn.Module:
    from transformers.activations import ACT2FN

    if name not in ACT2FN:
        raise ValueError(f'unknown projector activation {name!r}')
    return ACT2FN[name]


class Projector(nn.Module):
    """LLaVA's ``linear_2(act(linear_1(features)))``."""

    def __init__(self, spec: VisionSpec, *, device=None, dtype=None) -> None:
        super().__init__()
        factory = {'device': device, 'dtype': dtype}
        bias = spec.projector_bias
        self.linear_1 = nn.Linear(spec.projector_in_size, spec.text_hidden_size, bias, **factory)
        self.act = _activation(spec.projector_act)
        self.linear_2 = nn.Linear(spec.text_hidden_size, spec.text_hidden_size, bias, **factory)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.linear_2(self.act(self.linear_1(features)))


def tower_hf_config(spec: VisionSpec) -> Any:
    """The transformers config of the tower (SigLIP's pooling head is switched off)."""
    from transformers import AutoConfig

    fields = dict(spec.tower_config)
    model_type = fields.pop('model_type')
    for key in ('transformers_version', 'architectures', '_name_or_path'):
        fields.pop(key, None)
    if model_type == 'siglip_vision_model':
        fields['vision_use_head'] = False
    return AutoConfig.for_model(model_type, **fields)


def build_vision_tower(spec: VisionSpec, *, dtype: torch.dtype) -> nn.Module:
    """The checkpoint's tower module on the meta device: shapes only, no storage.

    Its weights are to be assigned (``load_state_dict(..., assign=True)``), then its
    computed buffers made with :func:`materialize_buffers`.
    """
    return _empty_tower(tower_hf_config(spec), dtype=dtype)


def _empty_tower(hf_config: Any, *, dtype: torch.dtype) -> nn.Module:
    from transformers import AutoModel

    # Random initialization of a 400M-parameter tower takes tens of seconds on a CPU, and
    # every value would be overwritten by the checkpoint's.
    with torch.device('meta'):
        return AutoModel.from_config(hf_config, dtype=dtype)


def materialize_buffers(module: nn.Module, device: torch.device | str) -> None:
    """Make the computed (non-persistent) buffers a meta-built tower still lacks.

    The towers' only such buffers are position ids (``arange`` over the positions).

    Raises:
        ValueError: for any other tensor still on the meta device, named.
    """
    for name, buffer in list(module.named_buffers()):
        if not buffer.is_meta:
            continue
        owner_name, _, leaf = name.rpartition('.')
        if leaf != 'position_ids':
            raise ValueError(f'tower buffer {name} was neither loaded nor computed')
        ids = torch.arange(buffer.shape[-1], device=device).expand(buffer.shape).to(buffer.dtype)
        module.get_submodule(owner_name).register_buffer(leaf, ids, persistent=False)
    missing = [name for name, param in module.named_parameters() if param.is_meta]
    if missing:
        raise ValueError(f'tower parameters were not loaded: {missing[:3]}')


class VisionEncoder(nn.Module):
    """Tower + feature selection + projector: ``pixel_values -> [N, tokens, text_hidden]``."""

    def __init__(self, spec: VisionSpec, tower: nn.Module, projector: Projector) -> None:
        super().__init__()
        self.spec = spec
        self.vision_tower = tower
        self.multi_modal_projector = projector

    @torch.no_grad()
    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        dtype = self.multi_modal_projector.linear_1.weight.dtype
        out = self.vision_tower(
            pixel_values.to(dtype), output_hidden_states=True, return_dict=True
        )
        selected = [out.hidden_states[i] for i in self.spec.feature_layers]
        if self.spec.select_strategy == 'default':
            selected = [h[:, 1:] for h in selected]
        features = self.multi_modal_projector(torch.cat(selected, dim=-1))
        if features.shape[1] != self.spec.num_image_tokens:
            raise RuntimeError(
                f'vision tower produced {features.shape[1]} tokens per image, expected '
                f'{self.spec.num_image_tokens}'
            )
        return features


# timm's LayerScale init for DINOv2 (the weights are overwritten on load).
DINOV2_LAYER_SCALE_INIT = 1e-5


def openvla_tower_hf_config(tower: TowerSpec) -> Any:
    """The transformers config of one OpenVLA tower.

    ``dinov2_reg``: ``Dinov2WithRegistersConfig`` (exact GELU, LayerScale, registers);
    ``siglip``: ``SiglipVisionConfig`` (tanh GELU, no pooling head). Only fields that
    transformers 4.x and 5.x both have are set.

    Raises:
        UnsupportedArchitectureError: for a DINOv2 MLP width that is not a whole multiple of
            the embedding width (transformers sizes that MLP by an integer ratio).
    """
    common = {
        'hidden_size': tower.embed_dim,
        'num_hidden_layers': tower.depth,
        'num_attention_heads': tower.num_heads,
        'image_size': tower.image_size,
        'patch_size': tower.patch_size,
        'num_channels': 3,
        'layer_norm_eps': tower.norm_eps,
    }
    if tower.kind == 'dinov2_reg':
        from transformers import Dinov2WithRegistersConfig

        ratio, rest = divmod(tower.mlp_hidden, tower.embed_dim)
        if rest:
            raise UnsupportedArchitectureError(
                f'{tower.timm_model_id}: mlp width {tower.mlp_hidden} is not a multiple of '
                f'embed_dim {tower.embed_dim}'
            )
        return Dinov2WithRegistersConfig(
            **common,
            mlp_ratio=ratio,
            hidden_act='gelu',
            qkv_bias=True,
            layerscale_value=DINOV2_LAYER_SCALE_INIT,
            use_swiglu_ffn=False,
            num_register_tokens=tower.num_registers,
        )
    from transformers import SiglipVisionConfig

    return SiglipVisionConfig(
        **common,
        intermediate_size=tower.mlp_hidden,
        hidden_act='gelu_pytorch_tanh',
        vision_use_head=False,
    )


def build_openvla_tower(tower: TowerSpec, *, dtype: torch.dtype) -> nn.Module:
    """The transformers tower for ``tower`` on the meta device, as ``build_vision_tower``."""
    return _empty_tower(openvla_tower_hf_config(tower), dtype=dtype)


class OpenVLAProjector(nn.Module):
    """OpenVLA's projector: ``fc3(gelu(fc2(gelu(fc1(x)))))`` fused, ``fc2(gelu(fc1(x)))``
    for one tower (exact GELU, biases throughout)."""

    def __init__(self, spec: OpenVLAVisionSpec, *, device=None, dtype=None) -> None:
        super().__init__()
        factory = {'device': device, 'dtype': dtype}
        f, h = spec.feature_dim, spec.text_hidden_size
        self.fused = spec.fused
        self.fc1 = nn.Linear(f, 4 * f if self.fused else h, **factory)
        self.fc2 = nn.Linear(4 * f if self.fused else h, h, **factory)
        self.fc3 = nn.Linear(h, h, **factory) if self.fused else None
        self.act = nn.GELU()

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        out = self.fc2(self.act(self.fc1(features)))
        if self.fc3 is not None:
            out = self.fc3(self.act(out))
        return out


class OpenVLAVisionEncoder(nn.Module):
    """OpenVLA's towers + patch feature concatenation + projector.

    ``pixel_values`` ``[N, 3 * towers, S, S]`` (channels ``3i..3i+2`` for tower ``i``) ->
    ``[N, patches, text_hidden]``. Each tower runs once over the whole batch; its features
    are the hidden states after its second-to-last block with the class and register
    tokens dropped and no final norm.
    """

    def __init__(
        self, spec: OpenVLAVisionSpec, towers: list[nn.Module], projector: OpenVLAProjector
    ) -> None:
        super().__init__()
        if len(towers) != len(spec.towers):
            raise ValueError(f'the spec has {len(spec.towers)} towers, got {len(towers)} modules')
        self.spec = spec
        self.towers = nn.ModuleList(towers)
        self.projector = projector

    @torch.no_grad()
    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        projected = self.projector(self.patch_features(pixel_values))
        if projected.shape[1] != self.spec.num_image_tokens:
            raise RuntimeError(
                f'vision towers produced {projected.shape[1]} tokens per image, expected '
                f'{self.spec.num_image_tokens}'
            )
        return projected

    @torch.no_grad()
    def patch_features(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """The towers' concatenated patch features ``[N, patches, feature_dim]``.

        Raises:
            ValueError: for pixel values that are not ``[N, 3 * towers, S, S]``.
        """
        spec = self.spec
        size = spec.image_size
        if pixel_values.ndim != 4 or tuple(pixel_values.shape[1:]) != (
            spec.num_channels,
            size,
            size,
        ):
            raise ValueError(
                f'pixel_values must be [N, {spec.num_channels}, {size}, {size}], got '
                f'{tuple(pixel_values.shape)}'
            )
        dtype = self.projector.fc1.weight.dtype
        features = []
        for i, (tower_spec, tower) in enumerate(zip(spec.towers, self.towers, strict=True)):
            pixels = pixel_values[:, 3 * i : 3 * i + 3].to(dtype)
            out = tower(pixel_values=pixels, output_hidden_states=True, return_dict=True)
            hidden = out.hidden_states[tower_spec.feature_layer]
            features.append(hidden[:, tower_spec.num_prefix_tokens :])
        return torch.cat(features, dim=-1)


def check_native_positions(tower: nn.Module, spec: TowerSpec) -> None:
    """Check that a DINOv2 tower adds its position table unchanged at the native size.

    timm adds OpenVLA's ``pos_embed`` as stored at 224 px; a transformers release that
    resampled the table even at the native size would change every feature.

    Raises:
        RuntimeError: when the installed transformers resamples at the native size.
    """
    if spec.kind != 'dinov2_reg':
        return
    embeddings = tower.embeddings
    table = embeddings.position_embeddings
    probe = table.new_zeros(1, table.shape[1], table.shape[2])
    used = embeddings.interpolate_pos_encoding(probe, spec.image_size, spec.image_size)
    if not torch.equal(used, table):
        raise RuntimeError(
            f'{spec.timm_model_id}: the installed transformers resamples the DINOv2 position '
            'embeddings at the native image size; OpenVLA adds them unchanged'
        )


def preprocess_image(
    pixels: np.ndarray, prep: ImagePreprocessing, *, device: torch.device | str = 'cpu'
) -> torch.Tensor:
    """uint8 ``[H, W, 3]`` RGB -> normalized float32 ``[3 * k, S, S]``.

    The frame is resized once (bicubic with antialiasing, rounded and clamped to the uint8
    range as an image library would), rescaled by 1/255 and repeated ``k`` times
    (``k = len(prep.mean) // 3``: 1 for LLaVA, one per tower for OpenVLA), each group of
    three channels normalized with its own three means and stds.

    Raises:
        ValueError: for anything but a uint8 ``[H, W, 3]`` array.
    """
    if not isinstance(pixels, np.ndarray) or pixels.dtype != np.uint8:
        raise ValueError(f'image must be a uint8 numpy array, got {type(pixels).__name__}')
    if pixels.ndim != 3 or pixels.shape[2] != 3 or min(pixels.shape[:2]) < 1:
        raise ValueError(f'image must have shape [H, W, 3], got {pixels.shape}')
    image = to_device(torch.from_numpy(np.ascontiguousarray(pixels)), torch.device(device))
    image = image.permute(2, 0, 1).to(torch.float32)[None]
    size = prep.image_size
    if image.shape[-2:] != (size, size):
        image = F.interpolate(
            image, size=(size, size), mode='bicubic', align_corners=False, antialias=True
        )
        image = image.round().clamp(0.0, 255.0)
    groups = len(prep.mean) // 3
    mean = to_device(torch.tensor(prep.mean, dtype=torch.float32), image.device)
    std = to_device(torch.tensor(prep.std, dtype=torch.float32), image.device)
    normalized = (image / 255.0 - mean.view(groups, 3, 1, 1)) / std.view(groups, 3, 1, 1)
    return normalized.reshape(3 * groups, size, size)


class FeatureCache:
    """A small LRU of projected image features keyed by the image's content hash."""

    def __init__(self, max_entries: int = 64) -> None:
        if max_entries < 1:
            raise ValueError(f'max_entries must be >= 1, got {max_entries}')
        self.max_entries = max_entries
        self._entries: OrderedDict[int, torch.Tensor] = OrderedDict()
        self.num_hits = 0
        self.num_misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, content_hash: int) -> bool:
        return content_hash in self._entries

    def get(self, content_hash: int) -> torch.Tensor | None:
        features = self._entries.get(content_hash)
        if features is None:
            self.num_misses += 1
            return None
        self.num_hits += 1
        self._entries.move_to_end(content_hash)
        return features

    def put(self, content_hash: int, features: torch.Tensor) -> None:
        self._entries[content_hash] = features
        self._entries.move_to_end(content_hash)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def features_of(
        self,
        images: Iterable[tuple[str, int, np.ndarray]],
        *,
        preprocessing: ImagePreprocessing,
        device: torch.device,
        encode: Callable[[torch.Tensor], torch.Tensor],
    ) -> dict[int, torch.Tensor]:
        """Projected features per content hash of ``images`` (``(rid, content_hash,
        pixels)``): cached ones looked up, the others preprocessed and encoded in one
        ``encode`` call (``[N, C, S, S]`` pixels -> ``[N, tokens, hidden]``) and cached.

        Raises:
            ValueError: naming the request and image whose pixels cannot be preprocessed.
        """
        features: dict[int, torch.Tensor] = {}
        pending: dict[int, torch.Tensor] = {}
        for rid, content_hash, pixels in images:
            if content_hash in features or content_hash in pending:
                continue
            cached = self.get(content_hash)
            if cached is not None:
                features[content_hash] = cached
                continue
            try:
                pending[content_hash] = preprocess_image(pixels, preprocessing, device=device)
            except ValueError as exc:
                raise ValueError(f'request {rid}, image {content_hash}: {exc}') from None
        if pending:
            encoded = encode(torch.stack(list(pending.values())))
            for content_hash, rows in zip(pending, encoded, strict=True):
                features[content_hash] = rows
                self.put(content_hash, rows)
        return features

    def put_many(self, items: Mapping[int, torch.Tensor]) -> None:
        for content_hash, features in items.items():
            self.put(content_hash, features)
