"""The one-parallel-pass family: OpenVLA-OFT folders (an OpenVLA folder plus the action head
and proprio projector files).

A step is one prefill-only request (``steps.py``): the whole OFT sequence (every camera, the
proprio token, the prompt, the action slots) in one bidirectional pass run by the
``ParallelActionRunner`` (``runner.py``), whose L1 head gives the chunk; nothing of a step
outlives its pass, so there is no session. What the files cannot say comes from the
engine's ``oft_*`` settings: ``oft_preset`` (libero, aloha, bridge) with the overrides
``oft_num_images``, ``oft_chunk_len``, ``oft_use_proprio`` and ``oft_center_crop``
(``oft_settings_of``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import numpy as np

from vla_sched.model.config.action_space import ActionStatisticsError
from vla_sched.model.config.architecture import UnsupportedArchitectureError
from vla_sched.model.config.checkpoint_spec import CheckpointError
from vla_sched.model.families.openvla_oft.checkpoint import (
    OFT_PRESETS,
    OFTCheckpointSpec,
    OFTSettings,
    oft_component_files,
    oft_preset,
    read_oft_spec,
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
    from vla_sched.model.families.protocol import OneStepBaseline, StepFields, TranslatedStep

FAMILY_NAME = 'openvla_oft'
PROMPT_LAYOUT_WHOLE_PASS = 'one bidirectional pass per step: steps share nothing'
# The engine settings this family owns, and their values when unset.
OFT_SETTING_DEFAULTS: Mapping[str, Any] = MappingProxyType(
    {
        'oft_preset': '',
        'oft_num_images': 0,
        'oft_chunk_len': 0,
        'oft_use_proprio': True,
        'oft_center_crop': True,
    }
)
# A pass holds at least this many of the longest steps a request row takes.
OFT_MIN_STEPS_PER_PASS = 4


def oft_settings_of(settings: Mapping[str, Any]) -> OFTSettings | None:
    """The ``OFTSettings`` of ``oft_preset`` with the ``oft_*`` overrides (None without a
    preset).

    Raises:
        FamilyError: naming the setting, for an override without a preset or a value the
            preset's settings refuse.
    """
    preset = settings.get('oft_preset', '')
    if not preset:
        changed = [
            f'engine.{name}'
            for name, default in OFT_SETTING_DEFAULTS.items()
            if settings.get(name, default) != default
        ]
        if changed:
            raise FamilyError(
                f'{", ".join(changed)} set without engine.oft_preset: choose the OpenVLA-OFT '
                f'preset ({", ".join(sorted(OFT_PRESETS))}) they override'
            )
        return None
    overrides: dict[str, Any] = {
        'use_proprio': settings.get('oft_use_proprio', True),
        'center_crop': settings.get('oft_center_crop', True),
    }
    if settings.get('oft_num_images', 0):
        overrides['num_images'] = settings['oft_num_images']
    if settings.get('oft_chunk_len', 0):
        overrides['chunk_len'] = settings['oft_chunk_len']
    try:
        return oft_preset(preset, **overrides)
    except ValueError as exc:
        raise FamilyError(f'engine.oft_preset {preset!r}: {exc}') from None


def read_spec(folder: Path, options: FamilyOptions) -> OFTCheckpointSpec:
    """The folder's spec under the engine's OFT settings and ``unnorm_key``.

    Raises:
        FamilyError: without ``engine.oft_preset`` (naming the component files found).
    """
    settings = oft_settings_of(options.settings)
    if settings is None:
        found = sorted(name for names in oft_component_files(folder).values() for name in names)
        raise FamilyError(
            f'engine.model_path {str(folder)!r} is an OpenVLA-OFT checkpoint (it holds '
            f'{", ".join(found)}): set engine.oft_preset (libero, aloha or bridge), which gives '
            'the chunk length, action and state sizes, normalization, cameras and center crop '
            '(engine.oft_* override some of them)'
        )
    spec = read_oft_spec(folder, settings)
    key = options.setting('unnorm_key', '')
    return spec.with_unnorm_key(key) if key else spec


def step_shape(spec: OFTCheckpointSpec) -> StepShape:
    """Every camera's image, the state when the settings use it, a chunk of ``chunk_len``
    actions."""
    settings = spec.settings
    preprocessing = spec.base.preprocessing
    return StepShape(
        num_images=settings.num_images,
        num_state=settings.proprio_dim if settings.use_proprio else 0,
        action_horizon=settings.chunk_len,
        action_dim=settings.action_dim,
        image_size=preprocessing.image_size if preprocessing else 0,
        prompt_layout=PROMPT_LAYOUT_WHOLE_PASS,
    )


def serving_rules(spec: OFTCheckpointSpec) -> ServingRules:
    """One prefill-only pass per step over every camera's image tokens, the proprio token,
    the action slots and the stop token; a pass holds ``OFT_MIN_STEPS_PER_PASS`` steps."""
    settings = spec.settings
    images = settings.num_images * spec.num_image_tokens
    return ServingRules(
        prefill_only=True,
        min_steps_per_pass=OFT_MIN_STEPS_PER_PASS,
        num_non_text_tokens=images + int(settings.use_proprio) + settings.num_action_tokens + 1,
    )


class ParallelPassModel:
    """One OpenVLA-OFT checkpoint as the engine serves it (``ServedModel``)."""

    family = FAMILY_NAME

    def __init__(self, folder: Path, spec: OFTCheckpointSpec, options: FamilyOptions) -> None:
        from vla_sched.model.families.openvla_oft.prompt import OFTPromptBuilder
        from vla_sched.model.families.openvla_oft.steps import OFTStepTranslator

        self.folder = folder
        self.spec = spec
        self.model_name = folder.name
        self.prompts = OFTPromptBuilder.from_checkpoint(folder, spec)
        self.translator = OFTStepTranslator(
            spec,
            self.prompts,
            model_name=self.model_name,
            center_crop_robots=options.center_crop_robots,
        )
        self.shape = step_shape(spec)
        self.rules = serving_rules(spec)

    def translate(self, step: StepFields) -> TranslatedStep:
        return self.translator.translate(step)

    def instruction_tokens(self, text: str) -> int:
        return self.prompts.instruction_tokens(text)

    def actions_of(self, req: Req) -> np.ndarray:
        return np.asarray(req.action_chunk, dtype=np.float32)

    def build_runner(
        self,
        *,
        req_to_token: torch.Tensor,
        num_kv_slots: int,
        device: torch.device,
        dtype: torch.dtype,
        cuda_graphs: bool,
    ) -> BatchRunner:
        """The ``ParallelActionRunner`` (its passes and the vision encoder replayed as CUDA
        graphs when ``cuda_graphs`` on a GPU)."""
        from vla_sched.model.families.openvla_oft.model import load_oft_checkpoint
        from vla_sched.model.families.openvla_oft.runner import ParallelActionRunner

        model = load_oft_checkpoint(self.folder, spec=self.spec, device=device, dtype=dtype)
        return ParallelActionRunner(
            model,
            req_to_token=req_to_token,
            num_kv_slots=num_kv_slots,
            cuda_graphs=cuda_graphs and device.type == 'cuda',
        )

    def one_step_baseline(self, *, device: torch.device, dtype: torch.dtype) -> OneStepBaseline:
        raise FamilyError(
            'engine.core sequential does not serve OpenVLA-OFT (engine.oft_preset): its steps '
            'run as one parallel pass, on engine.core scheduled'
        )


class OpenVLAOFTFamily:
    """Finds and opens OpenVLA-OFT checkpoints (``ModelFamily``)."""

    name = FAMILY_NAME
    owned_settings = OFT_SETTING_DEFAULTS
    has_one_step_baseline = False

    def claims(self, folder: Path) -> bool:
        return folder.is_dir() and bool(oft_component_files(folder))

    def describe(self, folder: Path) -> str:
        return 'action_head--*checkpoint.pt beside an OpenVLA config.json'

    def check_settings(self, settings: Mapping[str, Any]) -> None:
        oft_settings_of(settings)

    def check_folder(
        self, folder: Path, options: FamilyOptions
    ) -> tuple[tuple[str, ...], str | None]:
        from vla_sched.model.config.formats import read_dataset_choice

        unkeyed = FamilyOptions({**options.settings, 'unnorm_key': ''})
        try:
            read_spec(folder, unkeyed)
            return read_dataset_choice(folder)
        except (CheckpointError, UnsupportedArchitectureError, ActionStatisticsError) as exc:
            raise FamilyError(
                f'engine.model_path {str(folder)!r}: {exc} (OpenVLA-OFT settings: engine.oft_*)'
            ) from None

    def open(self, folder: Path, options: FamilyOptions) -> ParallelPassModel:
        return ParallelPassModel(folder, read_spec(folder, options), options)


FAMILY = OpenVLAOFTFamily()
