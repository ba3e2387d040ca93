"""Translates a robot's ``StepRequest`` into the scheduler's ``Req``: the one place a step
becomes a request (the scheduled core and the benchmarks use it).

API::

    translator = StepTranslator(
        spec, prompts, model_name=..., whole_vocab=..., center_crop_robots=frozenset(...)
    )
    translator = StepTranslator.from_checkpoint(folder, engine_config)  # the core's way
    step = translator.translate(request)  # -> TranslatedStep
    scheduler.open_or_update_session(
        request.robot_id, step.session_prefix, instruction_version=step.instruction_version
    )
    scheduler.add_request(step.req)

OpenVLA-OFT checkpoints have their own translator (``oft_step_translator.py``: one
prefill-only request per step, no session).

``translate`` builds the prompt from the checkpoint's template (the state goes in only
when the template has state tokens), center-crops the frame of a robot that asks for it
(OpenVLA's LIBERO crop), keys the image placeholder span by the ``image_content_hash`` of the
frame the model sees, limits decoding to the sampled token range (the action tokens, or
the whole vocabulary), and fills the ``Req``: id ``'<robot_id>/<step_seq>'``, H*D new
tokens, the robot as its session, the deadline and stamp, the model name as the radix
namespace, and ``times.received_ns``. It checks nothing: a step reaches it after
``step_checks``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from vla_sched.core.forward_batch import ImageInput, SamplingParams
from vla_sched.core.memory.radix_key import RadixKey
from vla_sched.core.scheduling.request import Req
from vla_sched.model.layers.image_crop import center_crop_image

if TYPE_CHECKING:
    from pathlib import Path

    from vla_sched.engine.config import EngineConfig
    from vla_sched.ipc.messages import StepRequest
    from vla_sched.model.config.checkpoint_spec import CheckpointSpec
    from vla_sched.model.prompting.prompt import VLAPromptBuilder


def image_content_hash(image: np.ndarray) -> int:
    """A 63-bit hash of an image's shape and pixels (equal frames, equal hashes)."""
    digest = hashlib.blake2b(digest_size=8)
    digest.update(repr((image.dtype.str, image.shape)).encode())
    digest.update(np.ascontiguousarray(image).data)
    return int.from_bytes(digest.digest(), 'little') >> 1


@dataclass(frozen=True, slots=True)
class TranslatedStep:
    """A step as the scheduler takes it.

    Attributes:
        req: the request to ``add_request`` (its session is the robot's).
        session_prefix: the prompt tokens before the image (the part that depends only on
            the instruction), in the request's radix namespace: the robot's session prefix;
            None for a step that continues no session (OpenVLA-OFT's, which share nothing).
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


class StepTranslator:
    """Builds each step's ``Req`` from one checkpoint's spec and prompt template.

    Args:
        spec: the checkpoint's spec (action tokens, state tokens, sampled token range).
        prompts: the checkpoint's prompt builder.
        model_name: the radix-cache namespace of every request (the checkpoint's name).
        whole_vocab: decode over the whole vocabulary (OpenVLA's way) instead of only the
            action token range.
        center_crop_robots: the robots whose frames are center-cropped before the model
            sees them (``center_crop_image``).
    """

    def __init__(
        self,
        spec: CheckpointSpec,
        prompts: VLAPromptBuilder,
        *,
        model_name: str,
        whole_vocab: bool,
        center_crop_robots: frozenset[str] = frozenset(),
    ) -> None:
        self.spec = spec
        self.prompts = prompts
        self.model_name = model_name
        self.whole_vocab = whole_vocab
        self.center_crop_robots = center_crop_robots
        start, end = spec.sampled_token_range(whole_vocab=whole_vocab)
        self.sampling = SamplingParams(allowed_token_start=start, allowed_token_end=end)

    @classmethod
    def from_checkpoint(
        cls, folder: Path, config: EngineConfig, *, spec: CheckpointSpec | None = None
    ) -> StepTranslator:
        """The translator of the checkpoint in ``folder`` under the engine's settings
        (``unnorm_key``, ``action_decoding``, the robots' ``center_crop``); the folder's
        name is the model name. ``spec``: the folder's spec as the engine already read it
        (``read_configured_spec``)."""
        from vla_sched.engine.checkpoints import decodes_whole_vocab, read_configured_spec
        from vla_sched.model.prompting.prompt import VLAPromptBuilder

        if spec is None:
            spec = read_configured_spec(folder, config)
        return cls(
            spec,
            VLAPromptBuilder.from_checkpoint(folder, spec),
            model_name=folder.name,
            whole_vocab=decodes_whole_vocab(config, spec),
            center_crop_robots=frozenset(r for r in config.robots if config.robot_center_crop(r)),
        )

    def translate(self, request: StepRequest) -> TranslatedStep:
        """The scheduler's request for ``request`` and the session prefix it extends."""
        state = request.state if self.spec.prompt.state_tokens else None
        layout = self.prompts.build(request.instruction, state=state)
        images: tuple[ImageInput, ...] = ()
        if layout.num_image_tokens:
            pixels = request.images[0]  # the primary camera: the model takes one image
            if request.robot_id in self.center_crop_robots:
                pixels = center_crop_image(pixels)
            image = ImageInput(
                content_hash=image_content_hash(pixels),
                token_offset=layout.image_offset,
                num_tokens=layout.num_image_tokens,
                pixels=pixels,
            )
            images = (image,)
        req = Req(
            rid=f'{request.robot_id}/{request.step_seq}',
            origin_input_ids=layout.token_ids,
            sampling=self.sampling,
            max_new_tokens=self.spec.num_action_tokens,
            images=images,
            robot_id=request.robot_id,
            step_seq=request.step_seq,
            session_id=request.robot_id,
            deadline_ns=request.deadline_ns,
            stamp_ns=request.stamp_ns,
            extra_key=self.model_name,
        )
        req.times.received_ns = request.received_ns
        prefix_ids = layout.token_ids[: layout.session_prefix_len]
        return TranslatedStep(
            req=req,
            session_prefix=RadixKey(
                torch.tensor(prefix_ids, dtype=torch.int64), extra_key=self.model_name
            ),
            instruction_version=request.instruction_version,
        )
