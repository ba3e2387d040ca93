"""The decoded-action-token family: OpenVLA folders and this package's LLaVA-layout ones.

A step is the robot's prompt (``prompt.py``) prefilled into the paged KV, then H*D action
tokens decoded one per pass by the ``ModelRunner``; the tokens become actions through the
checkpoint's bins and statistics (``action_tokenizer.py``). The part of the prompt before the
image is the robot's session prefix, kept in the radix cache between steps.

Settings read: ``unnorm_key`` (the dataset whose statistics un-normalize the actions) and
``action_decoding`` (``auto``: the checkpoint's own way; ``whole_vocab``: greedy over the
whole vocabulary then clipped into the bins, as OpenVLA does; ``action_range``: greedy
over the action tokens only).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import numpy as np

from vla_sched.model.config.action_space import ActionStatisticsError
from vla_sched.model.config.architecture import UnsupportedArchitectureError
from vla_sched.model.config.checkpoint_spec import (
    CONFIG_FILE,
    SUPPORTED_MODEL_TYPES,
    CheckpointError,
    CheckpointSpec,
)
from vla_sched.model.families.protocol import (
    FamilyError,
    FamilyOptions,
    ServingRules,
    StepShape,
)

if TYPE_CHECKING:
    import torch

    from vla_sched.core.forward_batch import BatchRunner
    from vla_sched.core.scheduling.request import Req
    from vla_sched.model.families.openvla.baseline import GenerateBaseline
    from vla_sched.model.families.openvla.steps import StepTranslator
    from vla_sched.model.families.protocol import StepFields, TranslatedStep

FAMILY_NAME = 'openvla'
PROMPT_LAYOUT_IMAGE_FIRST = 'image first: frames share only BOS'
PROMPT_LAYOUT_INSTRUCTION_FIRST = 'instruction first: steps share the instruction prefix'


def read_spec(folder: Path, options: FamilyOptions) -> CheckpointSpec:
    """The folder's spec with the engine's ``unnorm_key`` applied (when set)."""
    from vla_sched.model.config.formats import read_checkpoint_spec

    spec = read_checkpoint_spec(folder)
    key = options.setting('unnorm_key', '')
    return spec.with_unnorm_key(key) if key else spec


def decodes_whole_vocab(options: FamilyOptions, spec: CheckpointSpec) -> bool:
    """Whether steps pick action ids over the whole vocabulary (then clipped into the bins,
    OpenVLA's way) rather than only inside the action token range."""
    choice = options.setting('action_decoding', 'auto')
    if choice == 'auto':
        choice = spec.default_action_decoding
    return choice == 'whole_vocab'


def num_state_values(spec: CheckpointSpec) -> int:
    """Length of the state vector the checkpoint's prompt takes (0: no state tokens)."""
    if not spec.prompt.state_tokens:
        return 0
    return next(iter(spec.proprio_statistics.values())).action_dim


def step_shape(spec: CheckpointSpec) -> StepShape:
    """What a step of ``spec``'s checkpoint takes (one camera, the state when the prompt
    has state tokens) and returns (its action horizon and dof)."""
    return StepShape(
        num_images=1,
        num_state=num_state_values(spec),
        action_horizon=spec.action_horizon,
        action_dim=spec.action_dim,
        image_size=spec.preprocessing.image_size if spec.preprocessing else 0,
        prompt_layout=(
            PROMPT_LAYOUT_IMAGE_FIRST if spec.prompt.image_first
            else PROMPT_LAYOUT_INSTRUCTION_FIRST
        ),
    )  # fmt: skip


def serving_rules(spec: CheckpointSpec) -> ServingRules:
    """A step prefills its prompt, then decodes its action tokens, in a session."""
    return ServingRules(
        prefill_only=False,
        min_steps_per_pass=0,
        num_non_text_tokens=spec.num_image_tokens + spec.num_action_tokens,
    )


class TokenActionModel:
    """One decoded-token checkpoint as the engine serves it (``ServedModel``).

    Args:
        folder: the checkpoint folder (its name is the model name).
        spec: its spec under the engine's settings.
        options: the engine's settings.
    """

    family = FAMILY_NAME

    def __init__(self, folder: Path, spec: CheckpointSpec, options: FamilyOptions) -> None:
        from vla_sched.model.families.openvla.action_tokenizer import ActionChunkDecoder
        from vla_sched.model.families.openvla.prompt import VLAPromptBuilder
        from vla_sched.model.families.openvla.steps import StepTranslator

        self.folder = folder
        self.spec = spec
        self.model_name = folder.name
        self.whole_vocab = decodes_whole_vocab(options, spec)
        self.prompts = VLAPromptBuilder.from_checkpoint(folder, spec)
        self.translator: StepTranslator = StepTranslator(
            spec,
            self.prompts,
            model_name=self.model_name,
            whole_vocab=self.whole_vocab,
            center_crop_robots=options.center_crop_robots,
        )
        self.decoder = ActionChunkDecoder.for_checkpoint(spec)
        self.shape = step_shape(spec)
        self.rules = serving_rules(spec)

    def translate(self, step: StepFields) -> TranslatedStep:
        return self.translator.translate(step)

    def instruction_tokens(self, text: str) -> int:
        return self.prompts.instruction_tokens(text)

    def actions_of(self, req: Req) -> np.ndarray:
        actions = self.decoder.decode(req.output_ids, clip_to_bins=self.whole_vocab)
        return actions.astype(np.float32)

    def build_runner(
        self,
        *,
        req_to_token: torch.Tensor,
        num_kv_slots: int,
        device: torch.device,
        dtype: torch.dtype,
        cuda_graphs: bool,
    ) -> BatchRunner:
        """The ``ModelRunner`` on the checkpoint's ``VLAModel`` (decode, prefill and vision
        replayed as CUDA graphs when ``cuda_graphs`` on a GPU)."""
        from vla_sched.model.loading.checkpoint import load_checkpoint
        from vla_sched.model.runner.model_runner import ModelRunner, RunnerConfig

        model = load_checkpoint(self.folder, device=device, dtype=dtype, spec=self.spec)
        return ModelRunner(
            model,
            req_to_token=req_to_token,
            num_kv_slots=num_kv_slots,
            config=RunnerConfig(cuda_graphs=cuda_graphs and device.type == 'cuda'),
        )

    def one_step_baseline(self, *, device: torch.device, dtype: torch.dtype) -> GenerateBaseline:
        from vla_sched.model.families.openvla.baseline import GenerateBaseline

        return GenerateBaseline(
            self.folder,
            self.spec,
            self.prompts,
            whole_vocab=self.whole_vocab,
            device=device,
            dtype=dtype,
        )


class OpenVLAFamily:
    """Finds and opens decoded-token checkpoints (``ModelFamily``)."""

    name = FAMILY_NAME
    owned_settings: Mapping[str, Any] = MappingProxyType({})
    has_one_step_baseline = True

    def claims(self, folder: Path) -> bool:
        return _model_type(folder) in SUPPORTED_MODEL_TYPES

    def describe(self, folder: Path) -> str:
        return f'config.json model_type in {list(SUPPORTED_MODEL_TYPES)}'

    def check_settings(self, settings: Mapping[str, Any]) -> None:
        return None  # unnorm_key and action_decoding are checked where they are defined

    def check_folder(
        self, folder: Path, options: FamilyOptions
    ) -> tuple[tuple[str, ...], str | None]:
        from vla_sched.model.config.formats import read_dataset_choice

        try:
            return read_dataset_choice(folder)
        except (CheckpointError, UnsupportedArchitectureError, ActionStatisticsError) as exc:
            raise FamilyError(str(exc)) from None

    def open(self, folder: Path, options: FamilyOptions) -> TokenActionModel:
        return TokenActionModel(folder, read_spec(folder, options), options)


def _model_type(folder: Path) -> object:
    try:
        config = json.loads((folder / CONFIG_FILE).read_text())
    except (OSError, ValueError):
        return None
    return config.get('model_type') if isinstance(config, Mapping) else None


FAMILY = OpenVLAFamily()
