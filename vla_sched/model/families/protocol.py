"""What the engine asks of a model family, and what a family answers.

A family is one way of turning a robot's observation into an action chunk (decoded action
tokens, one parallel pass with an action head, flow matching with an action expert). Two
small protocols carry everything the engine needs, so the engine never asks which family
it serves:

- ``ModelFamily`` finds and opens folders: whether a folder is this family's (``claims``,
  from file names and JSON alone), whether the engine's settings suit it (``check_settings``,
  without I/O; ``check_folder``, JSON only, cheap enough for a node's start-up) and the
  ``ServedModel`` of a folder (``open``).
- ``ServedModel`` serves one checkpoint: a robot's step becomes a scheduler ``Req``
  (``translate``), an instruction's length in the model's tokens (``instruction_tokens``,
  which the engine bounds), a finished request becomes its action chunk (``actions_of``), the model
  runner the scheduler launches passes on (``build_runner``), what a step takes and returns
  (``shape``) and the scheduling rules the family's requests need (``rules``: data the
  scheduler honours, never a branch on the family's types).

The engine's settings reach a family as ``FamilyOptions`` (the ``engine.*`` settings by name
and the robots that ask for a center crop); a family reads the settings it owns and names
them in its refusals (``FamilyError``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import numpy as np
    import torch

    from vla_sched.core.forward_batch import BatchRunner
    from vla_sched.core.memory.radix_key import RadixKey
    from vla_sched.core.scheduling.request import Req


class FamilyError(ValueError):
    """A folder or a setting does not fit the family; the message names the setting or file."""


class StepFields(Protocol):
    """The fields of one robot's step a family reads (the engine's ``StepRequest`` has them).

    ``images`` holds one uint8 ``[H, W, 3]`` RGB image per camera, the primary first;
    ``state`` is float32 in the checkpoint's state order; ``previous_actions`` (robot units,
    aligned to this step's actions, 0 rows for none) and ``inference_delay`` are a
    real-time-chunking robot's, which the flow families use and the others ignore.
    """

    robot_id: str
    step_seq: int
    stamp_ns: int
    deadline_ns: int
    received_ns: int
    images: tuple[np.ndarray, ...]
    state: np.ndarray
    instruction: str
    instruction_version: int
    previous_actions: np.ndarray
    inference_delay: int


@dataclass(frozen=True, slots=True)
class TranslatedStep:
    """A step as the scheduler takes it.

    Attributes:
        req: the request to ``add_request`` (its session is the robot's, when it has one).
        session_prefix: the prompt tokens that depend only on the instruction, in the
            request's radix namespace: the robot's session prefix; None for a step that
            continues no session (its KV depends on the images from the start).
        instruction_version: the step's instruction version (a new one swaps the prefix).
    """

    req: Req
    session_prefix: RadixKey | None
    instruction_version: int

    @property
    def session_prefix_ids(self) -> tuple[int, ...]:
        if self.session_prefix is None:
            return ()
        return self.req.origin_input_ids[: len(self.session_prefix)]


@dataclass(frozen=True, slots=True)
class StepShape:
    """What one step of a checkpoint takes and returns, as the frontend must know it.

    Attributes:
        num_images: camera images per step, the primary first.
        num_state: state values per step (0: the model takes no state).
        action_horizon: actions per chunk.
        action_dim: values per action.
        image_size: the model's square input side in pixels (0: unknown).
        prompt_layout: how steps share the KV cache, in words.
    """

    num_images: int
    num_state: int
    action_horizon: int
    action_dim: int
    image_size: int
    prompt_layout: str


@dataclass(frozen=True, slots=True)
class ServingRules:
    """How the scheduler must treat a family's requests and size its memory.

    Attributes:
        prefill_only: each step is one pass over its whole sequence (SGLang's prefill-only
            request): never cut into chunks, nothing decoded, no KV kept after the pass.
        min_steps_per_pass: a prefill pass must hold at least this many of the longest
            steps a request row takes (0: the device's chunk size as it is).
        num_non_text_tokens: a step's tokens besides its instruction text and template
            (images, state, actions): with the longest instruction, a request row's size.
    """

    prefill_only: bool
    min_steps_per_pass: int
    num_non_text_tokens: int

    def __post_init__(self) -> None:
        if self.min_steps_per_pass < 0 or self.num_non_text_tokens < 0:
            raise ValueError(f'serving rules must not be negative: {self}')


@dataclass(frozen=True, slots=True)
class FamilyOptions:
    """The engine's settings as every family sees them.

    Attributes:
        settings: the engine's settings by name (``EngineConfig.to_mapping()``: ``unnorm_key``,
            ``action_decoding``, a family's own ``<family>_*`` settings, ...).
        center_crop_robots: the robots whose images are center-cropped before the model
            sees them.
    """

    settings: Mapping[str, Any]
    center_crop_robots: frozenset[str] = frozenset()

    def setting(self, name: str, default: Any = None) -> Any:
        return self.settings.get(name, default)


@dataclass(frozen=True, slots=True)
class BaselineStep:
    """One step run by a one-request-at-a-time baseline.

    Attributes:
        actions: float32 ``[horizon, dof]``, un-normalized.
        num_prompt_tokens: tokens of the prompt the baseline prefilled.
        token_times_s: ``perf_counter`` when each decoded token's logits were read.
    """

    actions: np.ndarray
    num_prompt_tokens: int
    token_times_s: tuple[float, ...]


class OneStepBaseline(Protocol):
    """A checkpoint served as single-robot servers serve it (transformers' ``generate``)."""

    def run(self, step: StepFields, *, center_crop: bool) -> BaselineStep: ...


class ServedModel(Protocol):
    """One checkpoint of a family, as the engine serves it (see the module docstring)."""

    family: str
    model_name: str
    shape: StepShape
    rules: ServingRules

    def translate(self, step: StepFields) -> TranslatedStep:
        """The scheduler's request for a well-formed ``step`` (checked before it comes)."""
        ...

    def instruction_tokens(self, text: str) -> int:
        """How many tokens ``text`` takes in a step's prompt as the model tokenizes it (the
        instruction alone, without the template or special tokens)."""
        ...

    def actions_of(self, req: Req) -> np.ndarray:
        """The un-normalized float32 ``[horizon, dof]`` chunk of a finished request."""
        ...

    def build_runner(
        self,
        *,
        req_to_token: torch.Tensor,
        num_kv_slots: int,
        device: torch.device,
        dtype: torch.dtype,
        cuda_graphs: bool,
    ) -> BatchRunner:
        """Load the weights and build the runner the scheduler launches passes on."""
        ...

    def one_step_baseline(self, *, device: torch.device, dtype: torch.dtype) -> OneStepBaseline:
        """The checkpoint on the one-request-at-a-time baseline.

        Raises:
            FamilyError: for a family with no such baseline.
        """
        ...


class ModelFamily(Protocol):
    """A family of checkpoints (see the module docstring).

    Attributes:
        name: the family's folder under ``vla_sched/model/families``.
        owned_settings: the engine settings only this family reads, each with its unset
            value (a folder of another family refuses them when set).
        has_one_step_baseline: whether ``engine.core sequential`` can serve its folders.
    """

    name: str
    owned_settings: Mapping[str, Any]
    has_one_step_baseline: bool

    def claims(self, folder: Path) -> bool:
        """Whether ``folder`` holds one of this family's checkpoints (file names and JSON)."""
        ...

    def describe(self, folder: Path) -> str:
        """What identifies a folder of this family, for refusals that list the families."""
        ...

    def check_settings(self, settings: Mapping[str, Any]) -> None:
        """Refuse the family's own settings that disagree, without I/O (``FamilyError``)."""
        ...

    def check_folder(
        self, folder: Path, options: FamilyOptions
    ) -> tuple[tuple[str, ...], str | None]:
        """Check cheaply (JSON only) that ``folder`` can be served under ``options``.

        Returns the dataset names its statistics hold and the ``unnorm_key`` the folder
        names for itself (or None); ``FamilyError`` names what disagrees."""
        ...

    def open(self, folder: Path, options: FamilyOptions) -> ServedModel:
        """The checkpoint in ``folder`` ready to serve (weights load in ``build_runner``)."""
        ...


def engine_setting_name(name: str) -> str:
    """A setting's parameter name as the node declares it."""
    return f'engine.{name}'
