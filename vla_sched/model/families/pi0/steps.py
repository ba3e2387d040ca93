"""Translates a robot's step into a flow-matching ``Req`` for a pi0 / pi0.5 checkpoint.

API::

    translator = Pi0StepTranslator(spec, processor, model_name=..., seed=...)
    step = translator.translate(request)  # -> TranslatedStep, session_prefix None
    scheduler.add_request(step.req)

The request's prompt is ``[camera 0 patches | camera 1 patches | ... | language]``: one
placeholder id per image token (each camera an ``ImageInput`` at its offset, keyed by the
``image_content_hash`` of its frame, in the config's camera order), then the processor's
prompt ids (pi0: the instruction and a newline; pi0.5: the instruction and the discretized
state). The state, normalized and padded, is the request's ``proprio`` for pi0 (its state
token); pi0.5 reads it from the prompt only. The request denoises in
``num_inference_steps`` passes (``max_new_tokens`` one more: the prefix pass's marker) from
noise drawn for it (``step_noise``), guided towards the robot's previous chunk when the step
carries it (real-time chunking: ``RtcSettings.guidance``), and belongs to no session: its
prefix attends both ways from the first image token on, so nothing of it can be shared. It
checks nothing: a step reaches it after the engine's step checks.
"""

from __future__ import annotations

import zlib
from typing import TYPE_CHECKING

import numpy as np

from vla_sched.core.forward_batch import FlowGuidance, ImageInput, SamplingParams
from vla_sched.core.scheduling.request import Req
from vla_sched.model.families.images import image_content_hash
from vla_sched.model.families.protocol import TranslatedStep
from vla_sched.model.runner.flow_guidance import RtcSettings, guidance_towards

if TYPE_CHECKING:
    from vla_sched.model.families.pi0.checkpoint import Pi0Spec
    from vla_sched.model.families.pi0.processor import Pi0Processor
    from vla_sched.model.families.protocol import StepFields

IMAGE_PLACEHOLDER_ID = 0  # the ids under an image span are never embedded
MARKERS = SamplingParams(allowed_token_start=0, allowed_token_end=1)


def step_noise(spec: Pi0Spec, *, seed: int, robot_id: str, step_seq: int) -> np.ndarray:
    """The initial noise of a robot's step: standard normal float32 ``[chunk_size,
    max_action_dim]`` from a generator seeded by ``(seed, crc32(robot_id), step_seq)``, so a
    run with the same ``engine.seed`` draws the same noise for the same robot steps."""
    robot = zlib.crc32(robot_id.encode())
    rng = np.random.default_rng([seed, robot, step_seq])
    return rng.standard_normal((spec.chunk_size, spec.max_action_dim)).astype(np.float32)


class Pi0StepTranslator:
    """Builds each step's flow-matching ``Req`` (see the module docstring).

    Args:
        spec: the folder's spec.
        processor: its pre- and post-processing.
        model_name: the radix-cache namespace of every request (the folder's name).
        seed: ``engine.seed``, the noise's seed.
    """

    def __init__(
        self,
        spec: Pi0Spec,
        processor: Pi0Processor,
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
        proprio = None
        if spec.policy_type == 'pi0':
            proprio = self.processor.normalize_state(request.state).numpy()
        req = Req(
            rid=f'{request.robot_id}/{request.step_seq}',
            origin_input_ids=placeholders + prompt,
            sampling=MARKERS,
            max_new_tokens=spec.num_inference_steps + 1,
            images=images,
            robot_id=request.robot_id,
            step_seq=request.step_seq,
            deadline_ns=request.deadline_ns,
            stamp_ns=request.stamp_ns,
            extra_key=self.model_name,
            proprio=proprio,
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
