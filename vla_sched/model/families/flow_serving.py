"""What the flow-matching families (pi0, SmolVLA) serve alike: a checkpoint whose steps are
flow-matching requests, translated by the family's step translator and turned into robot
actions by its processor, with no one-step baseline (``ServedModel``'s common part).
A family's served model adds its ``build_runner``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from vla_sched.model.families.protocol import FamilyError, ServingRules, StepShape

if TYPE_CHECKING:
    import torch

    from vla_sched.core.scheduling.request import Req
    from vla_sched.model.families.protocol import OneStepBaseline, StepFields, TranslatedStep


class FlowServedModel:
    """A flow-matching checkpoint as the engine serves it, but for its runner.

    Args:
        folder: the checkpoint folder (its name is the model name).
        spec: the folder's spec.
        processor: its pre- and post-processing (``instruction_tokens``,
            ``unnormalize_actions``).
        translator: its step translator (``translate``).
        shape: what a step takes and returns.
        rules: how the scheduler treats its requests.
        label: the family's name in refusals.
    """

    family = ''

    def __init__(
        self,
        folder: Path,
        spec: Any,
        processor: Any,
        translator: Any,
        *,
        shape: StepShape,
        rules: ServingRules,
        label: str,
    ) -> None:
        self.folder = folder
        self.spec = spec
        self.processor = processor
        self.model_name = folder.name
        self.translator = translator
        self.shape = shape
        self.rules = rules
        self.label = label

    def translate(self, step: StepFields) -> TranslatedStep:
        return self.translator.translate(step)

    def instruction_tokens(self, text: str) -> int:
        return self.processor.instruction_tokens(text)

    def actions_of(self, req: Req) -> np.ndarray:
        """The request's normalized chunk, un-normalized by the postprocessor's statistics."""
        actions = self.processor.unnormalize_actions(req.action_chunk)
        return actions.numpy().astype(np.float32)

    def one_step_baseline(self, *, device: torch.device, dtype: torch.dtype) -> OneStepBaseline:
        raise FamilyError(
            f'engine.core sequential does not serve {self.label}: use engine.core scheduled'
        )
