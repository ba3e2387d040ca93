"""Translates a robot's step into the scheduler's ``Req`` for a checkpoint whose actions
are decoded tokens (OpenVLA, LLaVA layout).

API::

    translator = StepTranslator(
        spec, prompts, model_name=..., whole_vocab=..., center_crop_robots=frozenset(...)
    )
    step = translator.translate(request)  # -> TranslatedStep
    scheduler.open_or_update_session(
        request.robot_id, step.session_prefix, instruction_version=step.instruction_version
    )
    scheduler.add_request(step.req)

``translate`` builds the prompt from the checkpoint's template (the state goes in only
when the template has state tokens), center-crops the frame of a robot that asks for it
(OpenVLA's LIBERO crop), keys the image placeholder span by the ``image_content_hash`` of the
frame the model sees, limits decoding to the sampled token range (the action tokens, or
the whole vocabulary), and fills the ``Req``: id ``'<robot_id>/<step_seq>'``, H*D new
tokens, the robot as its session, the deadline and stamp, the model name as the radix
namespace, and ``times.received_ns``. It checks nothing: a step reaches it after the
engine's step checks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from vla_sched.core.forward_batch import ImageInput, SamplingParams
from vla_sched.core.memory.radix_key import RadixKey
from vla_sched.core.scheduling.request import Req
from vla_sched.model.families.images import image_content_hash
from vla_sched.model.families.protocol import TranslatedStep
from vla_sched.model.layers.image_crop import center_crop_image

if TYPE_CHECKING:
    from vla_sched.model.config.checkpoint_spec import CheckpointSpec
    from vla_sched.model.families.openvla.prompt import VLAPromptBuilder
    from vla_sched.model.families.protocol import StepFields


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

    def translate(self, request: StepFields) -> TranslatedStep:
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
