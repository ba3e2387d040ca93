"""OpenVLA's ``config.json`` (``model_type: "openvla"``) read into a ``CheckpointSpec``.

``text_config`` is completed with transformers' ``LlamaConfig`` defaults (OpenVLA saves it as
a diff against them), the towers come from ``openvla_spec``, the action bins sit below
``vocab_size - pad_to_multiple_of``, and the prompt is OpenVLA's own (image right after BOS,
the text in one piece, token 29871 appended; the Vicuna form for v01 folders).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vla_sched.model.config.action_space import ActionTokenizerConfig, load_action_statistics
from vla_sched.model.config.architecture import DecoderSpec, UnsupportedArchitectureError
from vla_sched.model.config.checkpoint_spec import (
    CONFIG_FILE,
    VLA_CONFIG_FILE,
    CheckpointError,
    CheckpointSpec,
    ImagePreprocessing,
    PromptTemplate,
)
from vla_sched.model.config.openvla_towers import OpenVLAVisionSpec, openvla_vision_spec


def openvla_architecture(
    config: Mapping[str, Any],
) -> tuple[dict[str, Any], DecoderSpec, OpenVLAVisionSpec]:
    """The completed ``text_config``, the decoder and the vision spec of an OpenVLA config."""
    text = openvla_text_config(config)
    decoder = DecoderSpec.from_hf_config(
        text, tie_word_embeddings=bool(text.get('tie_word_embeddings', False))
    )
    return text, decoder, openvla_vision_spec(config, text_hidden_size=decoder.hidden_size)


def openvla_text_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """An OpenVLA ``text_config`` completed with transformers' ``LlamaConfig`` defaults.

    OpenVLA saves ``text_config`` as a diff against ``LlamaConfig`` (openvla-7b's holds only
    ``model_type``, ``pad_token_id`` and ``vocab_size``), so every other value (hidden size,
    depth, ``rms_norm_eps`` 1e-6, RoPE ...) is what transformers' ``LlamaConfig`` gives.

    Raises:
        UnsupportedArchitectureError: naming the ``text_config`` field that is wrong.
    """
    text = config.get('text_config')
    if not isinstance(text, Mapping):
        raise UnsupportedArchitectureError('OpenVLA config.json needs a text_config object')
    text_type = text.get('model_type', 'llama')
    if text_type != 'llama':
        raise UnsupportedArchitectureError(
            f'OpenVLA text_config.model_type {text_type!r} is not supported; use llama'
        )
    from transformers import LlamaConfig

    try:
        return LlamaConfig(**dict(text)).to_dict()
    except Exception as exc:  # transformers' config validators raise their own error types
        raise UnsupportedArchitectureError(f'OpenVLA text_config: {exc}') from None


# OpenVLAConfig's own defaults for two fields that config.json may leave out (transformers
# saves a config as a diff against its class defaults).
OPENVLA_DEFAULT_PAD_TO_MULTIPLE_OF = 64
OPENVLA_DEFAULT_ACTION_BINS = 256
# predict_action appends Llama 2's bare '▁' piece after the prompt, as in training.
OPENVLA_APPEND_TOKEN_ID = 29871
OPENVLA_V01_SYSTEM_PROMPT = (
    'A chat between a curious user and an artificial intelligence assistant. The assistant '
    "gives helpful, detailed, and polite answers to the user's questions."
)
# Image right after BOS; the whole text is tokenized in one piece with BOS, as OpenVLA's
# processor does, so it all sits in the prefix and the suffix is empty.
OPENVLA_PROMPT = PromptTemplate(
    prefix='In: What action should the robot take to {instruction}?\nOut:',
    suffix='',
    image_first=True,
    append_token_id=OPENVLA_APPEND_TOKEN_ID,
)
OPENVLA_V01_PROMPT = PromptTemplate(
    prefix=(
        f'{OPENVLA_V01_SYSTEM_PROMPT} USER: What action should the robot take to '
        '{instruction}? ASSISTANT:'
    ),
    suffix='',
    image_first=True,
    append_token_id=OPENVLA_APPEND_TOKEN_ID,
)
# The only vla_config.json key an OpenVLA folder may carry: everything else is OpenVLA's.
OPENVLA_VLA_CONFIG_KEYS = ('unnorm_key',)


def openvla_prompt_template(config: Mapping[str, Any]) -> PromptTemplate:
    """OpenVLA's prompt for this ``config.json``: the v01 chat form, or the 'In: ... Out:' one.

    OpenVLA's deploy script picks the v01 prompt by the folder's name; the folder itself tells
    v01 apart by its backbones: a Vicuna LLM (``llm_backbone_id`` 'vicuna-...') or the single
    SigLIP tower (``vision_backbone_id`` 'siglip-vit-so400m'). openvla-7b and its fine-tunes
    (Llama 2, fused DINOv2 + SigLIP) get the 'In: ... Out:' prompt.
    """
    llm = str(config.get('llm_backbone_id', ''))
    vision = str(config.get('vision_backbone_id', ''))
    v01 = llm.startswith('vicuna') or vision == 'siglip-vit-so400m'
    return OPENVLA_V01_PROMPT if v01 else OPENVLA_PROMPT


def _openvla_count(config: Mapping[str, Any], name: str, default: int) -> int:
    value = config.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise CheckpointError(f'config.json {name} must be a positive integer, got {value!r}')
    return value


def openvla_spec_from_dicts(
    config: Mapping[str, Any],
    statistics: Mapping[str, Any],
    *,
    vla: Mapping[str, Any] | None = None,
) -> CheckpointSpec:
    """The spec of an OpenVLA ``config.json`` (``model_type: "openvla"``).

    As OpenVLA's ``predict_action``: action tokens end at ``text_config.vocab_size -
    pad_to_multiple_of`` (32000 for openvla-7b) with ``n_action_bins`` bins, one action per
    step, the image right after BOS (its span marked with ``text_config.pad_token_id``, a
    placeholder never embedded), the towers' own pixel statistics, and greedy decoding over
    the whole vocabulary clipped into the bins.

    Args:
        config: The ``config.json`` mapping.
        statistics: ``norm_stats`` (or ``dataset_statistics.json``) per dataset.
        vla: ``vla_config.json``, if any: only ``unnorm_key`` may be set there.

    Raises:
        UnsupportedArchitectureError, CheckpointError, ActionStatisticsError: naming the field.
    """
    vla = dict(vla or {})
    unknown = sorted(set(vla) - set(OPENVLA_VLA_CONFIG_KEYS))
    if unknown:
        raise CheckpointError(
            f'{VLA_CONFIG_FILE}: an OpenVLA folder takes {unknown} from {CONFIG_FILE}; only '
            f'{list(OPENVLA_VLA_CONFIG_KEYS)} may be set here'
        )
    text, decoder, vision = openvla_architecture(config)
    pad_token_id = text.get('pad_token_id')
    if isinstance(pad_token_id, bool) or not isinstance(pad_token_id, int):
        raise CheckpointError(
            f'OpenVLA text_config.pad_token_id must be a token id (it marks the image span), '
            f'got {pad_token_id!r}'
        )
    pad_to = _openvla_count(config, 'pad_to_multiple_of', OPENVLA_DEFAULT_PAD_TO_MULTIPLE_OF)
    num_bins = _openvla_count(config, 'n_action_bins', OPENVLA_DEFAULT_ACTION_BINS)
    try:
        tokens = ActionTokenizerConfig(vocab_end=decoder.vocab_size - pad_to, num_bins=num_bins)
    except ValueError as exc:
        raise CheckpointError(
            f'config.json text_config.vocab_size {decoder.vocab_size}, pad_to_multiple_of '
            f'{pad_to} and n_action_bins {num_bins}: {exc}'
        ) from None
    return CheckpointSpec(
        decoder=decoder,
        vision=vision,
        image_token_id=pad_token_id,
        preprocessing=ImagePreprocessing(
            image_size=vision.image_size,
            mean=tuple(m for tower in vision.towers for m in tower.mean),
            std=tuple(s for tower in vision.towers for s in tower.std),
        ),
        action_tokens=tokens,
        action_horizon=1,
        action_statistics=load_action_statistics(dict(statistics)),
        prompt=openvla_prompt_template(config),
        unnorm_key=vla.get('unnorm_key'),
        default_action_decoding='whole_vocab',
    )
