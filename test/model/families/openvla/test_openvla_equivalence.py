"""Our paged OpenVLA forward against an independent reference on tiny OpenVLA-format folders.

The reference is assembled from the same building blocks as OpenVLA, not from our model
code: transformers' ``LlamaForCausalLM`` built from ``text_config`` merged onto
``LlamaConfig``'s defaults and loaded with the ``language_model.*`` tensors; the towers and
projector from the plain-torch timm reference (``timm_vit_reference``); six-channel pixels
normalized here; OpenVLA's sequence ``[BOS][256 projected patches][prompt text][29871]`` as
``inputs_embeds`` with positions 0..L-1; greedy decoding of 7 tokens over the whole
vocabulary; token ids -> actions with OpenVLA's formula, written out below.

Frames are 224 x 224 (the towers' size), so no resize enters either side.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from model_testing import PagedSlots, Step, make_batch, random_image
from timm_vit_reference import reference_image_embeddings

from vla_sched.core.forward_batch import ImageInput, SamplingParams
from vla_sched.model.config.openvla_towers import openvla_vision_spec
from vla_sched.model.families.openvla.action_tokenizer import ActionChunkDecoder
from vla_sched.model.families.openvla.prompt import VLAPromptBuilder
from vla_sched.model.loading.checkpoint import load_checkpoint
from vla_sched.model.runner.model_runner import ModelRunner, RunnerConfig
from vla_sched.testing.openvla_writer import write_openvla_checkpoint

pytestmark = pytest.mark.slow  # seconds or more: not in the fast tier

RELATIVE_TOLERANCE = 1e-4
IMAGE_SIZE = 224
NUM_ACTION_TOKENS = 7
SPACE_TOKEN_ID = 29871  # the bare '▁' piece predict_action appends
IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
HALF = ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))
PROMPTS = {
    'fused': 'In: What action should the robot take to {}?\nOut:',
    'v01': (
        'A chat between a curious user and an artificial intelligence assistant. The '
        "assistant gives helpful, detailed, and polite answers to the user's questions. "
        'USER: What action should the robot take to {}? ASSISTANT:'
    ),
}


class OpenVLAReference:
    """OpenVLA's forward and ``predict_action`` on a folder, from independent parts."""

    def __init__(self, folder: Path, variant: str) -> None:
        from safetensors.torch import load_file
        from tokenizers import Tokenizer
        from transformers import LlamaConfig, LlamaForCausalLM

        self.variant = variant
        self.config = json.loads((folder / 'config.json').read_text())
        self.tensors: dict[str, torch.Tensor] = {}
        for path in sorted(folder.glob('*.safetensors')):
            self.tensors.update(load_file(str(path)))
        text_config = LlamaConfig(**self.config['text_config'])
        self.llm = LlamaForCausalLM(text_config).float().eval()
        prefix = 'language_model.'
        llm_tensors = {
            k.removeprefix(prefix): v for k, v in self.tensors.items() if k.startswith(prefix)
        }
        self.llm.load_state_dict(llm_tensors, strict=True)
        self.towers = openvla_vision_spec(
            self.config, text_hidden_size=text_config.hidden_size
        ).towers
        self.tokenizer = Tokenizer.from_file(str(folder / 'tokenizer.json'))
        text = self.config['text_config']
        self.vocab_end = text['vocab_size'] - self.config['pad_to_multiple_of']
        self.num_bins = self.config['n_action_bins']

    def pixel_values(self, image: np.ndarray) -> torch.Tensor:
        """``[1, 3 * towers, 224, 224]``: DINOv2's ImageNet stats, then SigLIP's 0.5."""
        stats = [IMAGENET, HALF] if self.variant == 'fused' else [HALF]
        x = torch.from_numpy(image).permute(2, 0, 1).double() / 255.0
        groups = [
            (x - torch.tensor(m).view(3, 1, 1)) / torch.tensor(s).view(3, 1, 1) for m, s in stats
        ]
        return torch.cat(groups).float()[None]

    def prompt_ids(self, instruction: str) -> list[int]:
        """BOS + the prompt tokenized in one piece, then 29871 unless already last."""
        ids = self.tokenizer.encode(PROMPTS[self.variant].format(instruction.lower())).ids
        return ids if ids[-1] == SPACE_TOKEN_ID else [*ids, SPACE_TOKEN_ID]

    @torch.no_grad()
    def logits(self, token_ids: list[int], image: np.ndarray) -> torch.Tensor:
        """``[L, V]`` logits of ``[BOS][image][rest of token_ids]``, positions 0..L-1."""
        embed = self.llm.get_input_embeddings()(torch.tensor(token_ids))
        patches = reference_image_embeddings(self.tensors, self.towers, self.pixel_values(image))
        sequence = torch.cat([embed[:1], patches[0], embed[1:]])[None]
        positions = torch.arange(sequence.shape[1])[None]
        return self.llm(inputs_embeds=sequence, position_ids=positions).logits[0].float()

    def generate(self, instruction: str, image: np.ndarray) -> list[int]:
        """Greedy ids over the whole vocabulary, as ``generate`` in ``predict_action``."""
        ids = self.prompt_ids(instruction)
        generated = []
        for _ in range(NUM_ACTION_TOKENS):
            generated.append(int(self.logits([*ids, *generated], image)[-1].argmax()))
        return generated

    def actions(self, token_ids: list[int], unnorm_key: str = 'bridge_orig') -> np.ndarray:
        """OpenVLA's ids -> un-normalized actions (clip into the bins, then q01/q99)."""
        bins = np.linspace(-1.0, 1.0, self.num_bins)
        centers = (bins[:-1] + bins[1:]) / 2.0
        index = np.clip(self.vocab_end - np.asarray(token_ids) - 1, 0, centers.shape[0] - 1)
        normalized = centers[index]
        stats = self.config['norm_stats'][unnorm_key]['action']
        mask = np.asarray(stats['mask'], dtype=bool)
        high, low = np.asarray(stats['q99']), np.asarray(stats['q01'])
        return np.where(mask, 0.5 * (normalized + 1) * (high - low) + low, normalized)


