"""The flow-matching family: LeRobot's pi0 and pi0.5 folders (``config.json`` ``type`` pi0 or
pi05).

A step is a flow-matching request (``steps.py``): the prefix (every camera's SigLIP patches,
then the prompt) in one pass attending both ways into the paged KV, then
``num_inference_steps`` denoising passes of the action expert, batched across robots as
decode rows are (``runner.py``), the chunk from the last one, un-normalized by the
postprocessor's statistics (``processor.py``). Nothing is shared between steps: the prefix
starts with the images.

Settings read: ``pi0_tokenizer_path`` (the folder holding PaliGemma's tokenizer files; empty:
the Hugging Face cache of ``google/paligemma-3b-pt-224``) and ``seed`` (the noise's seed,
with the robot and its step number).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from vla_sched.model.config.checkpoint_spec import CheckpointError
from vla_sched.model.families.flow_serving import FlowServedModel
from vla_sched.model.families.pi0.checkpoint import CONFIG_FILE, POLICY_TYPES, Pi0Spec
from vla_sched.model.families.protocol import (
    FamilyError,
    FamilyOptions,
    ServingRules,
    StepShape,
)
from vla_sched.model.runner.flow_guidance import RtcSettings

if TYPE_CHECKING:
    import torch

    from vla_sched.core.forward_batch import BatchRunner
    from vla_sched.model.families.pi0.processor import Pi0Processor

FAMILY_NAME = 'pi0'
PROMPT_LAYOUT_FLOW = 'images first, one bidirectional prefix per step: steps share nothing'
PI0_SETTING_DEFAULTS: Mapping[str, Any] = MappingProxyType({'pi0_tokenizer_path': ''})


def tokenizer_folder(options: FamilyOptions) -> Path | None:
    """The folder ``pi0_tokenizer_path`` names, or None for the Hugging Face cache."""
    path = options.setting('pi0_tokenizer_path', '')
    return Path(path).expanduser() if path else None


def step_shape(spec: Pi0Spec) -> StepShape:
    """Every camera of the config, the state, ``n_action_steps`` actions of ``action_dim``."""
    return StepShape(
        num_images=len(spec.camera_keys),
        num_state=spec.state_dim,
        action_horizon=spec.n_action_steps,
        action_dim=spec.action_dim,
        image_size=spec.image_size,
        prompt_layout=PROMPT_LAYOUT_FLOW,
    )


def serving_rules(spec: Pi0Spec) -> ServingRules:
    """A step's prefix runs whole (a pass holds at least one of the longest), then one
    marker per pass: its tokens besides the text are every camera's patches and the
    markers."""
    images = len(spec.camera_keys) * spec.num_image_tokens
    return ServingRules(
        prefill_only=False,
        min_steps_per_pass=1,
        num_non_text_tokens=images + spec.num_inference_steps + 1,
    )


class FlowMatchingModel(FlowServedModel):
    """One pi0 / pi0.5 checkpoint as the engine serves it (``ServedModel``)."""

    family = FAMILY_NAME

    def __init__(
        self,
        folder: Path,
        spec: Pi0Spec,
        processor: Pi0Processor,
        seed: int,
        rtc: RtcSettings | None = None,
    ) -> None:
        from vla_sched.model.families.pi0.steps import Pi0StepTranslator

        translator = Pi0StepTranslator(spec, processor, model_name=folder.name, seed=seed, rtc=rtc)
        super().__init__(
            folder,
            spec,
            processor,
            translator,
            shape=step_shape(spec),
            rules=serving_rules(spec),
            label='pi0 / pi0.5',
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
        """The ``FlowMatchingRunner`` on the folder's model (its prefix, denoising and tower
        passes replayed as CUDA graphs with ``cuda_graphs`` on a GPU)."""
        from vla_sched.model.families.pi0.passes import Pi0PassSizes
        from vla_sched.model.families.pi0.runner import FlowMatchingRunner
        from vla_sched.model.families.pi0.weights import load_pi0_model

        model = load_pi0_model(self.folder, self.spec, device=device, dtype=dtype)
        graphs = cuda_graphs and device.type == 'cuda'
        return FlowMatchingRunner(
            model,
            req_to_token=req_to_token,
            num_kv_slots=num_kv_slots,
            num_steps=self.spec.num_inference_steps,
            chunk_size=self.spec.chunk_size,
            pixels_of=self.processor.pixels,
            cuda_graphs=graphs,
            pass_sizes=Pi0PassSizes.for_spec(self.spec) if graphs else None,
        )


class Pi0Family:
    """Finds and opens LeRobot pi0 / pi0.5 folders (``ModelFamily``)."""

    name = FAMILY_NAME
    owned_settings = PI0_SETTING_DEFAULTS
    has_one_step_baseline = False

    def claims(self, folder: Path) -> bool:
        try:
            config = json.loads((folder / CONFIG_FILE).read_text())
        except (OSError, ValueError):
            return False
        return isinstance(config, Mapping) and config.get('type') in POLICY_TYPES

    def describe(self, folder: Path) -> str:
        return f'config.json type in {list(POLICY_TYPES)} (LeRobot)'

    def check_settings(self, settings: Mapping[str, Any]) -> None:
        path = settings.get('pi0_tokenizer_path', '')
        if not isinstance(path, str):
            raise FamilyError(f'engine.pi0_tokenizer_path must be a path, got {path!r}')

    def check_folder(
        self, folder: Path, options: FamilyOptions
    ) -> tuple[tuple[str, ...], str | None]:
        """The folder's spec and the tokenizer's presence (its files, not loaded)."""
        from vla_sched.model.families.pi0.checkpoint import read_pi0_spec
        from vla_sched.model.families.pi0.processor import (
            _cached_tokenizer_folder,
            download_command,
            hub_cache_dir,
        )

        try:
            read_pi0_spec(folder)
        except (CheckpointError, ValueError) as exc:
            raise FamilyError(str(exc)) from None
        named = tokenizer_folder(options)
        where = named if named is not None else _cached_tokenizer_folder(hub_cache_dir())
        if where is None or not (where / 'tokenizer.json').is_file():
            place = f'in {named}' if named is not None else 'in the Hugging Face cache'
            raise FamilyError(
                f'no PaliGemma tokenizer {place}: download it (the repo is gated: accept its '
                f'license first) with: {download_command(named)} and set '
                'engine.pi0_tokenizer_path to that folder'
            )
        return (), None

    def open(self, folder: Path, options: FamilyOptions) -> FlowMatchingModel:
        from vla_sched.model.families.pi0.checkpoint import read_pi0_spec
        from vla_sched.model.families.pi0.processor import Pi0Processor, load_paligemma_tokenizer

        try:
            spec = read_pi0_spec(folder)
            tokenizer = load_paligemma_tokenizer(tokenizer_folder(options))
        except CheckpointError as exc:
            raise FamilyError(str(exc)) from None
        seed = int(options.setting('seed', 0))
        rtc = RtcSettings.from_settings(options.settings)
        return FlowMatchingModel(folder, spec, Pi0Processor(spec, tokenizer), seed, rtc)


FAMILY = Pi0Family()
