"""Model dimensions read from a Hugging Face ``config.json``, without importing transformers.

``DecoderSpec`` describes a Llama/Qwen2-family decoder, ``VisionSpec`` the vision tower and
projector of a LLaVA-layout checkpoint. Both accept the transformers 4 spelling of RoPE
(``rope_theta`` + ``rope_scaling``) and the transformers 5 one (``rope_parameters``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# Text models a Hugging Face config.json may name (LLaVA layout, text-only folders).
SUPPORTED_TEXT_MODELS = ('llama', 'qwen2')
# Decoders the paged decoder runs: those, and Gemma as a family assembles it (pi0's
# PaliGemma and action expert: the norms' 1 + w and the embedding scale are the family's).
DECODER_MODEL_TYPES = (*SUPPORTED_TEXT_MODELS, 'gemma')
# The gated MLP's activations: SwiGLU's SiLU, Gemma's tanh-approximated GELU.
HIDDEN_ACTIVATIONS = ('silu', 'gelu_pytorch_tanh')
SUPPORTED_VISION_MODELS = ('siglip_vision_model', 'clip_vision_model')
SUPPORTED_ROPE_TYPES = ('default', 'linear', 'llama3')


class UnsupportedArchitectureError(ValueError):
    """The checkpoint describes a model this package cannot run."""


@dataclass(frozen=True, slots=True)
class RopeSpec:
    """Rotary position embedding parameters (``rope_type`` default, linear or llama3)."""

    theta: float = 10000.0
    rope_type: str = 'default'
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    def __post_init__(self) -> None:
        if self.rope_type not in SUPPORTED_ROPE_TYPES:
            raise UnsupportedArchitectureError(
                f'rope_type {self.rope_type!r} is not supported; use one of {SUPPORTED_ROPE_TYPES}'
            )
        if not (self.theta > 0 and self.factor > 0):
            raise ValueError(f'rope theta and factor must be > 0, got {self.theta}, {self.factor}')
        if self.rope_type == 'llama3' and not self.high_freq_factor > self.low_freq_factor > 0:
            raise ValueError('llama3 rope needs high_freq_factor > low_freq_factor > 0')


@dataclass(frozen=True, slots=True)
class DecoderSpec:
    """Dimensions of a Llama/Qwen2/Gemma-family decoder (RMSNorm, RoPE, GQA, a gated MLP
    with ``hidden_act``)."""

    model_type: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float = 1e-6
    rope: RopeSpec = RopeSpec()
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    max_position_embeddings: int = 4096
    hidden_act: str = 'silu'

    def __post_init__(self) -> None:
        if self.hidden_act not in HIDDEN_ACTIVATIONS:
            raise UnsupportedArchitectureError(
                f'hidden_act {self.hidden_act!r} is not supported; use one of {HIDDEN_ACTIVATIONS}'
            )
        if self.model_type not in DECODER_MODEL_TYPES:
            raise UnsupportedArchitectureError(
                f'text model_type {self.model_type!r} is not supported; '
                f'use one of {DECODER_MODEL_TYPES}'
            )
        for name in (
            'vocab_size',
            'hidden_size',
            'num_layers',
            'num_heads',
            'num_kv_heads',
            'head_dim',
            'intermediate_size',
        ):
            if getattr(self, name) < 1:
                raise ValueError(f'{name} must be >= 1, got {getattr(self, name)}')
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f'num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}'
            )
        if self.head_dim % 2:
            raise ValueError(f'head_dim must be even for RoPE, got {self.head_dim}')

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def sm_scale(self) -> float:
        return 1.0 / math.sqrt(self.head_dim)

    def num_params(self) -> int:
        """Parameter count (embedding and lm_head counted once each unless tied)."""
        attn = self.hidden_size * (self.q_size + 2 * self.kv_size) + self.q_size * self.hidden_size
        mlp = 3 * self.hidden_size * self.intermediate_size
        per_layer = attn + mlp + 2 * self.hidden_size
        embed = self.vocab_size * self.hidden_size
        head = 0 if self.tie_word_embeddings else embed
        return self.num_layers * per_layer + embed + head + self.hidden_size

    @classmethod
    def from_hf_config(
        cls, text: Mapping[str, Any], *, tie_word_embeddings: bool = False
    ) -> DecoderSpec:
        """Parse a Llama/Qwen2 ``text_config`` (or a whole text-only ``config.json``)."""
        model_type = str(text.get('model_type', 'llama'))
        if model_type not in SUPPORTED_TEXT_MODELS:
            raise UnsupportedArchitectureError(
                f'text model_type {model_type!r} is not supported; use one of '
                f'{SUPPORTED_TEXT_MODELS}'
            )
        if text.get('hidden_act', 'silu') != 'silu':
            raise UnsupportedArchitectureError(f'hidden_act {text["hidden_act"]!r} is not silu')
        if model_type == 'qwen2' and text.get('use_sliding_window', False):
            raise UnsupportedArchitectureError('Qwen2 sliding-window attention is not supported')
        num_heads = int(text['num_attention_heads'])
        hidden = int(text['hidden_size'])
        head_dim = text.get('head_dim') or hidden // num_heads
        attention_bias = bool(text.get('attention_bias', False))
        return cls(
            model_type=model_type,
            vocab_size=int(text['vocab_size']),
            hidden_size=hidden,
            num_layers=int(text['num_hidden_layers']),
            num_heads=num_heads,
            num_kv_heads=int(text.get('num_key_value_heads') or num_heads),
            head_dim=int(head_dim),
            intermediate_size=int(text['intermediate_size']),
            rms_norm_eps=float(text.get('rms_norm_eps', 1e-6)),
            rope=parse_rope(text),
            tie_word_embeddings=tie_word_embeddings or bool(text.get('tie_word_embeddings')),
            qkv_bias=model_type == 'qwen2' or attention_bias,
            o_bias=model_type != 'qwen2' and attention_bias,
            mlp_bias=bool(text.get('mlp_bias', False)),
            max_position_embeddings=int(text.get('max_position_embeddings', 4096)),
        )


def parse_rope(text: Mapping[str, Any]) -> RopeSpec:
    """Read RoPE settings from either config spelling."""
    params = dict(text.get('rope_parameters') or text.get('rope_scaling') or {})
    theta = params.get('rope_theta', text.get('rope_theta', 10000.0))
    rope_type = params.get('rope_type', params.get('type', 'default'))
    if params.get('partial_rotary_factor', text.get('partial_rotary_factor', 1.0)) != 1.0:
        raise UnsupportedArchitectureError('partial rotary embeddings are not supported')
    original = params.get(
        'original_max_position_embeddings', text.get('max_position_embeddings', 8192)
    )
    return RopeSpec(
        theta=float(theta),
        rope_type=str(rope_type),
        factor=float(params.get('factor', 1.0)),
        low_freq_factor=float(params.get('low_freq_factor', 1.0)),
        high_freq_factor=float(params.get('high_freq_factor', 4.0)),
        original_max_position_embeddings=int(original),
    )


@dataclass(frozen=True, slots=True, eq=False)
class VisionSpec:
    """A LLaVA vision tower (built through transformers) and its two-layer MLP projector.

    Attributes:
        tower_config: The checkpoint's ``vision_config`` mapping, handed to transformers.
        feature_layers: Hidden-state indices whose outputs feed the projector (concatenated).
        select_strategy: ``default`` drops the first (CLS) token, ``full`` keeps all.
        projector_act: Activation between the projector's two linear layers.
        projector_bias: Whether the projector's linear layers have biases.
        text_hidden_size: Width of the decoder the projector feeds.
    """

    tower_config: Mapping[str, Any]
    feature_layers: tuple[int, ...]
    select_strategy: str
    projector_act: str
    projector_bias: bool
    text_hidden_size: int

    def __post_init__(self) -> None:
        model_type = self.model_type
        if model_type not in SUPPORTED_VISION_MODELS:
            raise UnsupportedArchitectureError(
                f'vision model_type {model_type!r} is not supported; use one of '
                f'{SUPPORTED_VISION_MODELS}'
            )
        if self.select_strategy not in ('default', 'full'):
            raise ValueError(f'unknown vision_feature_select_strategy {self.select_strategy!r}')
        if self.image_size % self.patch_size:
            raise ValueError(f'image_size {self.image_size} is not a multiple of the patch size')
        if not self.feature_layers:
            raise ValueError('vision_feature_layer is empty')

    @property
    def model_type(self) -> str:
        return str(self.tower_config.get('model_type', ''))

    @property
    def image_size(self) -> int:
        return int(self.tower_config.get('image_size', 224))

    @property
    def patch_size(self) -> int:
        return int(self.tower_config.get('patch_size', 16))

    @property
    def hidden_size(self) -> int:
        return int(self.tower_config['hidden_size'])

    @property
    def num_channels(self) -> int:
        return int(self.tower_config.get('num_channels', 3))

    @property
    def num_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    @property
    def num_image_tokens(self) -> int:
        """Placeholder tokens one image takes in the prompt."""
        has_cls = self.model_type == 'clip_vision_model'
        return self.num_patches + int(has_cls) - int(self.select_strategy == 'default')

    @property
    def projector_in_size(self) -> int:
        return self.hidden_size * len(self.feature_layers)

    @classmethod
    def from_llava_config(cls, config: Mapping[str, Any], *, text_hidden_size: int) -> VisionSpec:
        """Parse the vision part of a LLaVA ``config.json``."""
        vision = config.get('vision_config')
        if not isinstance(vision, Mapping):
            raise UnsupportedArchitectureError('LLaVA config.json has no vision_config')
        layer = config.get('vision_feature_layer', -2)
        layers = (int(layer),) if isinstance(layer, int) else tuple(int(x) for x in layer)
        return cls(
            tower_config=dict(vision),
            feature_layers=layers,
            select_strategy=str(config.get('vision_feature_select_strategy', 'default')),
            projector_act=str(config.get('projector_hidden_act', 'gelu')),
            projector_bias=bool(config.get('multimodal_projector_bias', True)),
            text_hidden_size=text_hidden_size,
        )
