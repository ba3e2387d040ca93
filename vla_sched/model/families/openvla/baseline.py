"""An OpenVLA or LLaVA-layout checkpoint run one step at a time through transformers'
``generate``: how single-robot VLA servers run, the engine's comparison point.

OpenVLA folders (transformers has no class for them) run as ``predict_action`` does:
``LlamaForCausalLM.generate`` over the projected image and the prompt (``HFOpenVLAPolicy``);
LLaVA-layout folders through ``LlavaForConditionalGeneration.generate``. Decoding is greedy
over the same token range the scheduled engine samples from, and each token's logits are
stamped so the caller can time prefill and every decode step.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from vla_sched.model.config.openvla_towers import OpenVLAVisionSpec
from vla_sched.model.families.openvla.action_tokenizer import ActionChunkDecoder
from vla_sched.model.families.protocol import BaselineStep
from vla_sched.model.layers.image_crop import center_crop_image

if TYPE_CHECKING:
    from vla_sched.model.config.checkpoint_spec import CheckpointSpec
    from vla_sched.model.families.openvla.prompt import VLAPromptBuilder
    from vla_sched.model.families.protocol import StepFields


class _TokenRangeStamps:
    """A logits processor that masks tokens outside ``[start, end)`` and stamps each decode
    step."""

    def __init__(self, start: int, end: int) -> None:
        self.start, self.end = start, end
        self.stamps: list[float] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        self.stamps.append(time.perf_counter())
        masked = torch.full_like(scores, float('-inf'))
        masked[:, self.start : self.end] = scores[:, self.start : self.end]
        return masked


class GenerateBaseline:
    """One checkpoint on transformers' ``generate`` (see the module docstring).

    Args:
        folder: the checkpoint folder.
        spec: its spec, with the engine's ``unnorm_key`` applied.
        prompts: its prompt builder.
        whole_vocab: decode over the whole vocabulary (OpenVLA's way) instead of the action
            token range.
        device, dtype: where and in which dtype the weights live.
    """

    def __init__(
        self,
        folder: Path,
        spec: CheckpointSpec,
        prompts: VLAPromptBuilder,
        *,
        whole_vocab: bool,
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        self.spec = spec
        self.prompts = prompts
        self.whole_vocab = whole_vocab
        self.device, self.dtype = device, dtype
        self.decoder = ActionChunkDecoder.for_checkpoint(spec)
        self.openvla = None
        self.llava = None
        if isinstance(spec.vision, OpenVLAVisionSpec):
            from vla_sched.model.families.openvla.hf_openvla import HFOpenVLAPolicy

            self.openvla = HFOpenVLAPolicy(folder, device=device, dtype=dtype, spec=spec)
        else:
            import transformers

            model = transformers.LlavaForConditionalGeneration.from_pretrained(folder, dtype=dtype)
            self.llava = model.to(device).eval()

    @torch.inference_mode()
    def run(self, step: StepFields, *, center_crop: bool) -> BaselineStep:
        """The action chunk of ``step`` (its primary camera, cropped when asked)."""
        state = step.state if self.spec.prompt.state_tokens else None
        layout = self.prompts.build(step.instruction, state=state)
        stamps = _TokenRangeStamps(*self.spec.sampled_token_range(whole_vocab=self.whole_vocab))
        image = step.images[0]  # the primary camera: the model takes one image
        if center_crop:
            image = center_crop_image(image)
        if self.openvla is not None:
            tokens = self.openvla.action_token_ids(
                image, step.instruction, logits_processor=[stamps]
            )
        else:
            tokens = self._llava_tokens(image, layout.token_ids, stamps)
        actions = self.decoder.decode(tokens, clip_to_bins=self.whole_vocab)
        return BaselineStep(
            actions=actions.astype(np.float32),
            num_prompt_tokens=len(layout.token_ids),
            token_times_s=tuple(stamps.stamps),
        )

    def _llava_tokens(
        self, image: np.ndarray, token_ids: tuple[int, ...], stamps: _TokenRangeStamps
    ) -> list[int]:
        from vla_sched.model.layers.vision import preprocess_image

        input_ids = torch.tensor([token_ids], device=self.device)
        pixels = preprocess_image(image, self.spec.preprocessing, device=self.device)
        out = self.llava.generate(
            input_ids=input_ids,
            attention_mask=torch.ones_like(input_ids),
            pixel_values=pixels[None].to(self.dtype),
            max_new_tokens=self.spec.num_action_tokens,
            min_new_tokens=self.spec.num_action_tokens,
            do_sample=False,
            logits_processor=[stamps],
            pad_token_id=0,
        )
        return out[0, input_ids.shape[1] :].tolist()
