"""OpenVLA's ``predict_action`` as a single-robot server runs it, from transformers parts.

OpenVLA's own Hugging Face class is remote code, so this assembles the same path from
building blocks: transformers' ``LlamaForCausalLM`` (``text_config`` completed with
``LlamaConfig``'s defaults, loaded from the folder's ``language_model.*`` tensors), the
OpenVLA vision encoder (transformers towers and the projector), the six- or three-channel
pixels of ``preprocess_image`` and the prompt of ``VLAPromptBuilder``. One step is:
``[BOS][projected patches][prompt text][29871]`` as ``inputs_embeds``, then ``generate``
greedily over the whole vocabulary for exactly the chunk's action tokens (an EOS does not
stop it, since ``predict_action`` needs them all), then the ids are clipped into the bins
and un-normalized. No batching and no KV kept between calls: the comparison point for the
scheduled engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path

import numpy as np
import torch

from vla_sched.model.config.checkpoint_spec import (
    CONFIG_FILE,
    CheckpointError,
    CheckpointSpec,
    read_json,
)
from vla_sched.model.config.formats import read_checkpoint_spec
from vla_sched.model.config.openvla import openvla_text_config
from vla_sched.model.config.openvla_towers import OpenVLAVisionSpec
from vla_sched.model.families.openvla.action_tokenizer import ActionChunkDecoder
from vla_sched.model.loading.checkpoint import weight_files
from vla_sched.model.loading.weights import OPENVLA_PROJECTOR_PREFIX, OPENVLA_TOWER_PREFIX

LANGUAGE_MODEL_PREFIX = 'language_model.'
LM_HEAD_NAME = 'lm_head.weight'
EMBED_NAME = 'model.embed_tokens.weight'


class HFOpenVLAPolicy:
    """An OpenVLA-format folder run one request at a time through ``generate``.

    Args:
        folder: The checkpoint folder (``model_type: "openvla"``).
        device: Where the weights live.
        dtype: Parameter dtype (weights are converted on load).
        unnorm_key: Dataset whose action statistics un-normalize the actions; may be None
            only for a folder with one dataset (or one that names its own).
        spec: The folder's spec if already read (its ``unnorm_key`` is kept unless
            ``unnorm_key`` is given).

    Raises:
        CheckpointError: for a folder that is not OpenVLA's, or missing or unexpected
            tensors, named.
        ActionStatisticsError: for several datasets and no ``unnorm_key``, or an unknown one.
    """

    def __init__(
        self,
        folder: str | Path,
        *,
        device: torch.device | str = 'cpu',
        dtype: torch.dtype = torch.float32,
        unnorm_key: str | None = None,
        spec: CheckpointSpec | None = None,
    ) -> None:
        from vla_sched.model.families.openvla.prompt import VLAPromptBuilder

        folder = Path(folder)
        spec = spec if spec is not None else read_checkpoint_spec(folder)
        if unnorm_key:
            spec = spec.with_unnorm_key(unnorm_key)
        if not isinstance(spec.vision, OpenVLAVisionSpec):
            raise CheckpointError(f'{folder} is not an OpenVLA-format checkpoint')
        self.spec = spec
        self.device, self.dtype = torch.device(device), dtype
        self.decoder = ActionChunkDecoder.for_checkpoint(spec)
        self.prompts = VLAPromptBuilder.from_checkpoint(folder, spec)
        self.llm, self.vision = _load_parts(folder, spec, self.device, dtype)

    @property
    def num_action_tokens(self) -> int:
        return self.spec.num_action_tokens

    @torch.inference_mode()
    def action_token_ids(
        self,
        image: np.ndarray,
        instruction: str,
        *,
        logits_processor: Sequence[object] = (),
    ) -> list[int]:
        """The chunk's action token ids: greedy over the whole vocabulary, unless a
        ``logits_processor`` (transformers' ``(input_ids, scores) -> scores``) masks some.

        Raises:
            ValueError: for an image that is not uint8 ``[H, W, 3]``.
        """
        from transformers import LogitsProcessorList

        from vla_sched.model.layers.vision import preprocess_image

        layout = self.prompts.build(instruction)
        ids = torch.tensor(layout.token_ids, device=self.device)
        embeds = self.llm.get_input_embeddings()(ids).clone()
        pixels = preprocess_image(image, self.spec.preprocessing, device=self.device)
        patches = self.vision(pixels[None])[0].to(embeds.dtype)
        embeds[layout.image_offset : layout.image_end] = patches
        count = self.num_action_tokens
        out = self.llm.generate(
            inputs_embeds=embeds[None],
            attention_mask=torch.ones(1, len(ids), dtype=torch.long, device=self.device),
            max_new_tokens=count,
            do_sample=False,
            logits_processor=LogitsProcessorList(list(logits_processor)),
        )
        if out.shape[1] < count:
            raise RuntimeError(f'generate returned {out.shape[1]} tokens, expected {count}')
        return [int(t) for t in out[0, -count:].tolist()]

    def predict(self, image: np.ndarray, instruction: str) -> np.ndarray:
        """Un-normalized actions ``[horizon, dof]`` (float64) for one frame, as OpenVLA's
        ``predict_action``: greedy ids over the whole vocabulary, clipped into the bins."""
        ids = self.action_token_ids(image, instruction)
        return self.decoder.decode(ids, clip_to_bins=True)


def _load_parts(
    folder: Path, spec: CheckpointSpec, device: torch.device, dtype: torch.dtype
) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The ``LlamaForCausalLM`` and the OpenVLA vision encoder of a folder."""
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM, LlamaConfig

    from vla_sched.model.loading.vla_model import assemble_openvla_vision

    files = weight_files(folder)
    vision_prefixes = (OPENVLA_PROJECTOR_PREFIX, OPENVLA_TOWER_PREFIX)
    language = [n for n in files if n.startswith(LANGUAGE_MODEL_PREFIX)]
    vision = [n for n in files if n.startswith(vision_prefixes)]
    others = sorted(set(files) - set(language) - set(vision))
    if others:
        raise CheckpointError(f'tensors outside the OpenVLA layout in {folder}: {others[:3]}')
    text_config = LlamaConfig(**openvla_text_config(read_json(folder / CONFIG_FILE)))
    with ExitStack() as stack:
        handles = {
            path: stack.enter_context(safe_open(str(path), framework='pt', device='cpu'))
            for path in sorted(set(files.values()))
        }

        def read(name: str) -> torch.Tensor:
            return handles[files[name]].get_tensor(name)

        def shape_of(name: str) -> tuple[int, ...]:
            return tuple(handles[files[name]].get_slice(name).get_shape())

        with device:
            llm = AutoModelForCausalLM.from_config(text_config, dtype=dtype)
        state = {
            name.removeprefix(LANGUAGE_MODEL_PREFIX): read(name).to(device=device, dtype=dtype)
            for name in language
        }
        if text_config.tie_word_embeddings and LM_HEAD_NAME not in state and EMBED_NAME in state:
            state[LM_HEAD_NAME] = state[EMBED_NAME]
        result = llm.load_state_dict(state, strict=False)
        if result.missing_keys or result.unexpected_keys:
            raise CheckpointError(
                f'language_model.* tensors do not match LlamaForCausalLM: missing '
                f'{sorted(result.missing_keys)[:3]}, unexpected '
                f'{sorted(result.unexpected_keys)[:3]}'
            )
        encoder = assemble_openvla_vision(
            spec.vision, vision, shape_of=shape_of, read=read, device=device, dtype=dtype
        )
    # The generation defaults come from LlamaConfig (EOS 2): a chunk needs all its tokens.
    llm.generation_config.eos_token_id = None
    llm.generation_config.pad_token_id = spec.image_token_id
    llm.eval().requires_grad_(False)
    encoder.eval().requires_grad_(False)
    return llm, encoder