class OpenVLASetup:
    """One folder loaded twice: by our loader (model, prompt builder) and by the reference."""

    def __init__(self, folder: Path, variant: str) -> None:
        self.model = load_checkpoint(folder, dtype=torch.float32)
        self.builder = VLAPromptBuilder.from_checkpoint(folder, self.model.spec)
        self.reference = OpenVLAReference(folder, variant)
        self.whole_vocab = SamplingParams(0, self.model.spec.decoder.vocab_size)

    def prompt(self, instruction: str, seed: int) -> tuple[list[int], ImageInput, np.ndarray]:
        """Our prompt ids (image placeholders after BOS), its image span and the frame."""
        layout = self.builder.build(instruction)
        image = random_image(seed, size=IMAGE_SIZE)
        span = ImageInput(seed, layout.image_offset, layout.num_image_tokens, image)
        return list(layout.token_ids), span, image

    def runner(self, slots: PagedSlots) -> ModelRunner:
        return ModelRunner(
            self.model,
            req_to_token=slots.req_to_token,
            num_kv_slots=slots.num_slots,
            config=RunnerConfig(),
        )

    def decode_greedy(
        self, prompts: list[tuple[list[int], ImageInput]], *, seed: int
    ) -> list[list[int]]:
        """7 greedy tokens over the whole vocabulary for each prompt, in one batch on
        fresh shuffled pages (prefill, then 6 decode steps)."""
        slots = PagedSlots(max_context_len=512, seed=seed)
        runner = self.runner(slots)
        ids = [list(p) for p, _ in prompts]
        steps = [
            Step(f'r{k}', k, ids[k], 0, len(ids[k]), (span,), sampling=self.whole_vocab)
            for k, (_, span) in enumerate(prompts)
        ]
        batch = make_batch(slots, steps)
        generated: list[list[int]] = [[] for _ in prompts]
        for step in range(NUM_ACTION_TOKENS):
            tokens = runner.launch(batch).result().next_token_ids
            for k, token in enumerate(tokens):
                generated[k].append(int(token))
                ids[k] = [*ids[k], int(token)]
            if step + 1 < NUM_ACTION_TOKENS:
                steps = [
                    Step(f'r{k}', k, row, len(row) - 1, len(row), sampling=self.whole_vocab)
                    for k, row in enumerate(ids)
                ]
                batch = make_batch(slots, steps, decode=True)
        return generated

    def actions(self, token_ids: list[int]) -> np.ndarray:
        return ActionChunkDecoder.for_checkpoint(self.model.spec).decode(
            token_ids, clip_to_bins=True
        )[0]


def relative_error(ours: torch.Tensor, ref: torch.Tensor) -> float:
    assert ours.shape == ref.shape
    return float((ours - ref).abs().max() / ref.abs().max())


@pytest.fixture(scope='module')
def setups(tmp_path_factory):
    made: dict[str, OpenVLASetup] = {}

    def get(variant: str) -> OpenVLASetup:
        if variant not in made:
            folder = tmp_path_factory.mktemp(f'openvla_{variant}')
            write_openvla_checkpoint(folder, variant=variant, seed=3)
            made[variant] = OpenVLASetup(folder, variant)
        return made[variant]

    return get


def test_prompt_is_bos_image_then_the_text_tokenized_in_one_piece(setups):
    setup = setups('fused')
    ids, span, _ = setup.prompt('Pick up the Red block', seed=0)
    ref = setup.reference.prompt_ids('Pick up the Red block')
    image_token = setup.model.spec.image_token_id
    assert (span.token_offset, span.num_tokens) == (1, 256)
    assert ids == [ref[0], *[image_token] * 256, *ref[1:]]
    assert ids[-1] == SPACE_TOKEN_ID


