"""What the engine needs to know about a VLA checkpoint, read without building the model.

A checkpoint folder holds ``config.json``, safetensors weights, ``tokenizer.json`` and action
statistics (``dataset_statistics.json``, or ``norm_stats`` inside ``config.json`` as OpenVLA
ships them). Two layouts are read:

- LLaVA (``model_type: "llava"``: ``text_config``, ``vision_config``, ``image_token_index``),
  optionally with ``preprocessor_config.json`` (image mean/std) and ``vla_config.json`` (this
  package's settings: action token range, horizon, prompt template). Everything missing from
  ``vla_config.json`` falls back to OpenVLA's conventions.
- OpenVLA (``model_type: "openvla"``, e.g. openvla/openvla-7b and its fine-tunes): everything
  comes from ``config.json`` as OpenVLA saves it. Its ``text_config`` is a diff against
  transformers' ``LlamaConfig`` defaults, so that branch imports transformers to fill in the
  rest; ``vla_config.json`` may only choose the ``unnorm_key``.

Only JSON is read here (no torch; transformers only for an OpenVLA ``text_config``), so the
engine can ask for the image token count, the action token range, the horizon and the dof
cheaply.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vla_sched.model.config.action_space import (
    ActionStatistics,
    ActionTokenizerConfig,
    select_statistics,
)
from vla_sched.model.config.architecture import DecoderSpec, VisionSpec
from vla_sched.model.config.openvla_towers import OpenVLAVisionSpec

CONFIG_FILE = 'config.json'
VLA_CONFIG_FILE = 'vla_config.json'
PREPROCESSOR_FILE = 'preprocessor_config.json'
TOKENIZER_FILE = 'tokenizer.json'
OPENVLA_MODEL_TYPE = 'openvla'
SUPPORTED_MODEL_TYPES = ('llava', OPENVLA_MODEL_TYPE, 'llama', 'qwen2')
# How a step's action token ids are chosen: only inside the action token range, or greedily
# over the whole vocabulary and then clipped into the bins (OpenVLA's predict_action).
ACTION_DECODINGS = ('action_range', 'whole_vocab')


class CheckpointError(ValueError):
    """A checkpoint folder is incomplete or inconsistent."""


@dataclass(frozen=True, slots=True)
class ImagePreprocessing:
    """How a uint8 RGB frame becomes the towers' ``pixel_values``.

    The frame is resized once to ``image_size`` and normalized once per group of three
    channels: ``mean`` and ``std`` hold 3 * k values (k = 1 for one tower; 2 for OpenVLA's
    fused backbone: DINOv2's ImageNet statistics, then SigLIP's), giving ``3 * k`` channels.
    """

    image_size: int
    mean: tuple[float, ...] = (0.5, 0.5, 0.5)
    std: tuple[float, ...] = (0.5, 0.5, 0.5)

    def __post_init__(self) -> None:
        if self.image_size < 1:
            raise ValueError(f'image_size must be >= 1, got {self.image_size}')
        if (
            not self.mean
            or len(self.mean) % 3
            or len(self.std) != len(self.mean)
            or min(self.std) <= 0
        ):
            raise ValueError(
                f'need 3 * k means and as many positive stds, got {self.mean}, {self.std}'
            )

    @property
    def num_channels(self) -> int:
        """Channels of the normalized pixels: three per mean/std group."""
        return len(self.mean)


@dataclass(frozen=True, slots=True)
class PromptTemplate:
    """Layout of a control step's prompt.

    Default order: ``[bos] + prefix(instruction) + [image tokens] + [state tokens] + suffix``;
    the part before the image is the robot's session prefix, shared across its steps.
    ``image_first`` puts the image right after BOS as OpenVLA does (then nothing but BOS is
    shared across frames). Each text part is tokenized on its own, so a template whose text
    must be tokenized in one piece (OpenVLA's) keeps it all in ``prefix`` with an empty
    ``suffix``. ``append_token_id``, when set, is appended after the whole prompt unless the
    prompt already ends with it (OpenVLA's ``predict_action`` appends 29871, the bare ``▁``).
    """

    prefix: str = 'In: What action should the robot take to {instruction}?\n'
    suffix: str = 'Out:'
    image_first: bool = False
    add_bos: bool = True
    lowercase_instruction: bool = True
    state_tokens: bool = False
    append_token_id: int | None = None

    def __post_init__(self) -> None:
        if '{instruction}' not in self.prefix:
            raise ValueError('the prompt prefix must contain "{instruction}"')
        if self.append_token_id is not None and (
            isinstance(self.append_token_id, bool)
            or not isinstance(self.append_token_id, int)
            or self.append_token_id < 0
        ):
            raise ValueError(
                f'append_token_id must be a token id >= 0, got {self.append_token_id!r}'
            )

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> PromptTemplate:
        known = {f for f in cls.__dataclass_fields__}
        unknown = sorted(set(data) - known)
        if unknown:
            raise CheckpointError(f'{VLA_CONFIG_FILE}: unknown prompt fields {unknown}')
        return cls(**dict(data))


@dataclass(frozen=True, slots=True, eq=False)
class CheckpointSpec:
    """Everything about a VLA checkpoint that the engine and the runner agree on.

    ``default_action_decoding`` is how the checkpoint's own code picks action ids:
    ``action_range`` (only action tokens) or ``whole_vocab`` (OpenVLA's: greedy over the
    whole vocabulary, then clipped into the bins); the engine's ``auto`` follows it.
    """

    decoder: DecoderSpec
    vision: VisionSpec | OpenVLAVisionSpec | None
    image_token_id: int | None
    preprocessing: ImagePreprocessing | None
    action_tokens: ActionTokenizerConfig
    action_horizon: int
    action_statistics: Mapping[str, ActionStatistics]
    prompt: PromptTemplate = field(default_factory=PromptTemplate)
    unnorm_key: str | None = None
    proprio_statistics: Mapping[str, ActionStatistics] = field(default_factory=dict)
    default_action_decoding: str = 'action_range'

    def __post_init__(self) -> None:
        if self.default_action_decoding not in ACTION_DECODINGS:
            raise ValueError(
                f'default_action_decoding must be one of {ACTION_DECODINGS}, got '
                f'{self.default_action_decoding!r}'
            )
        if self.action_horizon < 1:
            raise ValueError(f'action_horizon must be >= 1, got {self.action_horizon}')
        if self.action_tokens.token_end > self.decoder.vocab_size:
            raise CheckpointError(
                f'action tokens end at {self.action_tokens.token_end} but the model vocabulary '
                f'has {self.decoder.vocab_size} entries'
            )
        if self.vision is not None and self.image_token_id is None:
            raise CheckpointError('a model with a vision tower needs an image token id')
        if self.image_token_id is not None and not (
            0 <= self.image_token_id < self.decoder.vocab_size
        ):
            raise CheckpointError(f'image token id {self.image_token_id} is outside the vocab')
        appended = self.prompt.append_token_id
        if appended is not None and appended >= self.decoder.vocab_size:
            raise CheckpointError(f'prompt append_token_id {appended} is outside the vocab')
        if self.unnorm_key is not None:
            select_statistics(self.action_statistics, self.unnorm_key)

    def with_unnorm_key(self, unnorm_key: str) -> CheckpointSpec:
        """The same spec un-normalizing with another dataset's statistics.

        Checkpoints with several datasets' statistics (OpenVLA's base model) need one
        chosen before ``action_dim`` and ``ActionChunkDecoder.for_checkpoint`` can answer.
        """
        select_statistics(self.action_statistics, unnorm_key)
        return dataclasses.replace(self, unnorm_key=unnorm_key)

    @property
    def num_image_tokens(self) -> int:
        """Placeholder tokens one image takes (0 without a vision tower)."""
        return 0 if self.vision is None else self.vision.num_image_tokens

    @property
    def action_token_range(self) -> tuple[int, int]:
        """``[start, end)`` of the action token ids."""
        return self.action_tokens.token_start, self.action_tokens.token_end

    def sampled_token_range(self, *, whole_vocab: bool) -> tuple[int, int]:
        """``[start, end)`` of the ids a step may decode: the action tokens, or (OpenVLA's
        decoding, clipped into the bins afterwards) the whole model vocabulary."""
        return (0, self.decoder.vocab_size) if whole_vocab else self.action_token_range

    @property
    def action_dim(self) -> int:
        """Degrees of freedom D of one action (from the selected statistics)."""
        return select_statistics(self.action_statistics, self.unnorm_key).action_dim

    @property
    def num_action_tokens(self) -> int:
        """Tokens one control step decodes: horizon H times dof D."""
        return self.action_horizon * self.action_dim


def read_json(path: Path) -> dict[str, Any]:
    """Read a JSON object from a checkpoint file with a clear error."""
    if not path.is_file():
        raise CheckpointError(f'missing {path.name} in {path.parent}')
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise CheckpointError(f'{path.name} is not valid JSON: {exc}') from None
    if not isinstance(data, dict):
        raise CheckpointError(f'{path.name} must hold a JSON object')
    return data


def base_vocab_size(tokenizer_path: Path) -> int:
    """Size of a ``tokenizer.json`` model vocabulary without added tokens (OpenVLA's end)."""
    data = read_json(tokenizer_path)
    vocab = data.get('model', {}).get('vocab')
    if not isinstance(vocab, (dict, list)) or not vocab:
        raise CheckpointError(f'{tokenizer_path.name} has no model vocabulary')
    if isinstance(vocab, list):  # Unigram models keep a list of [piece, score]
        return len(vocab)
    return max(vocab.values()) + 1
