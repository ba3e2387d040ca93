"""The LLaVA layout (``model_type: "llava"``, our own tiny checkpoint) and text-only Llama/Qwen2.

``config.json`` holds ``text_config``, ``vision_config`` and ``image_token_index``;
``preprocessor_config.json`` (image mean/std) and ``vla_config.json`` (this package's
settings: action token range, horizon, prompt template) are optional, and everything missing
from ``vla_config.json`` falls back to OpenVLA's conventions.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vla_sched.model.config.action_space import (
    ActionStatistics,
    ActionTokenizerConfig,
    load_action_statistics,
)
from vla_sched.model.config.architecture import (
    DecoderSpec,
    UnsupportedArchitectureError,
    VisionSpec,
)
from vla_sched.model.config.checkpoint_spec import (
    CheckpointError,
    CheckpointSpec,
    ImagePreprocessing,
    PromptTemplate,
)

LLAVA_MODEL_TYPES = ('llava', 'llama', 'qwen2')


def llava_architecture(config: Mapping[str, Any]) -> tuple[DecoderSpec, VisionSpec | None]:
    """Decoder and vision specs of a LLaVA (or text-only Llama/Qwen2) ``config.json``.

    Raises:
        UnsupportedArchitectureError: naming the field this package cannot serve.
    """
    model_type = config.get('model_type')
    if model_type == 'llava':
        text = config.get('text_config')
        if not isinstance(text, Mapping):
            raise UnsupportedArchitectureError('LLaVA config.json has no text_config')
        tie = bool(config.get('tie_word_embeddings', False))
        decoder = DecoderSpec.from_hf_config(text, tie_word_embeddings=tie)
        vision = VisionSpec.from_llava_config(config, text_hidden_size=decoder.hidden_size)
        return decoder, vision
    if model_type in ('llama', 'qwen2'):
        return DecoderSpec.from_hf_config(config), None
    raise UnsupportedArchitectureError(f'model_type {model_type!r} is not a LLaVA layout')


def _proprio_statistics(statistics: Mapping[str, Any]) -> dict[str, ActionStatistics]:
    present = {
        name: {'action': entry['proprio']}
        for name, entry in statistics.items()
        if isinstance(entry, Mapping) and isinstance(entry.get('proprio'), Mapping)
    }
    return load_action_statistics(present) if present else {}


def llava_spec_from_dicts(
    config: Mapping[str, Any],
    vla: Mapping[str, Any],
    statistics: Mapping[str, Any],
    *,
    preprocessor: Mapping[str, Any] | None = None,
    default_vocab_end: int | None = None,
) -> CheckpointSpec:
    """The spec of a LLaVA (or text-only) folder; arguments as ``formats.spec_from_dicts``."""
    decoder, vision = llava_architecture(config)
    tokens = dict(vla.get('action_tokens', {}))
    if 'vocab_end' not in tokens:
        if default_vocab_end is None:
            raise CheckpointError('the action token range needs vocab_end or a tokenizer')
        tokens['vocab_end'] = default_vocab_end
    preprocessing = None
    if vision is not None:
        pre = preprocessor or {}
        preprocessing = ImagePreprocessing(
            image_size=vision.image_size,
            mean=tuple(pre.get('image_mean', (0.5, 0.5, 0.5))),
            std=tuple(pre.get('image_std', (0.5, 0.5, 0.5))),
        )
    image_token = config.get('image_token_index', config.get('image_token_id'))
    return CheckpointSpec(
        decoder=decoder,
        vision=vision,
        image_token_id=None if vision is None or image_token is None else int(image_token),
        preprocessing=preprocessing,
        action_tokens=ActionTokenizerConfig(**tokens),
        action_horizon=int(vla.get('action_horizon', 1)),
        action_statistics=load_action_statistics(dict(statistics)),
        prompt=PromptTemplate.from_mapping(vla.get('prompt', {})),
        unnorm_key=vla.get('unnorm_key'),
        proprio_statistics=_proprio_statistics(statistics),
    )
