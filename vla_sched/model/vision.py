"""Vision tower (through transformers), LLaVA projector, image preprocessing, feature cache.

The tower runs once per image and has no KV cache; its selected hidden states go through
a two-layer MLP projector into the decoder's embedding space, where they replace the image
placeholder tokens. Images are resized and normalized in torch (no torchvision, no PIL).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from vla_sched.model.architecture import VisionSpec
from vla_sched.model.checkpoint_spec import ImagePreprocessing
from vla_sched.model.transfer import to_device


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
    """A randomly initialized tower module of the checkpoint's type (on the CPU)."""
    from transformers import AutoModel

    return AutoModel.from_config(tower_hf_config(spec), dtype=dtype)


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


def preprocess_image(
    pixels: np.ndarray, prep: ImagePreprocessing, *, device: torch.device | str = 'cpu'
) -> torch.Tensor:
    """uint8 ``[H, W, 3]`` RGB -> normalized float32 ``[3, S, S]``.

    Resizing is bicubic with antialiasing, rounded and clamped to the uint8 range as an
    image library would, then rescaled by 1/255 and normalized with the checkpoint's
    mean/std.

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
    mean = to_device(torch.tensor(prep.mean, dtype=torch.float32), image.device)[:, None, None]
    std = to_device(torch.tensor(prep.std, dtype=torch.float32), image.device)[:, None, None]
    return ((image[0] / 255.0) - mean) / std


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

    def put_many(self, items: Mapping[int, torch.Tensor]) -> None:
        for content_hash, features in items.items():
            self.put(content_hash, features)
