"""The SmolVLA family: LeRobot's SmolVLA folders (``config.json`` ``type`` smolvla).

A step is a flow-matching request (``steps.py``): the prefix (every camera's SmolVLM tokens,
the prompt, the state token) in one pass into the paged KV, then ``num_steps`` denoising
passes of the action expert, batched across robots as decode rows are (``runner.py``), the
chunk from the last one, un-normalized by the postprocessor's statistics (``processor.py``).
Nothing is shared between steps: the prefix starts with the images.

Settings read: ``smolvla_vlm_path`` (the folder holding the VLM's ``config.json`` and tokenizer
files; empty: the Hugging Face cache of the config's ``vlm_model_name``) and ``seed`` (the
noise's seed, with the robot and its step number) and ``rtc_*`` (real-time chunking's
guidance of a step that carries its robot's previous chunk, as pi0's).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from vla_sched.model.config.checkpoint_spec import CheckpointError
from vla_sched.model.families.flow_serving import FlowServedModel
from vla_sched.model.families.pi0.family import PROMPT_LAYOUT_FLOW
from vla_sched.model.families.protocol import (
    FamilyError,
    FamilyOptions,
    ServingRules,
    StepShape,
)
from vla_sched.model.families.smolvla.checkpoint import (
    CONFIG_FILE,
    DEFAULT_VLM_NAME,
    POLICY_TYPE,
    SmolVLASpec,
)
from vla_sched.model.runner.flow_guidance import RtcSettings

if TYPE_CHECKING:
    import torch

    from vla_sched.core.forward_batch import BatchRunner
    from vla_sched.model.families.smolvla.processor import SmolVLAProcessor

FAMILY_NAME = 'smolvla'
SMOLVLA_SETTING_DEFAULTS: Mapping[str, Any] = MappingProxyType({'smolvla_vlm_path': ''})


def step_shape(spec: SmolVLASpec) -> StepShape:
    """Every camera of the config, the state, ``n_action_steps`` actions of ``action_dim``."""
    return StepShape(
        num_images=len(spec.camera_keys),
        num_state=spec.state_dim,
        action_horizon=spec.n_action_steps,
        action_dim=spec.action_dim,
        image_size=spec.image_size,
        prompt_layout=PROMPT_LAYOUT_FLOW,
    )


def serving_rules(spec: SmolVLASpec) -> ServingRules:
    """A step's prefix runs whole, then one marker per pass: its tokens besides the text are
    every camera's tokens, the state token and the markers."""
    images = len(spec.camera_keys) * spec.num_image_tokens
    return ServingRules(
        prefill_only=False,
        min_steps_per_pass=1,
        num_non_text_tokens=images + 1 + spec.num_inference_steps + 1,
    )


def _vlm_name(folder: Path) -> str:
    try:
        config = json.loads((folder / CONFIG_FILE).read_text())
    except (OSError, ValueError):
        return DEFAULT_VLM_NAME
    return str(config.get('vlm_model_name') or DEFAULT_VLM_NAME)


def _vlm_folder(folder: Path, options: FamilyOptions) -> Path:
    from vla_sched.model.families.smolvla.processor import vlm_folder

    path = options.setting('smolvla_vlm_path', '')
    named = Path(path).expanduser() if path else None
    return vlm_folder(named, repo=_vlm_name(folder))


class SmolVLAServedModel(FlowServedModel):
    """One SmolVLA checkpoint as the engine serves it (``ServedModel``)."""

    family = FAMILY_NAME

    def __init__(
        self,
        folder: Path,
        spec: SmolVLASpec,
        processor: SmolVLAProcessor,
        seed: int,
        rtc: RtcSettings | None = None,
    ) -> None:
        from vla_sched.model.families.smolvla.steps import SmolVLAStepTranslator

        translator = SmolVLAStepTranslator(
            spec, processor, model_name=folder.name, seed=seed, rtc=rtc
        )
        super().__init__(
            folder,
            spec,
            processor,
            translator,
            shape=step_shape(spec),
            rules=serving_rules(spec),
            label='SmolVLA',
        )

    def build_runner(
        self,
        *,
        req_to_token: torch.Tensor,
        num_kv_slots: int,
        device: torch.device,
        dtype: torch.dtype,
        cuda_graphs: bool,
    ) -> BatchRunner:
        """The ``SmolVLARunner`` on the folder's model (its prefix and denoising passes
        replayed as CUDA graphs with ``cuda_graphs`` on a GPU)."""
        from vla_sched.model.families.smolvla.passes import smolvla_pass_sizes
        from vla_sched.model.families.smolvla.runner import SmolVLARunner
        from vla_sched.model.families.smolvla.weights import load_smolvla_model

        model = load_smolvla_model(self.folder, self.spec, device=device, dtype=dtype)
        graphs = cuda_graphs and device.type == 'cuda'
        return SmolVLARunner(
            model,
            req_to_token=req_to_token,
            num_kv_slots=num_kv_slots,
            num_steps=self.spec.num_inference_steps,
            chunk_size=self.spec.chunk_size,
            pixels_of=self.processor.pixels,
            cuda_graphs=graphs,
            pass_sizes=smolvla_pass_sizes(self.spec) if graphs else None,
        )


class SmolVLAFamily:
    """Finds and opens LeRobot SmolVLA folders (``ModelFamily``)."""

    name = FAMILY_NAME
    owned_settings = SMOLVLA_SETTING_DEFAULTS
    has_one_step_baseline = False

    def claims(self, folder: Path) -> bool:
        try:
            config = json.loads((folder / CONFIG_FILE).read_text())
        except (OSError, ValueError):
            return False
        return isinstance(config, Mapping) and config.get('type') == POLICY_TYPE

    def describe(self, folder: Path) -> str:
        return f'config.json type {POLICY_TYPE!r} (LeRobot)'

    def check_settings(self, settings: Mapping[str, Any]) -> None:
        path = settings.get('smolvla_vlm_path', '')
        if not isinstance(path, str):
            raise FamilyError(f'engine.smolvla_vlm_path must be a path, got {path!r}')

    def check_folder(
        self, folder: Path, options: FamilyOptions
    ) -> tuple[tuple[str, ...], str | None]:
        """The VLM files' presence and the folder's spec read with the VLM's config."""
        from vla_sched.model.families.smolvla.checkpoint import read_smolvla_spec

        try:
            read_smolvla_spec(folder, vlm_folder=_vlm_folder(folder, options))
        except (CheckpointError, ValueError) as exc:
            raise FamilyError(str(exc)) from None
        return (), None

    def open(self, folder: Path, options: FamilyOptions) -> SmolVLAServedModel:
        from vla_sched.model.families.smolvla.checkpoint import read_smolvla_spec
        from vla_sched.model.families.smolvla.processor import (
            SmolVLAProcessor,
            load_vlm_tokenizer,
        )

        try:
            vlm = _vlm_folder(folder, options)
            spec = read_smolvla_spec(folder, vlm_folder=vlm)
            tokenizer = load_vlm_tokenizer(vlm)
        except CheckpointError as exc:
            raise FamilyError(str(exc)) from None
        seed = int(options.setting('seed', 0))
        rtc = RtcSettings.from_settings(options.settings)
        return SmolVLAServedModel(folder, spec, SmolVLAProcessor(spec, tokenizer), seed, rtc)


FAMILY = SmolVLAFamily()