@pytest.mark.parametrize('variant', ['fused', 'v01'])
def test_whole_prompt_logits_ids_and_actions_equal_the_reference(setups, variant):
    setup = setups(variant)
    instruction = 'pick up the red block'
    ids, span, image = setup.prompt(instruction, seed=1)
    ref_logits = setup.reference.logits(setup.reference.prompt_ids(instruction), image)
    assert float(ref_logits.std()) > 0.3  # the logits carry signal
    slots = PagedSlots(max_context_len=512, seed=1)
    runner = setup.runner(slots)
    whole = make_batch(slots, [Step('r0', 0, ids, 0, len(ids), (span,), sample=False)])
    assert relative_error(runner.forward_logits(whole), ref_logits) <= RELATIVE_TOLERANCE
    ours = setup.decode_greedy([(ids, span)], seed=1)
    ref_ids = setup.reference.generate(instruction, image)
    assert ours == [ref_ids]
    start, end = setup.model.spec.action_token_range
    assert any(start <= token < end for token in ref_ids)  # actions inside the bins, too
    np.testing.assert_allclose(
        setup.actions(ours[0]), setup.reference.actions(ref_ids), rtol=0, atol=1e-9
    )


def test_chunked_prefill_through_the_image_equals_the_reference(setups):
    setup = setups('fused')
    ids, span, image = setup.prompt('open the drawer', seed=2)
    ref = setup.reference.logits(setup.reference.prompt_ids('open the drawer'), image)
    slots = PagedSlots(max_context_len=512, seed=2)
    runner = setup.runner(slots)
    cut = span.token_offset + 100  # the first chunk ends inside the image span
    first = make_batch(slots, [Step('r0', 0, ids, 0, cut, (span,))])
    assert relative_error(runner.forward_logits(first), ref[:cut]) <= RELATIVE_TOLERANCE
    second = make_batch(slots, [Step('r0', 0, ids, cut, len(ids), (span,))])
    assert relative_error(runner.forward_logits(second), ref[cut:]) <= RELATIVE_TOLERANCE
    assert runner.feature_cache.num_hits == 1  # the image was encoded once


def test_batch_of_robots_with_different_instructions_equals_the_reference(setups):
    setup = setups('fused')
    instructions = ('stack the cups', 'push the blue button on the left', 'close')
    prompts = [setup.prompt(text, seed) for seed, text in enumerate(instructions, start=4)]
    assert len({len(ids) for ids, _, _ in prompts}) == 3  # different lengths in one batch
    slots = PagedSlots(max_context_len=512, seed=4)
    runner = setup.runner(slots)
    batch = make_batch(
        slots,
        [
            Step(f'r{k}', k, ids, 0, len(ids), (span,), sample=False)
            for k, (ids, span, _) in enumerate(prompts)
        ],
    )
    ours = runner.forward_logits(batch)
    refs = [
        setup.reference.logits(setup.reference.prompt_ids(text), image)
        for text, (_, _, image) in zip(instructions, prompts, strict=True)
    ]
    assert relative_error(ours, torch.cat(refs)) <= RELATIVE_TOLERANCE
    generated = setup.decode_greedy([(ids, span) for ids, span, _ in prompts], seed=5)
    for text, (_, _, image), ours_ids in zip(instructions, prompts, generated, strict=True):
        ref_ids = setup.reference.generate(text, image)
        assert ours_ids == ref_ids
        np.testing.assert_allclose(
            setup.actions(ours_ids), setup.reference.actions(ref_ids), rtol=0, atol=1e-9
        )


def test_decode_on_shuffled_pages_equals_the_reference(setups):
    setup = setups('fused')
    instruction = 'lift the lid'
    ids, span, image = setup.prompt(instruction, seed=6)
    ref_ids = setup.reference.prompt_ids(instruction)
    slots = PagedSlots(max_context_len=512, page_size=4, seed=6)
    runner = setup.runner(slots)
    prefill = make_batch(slots, [Step('r0', 5, ids, 0, len(ids), (span,), sample=False)])
    runner.forward_logits(prefill)
    pages = slots.req_to_token[5, : len(ids)] // slots.page_size
    assert not torch.equal(pages.sort().values, pages)  # the pages really are out of order
    for _ in range(NUM_ACTION_TOKENS - 1):
        token = int(setup.reference.logits(ref_ids, image)[-1].argmax())
        ids, ref_ids = [*ids, token], [*ref_ids, token]
        batch = make_batch(slots, [Step('r0', 5, ids, len(ids) - 1, len(ids))], decode=True)
        ours = runner.forward_logits(batch)
        ref = setup.reference.logits(ref_ids, image)[-1:]
        assert relative_error(ours, ref) <= RELATIVE_TOLERANCE
