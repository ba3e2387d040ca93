"""Translates a robot's step into a prefill-only ``Req`` for an OpenVLA-OFT checkpoint.

API::

    translator = OFTStepTranslator(spec, prompts, model_name=..., center_crop_robots=...)
    step = translator.translate(request)  # -> TranslatedStep, session_prefix None
    scheduler.add_request(step.req)

``translate`` builds the whole OFT sequence for the robot's instruction
(``OFTPromptBuilder``: images, proprio token, prompt, action slots, stop token), one
``ImageInput`` per camera (primary first) at the layout's offsets, each center-cropped when
the settings' ``center_crop`` or the robot's ``center_crop`` asks and keyed by the
``image_content_hash`` of what the model sees, and the state as ``proprio`` when the
settings use it. The ``Req`` is prefill-only (one whole pass, no token decoded, its action
chunk in ``req.action_chunk``) and has no session: an OFT step's KV depends on its images
and state from the second position on, so nothing of it can be shared. Id, deadline, stamp,
radix namespace and ``times.received_ns`` as the decoded-token family fills them. It
checks nothing: a step reaches it after the engine's step checks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from vla_sched.core.forward_batch import ImageInput, SamplingParams
from vla_sched.core.scheduling.request import Req
from vla_sched.model.families.images import image_content_hash
from vla_sched.model.families.protocol import TranslatedStep
from vla_sched.model.layers.image_crop import center_crop_image

if TYPE_CHECKING:
    from vla_sched.model.families.openvla_oft.checkpoint import OFTCheckpointSpec
    from vla_sched.model.families.openvla_oft.prompt import OFTPromptBuilder
    from vla_sched.model.families.protocol import StepFields

# A prefill-only request samples nothing; its sampling range is never read.
NO_SAMPLING = SamplingParams(allowed_token_start=0, allowed_token_end=1)


class OFTStepTranslator:
    """Builds each OFT step's prefill-only ``Req``.

    Args:
        spec: the OFT checkpoint's spec (its settings: cameras, proprio, center crop).
        prompts: the checkpoint's OFT sequence builder.
        model_name: the radix-cache namespace of every request (the checkpoint's name).
        center_crop_robots: robots whose images are center-cropped although the settings
            do not crop (``center_crop_image``).
    """

    def __init__(
        self,
        spec: OFTCheckpointSpec,
        prompts: OFTPromptBuilder,
        *,
        model_name: str,
        center_crop_robots: frozenset[str] = frozenset(),
    ) -> None:
        self.spec = spec
        self.prompts = prompts
        self.model_name = model_name
        self.center_crop_robots = center_crop_robots

    def crops(self, robot_id: str) -> bool:
        """Whether ``robot_id``'s images are center-cropped before the model sees them."""
        return self.spec.settings.center_crop or robot_id in self.center_crop_robots

    def translate(self, request: StepFields) -> TranslatedStep:
        """The scheduler's prefill-only request for ``request`` (no session prefix)."""
        prompt = self.prompts.build(request.instruction)
        layout = prompt.layout
        crop = self.crops(request.robot_id)
        images = []
        for index, pixels in enumerate(request.images):
            if crop:
                pixels = center_crop_image(pixels)
            images.append(
                ImageInput(
                    content_hash=image_content_hash(pixels),
                    token_offset=layout.image_offset(index),
                    num_tokens=layout.num_image_tokens,
                    pixels=pixels,
                )
            )
        proprio = None
        if self.spec.settings.use_proprio:
            proprio = np.asarray(request.state, dtype=np.float32)
        req = Req(
            rid=f'{request.robot_id}/{request.step_seq}',
            origin_input_ids=prompt.token_ids,
            sampling=NO_SAMPLING,
            max_new_tokens=0,
            images=tuple(images),
            robot_id=request.robot_id,
            step_seq=request.step_seq,
            deadline_ns=request.deadline_ns,
            stamp_ns=request.stamp_ns,
            extra_key=self.model_name,
            prefill_only=True,
            proprio=proprio,
        )
        req.times.received_ns = request.received_ns
        return TranslatedStep(
            req=req, session_prefix=None, instruction_version=request.instruction_version
        )
