"""Translates a robot's step into a flow-matching ``Req`` for a SmolVLA checkpoint.

The request's prompt is ``[camera 0 tokens | camera 1 tokens | ... | language | state]``: one
placeholder id per image token (each camera an ``ImageInput`` at its offset, keyed by the
``image_content_hash`` of its frame, in the config's camera order), the processor's prompt
ids (the instruction and a newline), then one placeholder the runner replaces by the state
token; the normalized, padded state is the request's ``proprio``. The request denoises in
``num_steps`` passes (``max_new_tokens`` one more: the prefix pass's marker) from noise drawn
for it (pi0's ``step_noise``), guided towards the robot's previous chunk when the step carries
it (real-time chunking, as pi0's: ``RtcSettings.guidance`` over the previous actions
normalized as the model made them), and belongs to no session: its prefix starts with the
images.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vla_sched.core.forward_batch import FlowGuidance, ImageInput
from vla_sched.core.scheduling.request import Req
from vla_sched.model.families.images import image_content_hash
from vla_sched.model.families.pi0.steps import IMAGE_PLACEHOLDER_ID, MARKERS, step_noise
from vla_sched.model.families.protocol import TranslatedStep
from vla_sched.model.runner.flow_guidance import RtcSettings, guidance_towards

if TYPE_CHECKING:
    from vla_sched.model.families.protocol import StepFields
    from vla_sched.model.families.smolvla.checkpoint import SmolVLASpec
    from vla_sched.model.families.smolvla.processor import SmolVLAProcessor

STATE_PLACEHOLDER_ID = 0  # the prompt's last id: the state token replaces its embedding


class SmolVLAStepTranslator:
    """Builds each step's flow-matching ``Req`` (see the module docstring).

    Args:
        spec: the folder's spec.
        processor: its pre- and post-processing.
        model_name: the radix-cache namespace of every request (the folder's name).
        seed: ``engine.seed``, the noise's seed.
        rtc: real-time chunking's settings (``engine.rtc_*``; None: their defaults).
    """

    def __init__(
        self,
        spec: SmolVLASpec,
        processor: SmolVLAProcessor,
        *,
        model_name: str,
        seed: int,
        rtc: RtcSettings | None = None,
    ) -> None:
        self.spec = spec
        self.processor = processor
        self.model_name = model_name
        self.seed = seed
        self.rtc = rtc or RtcSettings()

    def _guidance(self, request: StepFields) -> FlowGuidance | None:
        """Real-time chunking's guidance when the step carries its robot's previous chunk
        (``guidance_towards``)."""
        spec = self.spec
        return guidance_towards(
            request.previous_actions,
            normalize=self.processor.normalize_actions,
            action_dim=spec.action_dim,
            shape=(spec.chunk_size, spec.max_action_dim),
            delay=request.inference_delay,
            settings=self.rtc,
        )

    def translate(self, request: StepFields) -> TranslatedStep:
        spec = self.spec
        per_image = spec.num_image_tokens
        images = tuple(
            ImageInput(
                content_hash=image_content_hash(pixels),
                token_offset=camera * per_image,
                num_tokens=per_image,
                pixels=pixels,
            )
            for camera, pixels in enumerate(request.images)
        )
        prompt = self.processor.prompt_ids(request.instruction, request.state)
        placeholders = (IMAGE_PLACEHOLDER_ID,) * (per_image * len(images))
        req = Req(
            rid=f'{request.robot_id}/{request.step_seq}',
            origin_input_ids=placeholders + prompt + (STATE_PLACEHOLDER_ID,),
            sampling=MARKERS,
            max_new_tokens=spec.num_inference_steps + 1,
            images=images,
            robot_id=request.robot_id,
            step_seq=request.step_seq,
            deadline_ns=request.deadline_ns,
            stamp_ns=request.stamp_ns,
            extra_key=self.model_name,
            proprio=self.processor.normalize_state(request.state).numpy(),
            denoise_steps=spec.num_inference_steps,
            guidance=self._guidance(request),
            noise=step_noise(
                spec, seed=self.seed, robot_id=request.robot_id, step_seq=request.step_seq
            ),
        )
        req.times.received_ns = request.received_ns
        return TranslatedStep(
            req=req, session_prefix=None, instruction_version=request.instruction_version
        )
