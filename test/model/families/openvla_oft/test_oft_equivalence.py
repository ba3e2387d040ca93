"""Our OpenVLA-OFT pass against an independent reference on tiny OFT-format folders.

The reference follows upstream's ``get_vla_action`` / ``predict_action`` (L1 head), built
from parts that share no code with ours: transformers' ``LlamaModel`` loaded with the
``language_model.model.*`` tensors and called with an all-ones 4D mask (fully
bidirectional attention, as the fork of transformers OFT uses runs it); the towers and
projector of the plain-torch timm reference (``timm_vit_reference``), one image after the
other on the patch axis; the state normalized with the JSON statistics and projected by a
plain-torch MLP; the sequence ``[BOS][patches][proprio][prompt ... 29871][zeros][</s>]``;
the hidden states sliced at ``NUM_PATCHES + NUM_PROMPT_TOKENS``; the MLPResNet head and the
un-normalization written out below from the component files and the JSON statistics.

Frames are 224 x 224 (the towers' size), so no resize enters either side.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from model_testing import PagedSlots, Step, make_batch, random_image
from timm_vit_reference import reference_image_embeddings

from vla_sched.core.forward_batch import ImageInput, SamplingParams
from vla_sched.model.config.openvla_towers import openvla_vision_spec
from vla_sched.model.families.openvla_oft.checkpoint import OFTSettings, oft_preset, read_oft_spec
from vla_sched.model.families.openvla_oft.model import load_oft_checkpoint
from vla_sched.model.families.openvla_oft.prompt import OFTPromptBuilder
from vla_sched.model.families.openvla_oft.runner import ParallelActionRunner
from vla_sched.testing.openvla_oft_writer import write_openvla_oft_checkpoint

RELATIVE_TOLERANCE = 1e-4
IMAGE_SIZE = 224
SPACE_TOKEN_ID = 29871
STOP_TOKEN_ID = 2
IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
HALF = ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))
PROMPT = 'In: What action should the robot take to {}?\nOut:'
DATASET = 'libero_spatial_no_noops'
ANY_SAMPLING = SamplingParams(0, 1)


def _layer_norm(x: torch.Tensor, sd: dict, name: str) -> torch.Tensor:
    mean = x.mean(dim=-1, keepdim=True)
    var = (x - mean).pow(2).mean(dim=-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + 1e-5) * sd[f'{name}.weight'] + sd[f'{name}.bias']


def _linear(x: torch.Tensor, sd: dict, name: str) -> torch.Tensor:
    return x @ sd[f'{name}.weight'].T + sd[f'{name}.bias']


def _component(folder: Path, component: str) -> dict[str, torch.Tensor] | None:
    files = sorted(folder.glob(f'{component}--*checkpoint.pt'))
    if not files:
        return None
    state = torch.load(files[0], weights_only=True)
    return {k.removeprefix('module.'): v.float() for k, v in state.items()}


class OFTReference:
    """Upstream's L1 ``predict_action`` for one robot, from independent parts."""

    def __init__(self, folder: Path, settings: OFTSettings) -> None:
        from safetensors.torch import load_file
        from tokenizers import Tokenizer
        from transformers import LlamaConfig, LlamaModel

        self.settings = settings
        config = json.loads((folder / 'config.json').read_text())
        self.tensors: dict[str, torch.Tensor] = {}
        for path in sorted(folder.glob('*.safetensors')):
            self.tensors.update(load_file(str(path)))
        text_config = LlamaConfig(**config['text_config'])
        self.llm = LlamaModel(text_config).float().eval()
        prefix = 'language_model.model.'
        self.llm.load_state_dict(
            {k.removeprefix(prefix): v for k, v in self.tensors.items() if k.startswith(prefix)},
            strict=True,
        )
        self.towers = openvla_vision_spec(config, text_hidden_size=text_config.hidden_size).towers
        self.tokenizer = Tokenizer.from_file(str(folder / 'tokenizer.json'))
        self.statistics = json.loads((folder / 'dataset_statistics.json').read_text())
        self.head = _component(folder, 'action_head')
        self.proprio = _component(folder, 'proprio_projector')

    def pixel_values(self, image: np.ndarray) -> torch.Tensor:
        """``[6, 224, 224]``: DINOv2's ImageNet stats, then SigLIP's 0.5."""
        x = torch.from_numpy(image).permute(2, 0, 1).double() / 255.0
        groups = [
            (x - torch.tensor(m).view(3, 1, 1)) / torch.tensor(s).view(3, 1, 1)
            for m, s in (IMAGENET, HALF)
        ]
        return torch.cat(groups).float()

    def prompt_ids(self, instruction: str) -> list[int]:
        ids = self.tokenizer.encode(PROMPT.format(instruction.lower())).ids
        return ids if ids[-1] == SPACE_TOKEN_ID else [*ids, SPACE_TOKEN_ID]

    def bounds(self, kind: str, dataset: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        entry = self.statistics[dataset][kind]
        low, high = ('min', 'max') if self.settings.normalization == 'bounds' else ('q01', 'q99')
        mask = np.asarray(entry.get('mask', [True] * len(entry[low])), dtype=bool)
        return np.asarray(entry[low]), np.asarray(entry[high]), mask

    def proprio_token(self, state: np.ndarray, dataset: str) -> torch.Tensor:
        low, high, mask = self.bounds('proprio', dataset)
        normalized = np.clip(
            np.where(mask, 2 * (state - low) / (high - low + 1e-8) - 1, state), -1.0, 1.0
        )
        x = torch.from_numpy(normalized).float()
        h = _linear(x, self.proprio, 'fc1')
        h = 0.5 * h * (1.0 + torch.erf(h / math.sqrt(2.0)))
        return _linear(h, self.proprio, 'fc2')

    def head_actions(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[A*K, D]`` -> ``[K, A]``: the MLPResNet of the L1 head."""
        s = self.settings
        x = hidden.reshape(s.chunk_len, s.action_dim * hidden.shape[-1])
        x = torch.relu(
            _linear(_layer_norm(x, self.head, 'model.layer_norm1'), self.head, 'model.fc1')
        )
        for i in range(2):
            block = f'model.mlp_resnet_blocks.{i}.ffn'
            x = x + torch.relu(
                _linear(_layer_norm(x, self.head, f'{block}.0'), self.head, f'{block}.1')
            )
        return _linear(_layer_norm(x, self.head, 'model.layer_norm2'), self.head, 'model.fc2')

    @torch.no_grad()
    def actions(
        self,
        instruction: str,
        images: list[np.ndarray],
        state: np.ndarray | None,
        *,
        dataset: str = DATASET,
        bidirectional: bool = True,
    ) -> np.ndarray:
        s = self.settings
        ids = self.prompt_ids(instruction)
        num_prompt_tokens = len(ids) - 1
        num_actions = s.chunk_len * s.action_dim
        all_ids = [*ids, *[1] * num_actions, STOP_TOKEN_ID]
        embeds = self.llm.get_input_embeddings()(torch.tensor(all_ids))
        embeds[len(ids) : len(ids) + num_actions] = 0.0  # the action positions
        pixels = torch.stack([self.pixel_values(image) for image in images])
        patches = reference_image_embeddings(self.tensors, self.towers, pixels)
        patches = patches.reshape(-1, patches.shape[-1])  # images in order on the patch axis
        if state is not None:
            patches = torch.cat([patches, self.proprio_token(state, dataset)[None]])
        sequence = torch.cat([embeds[:1], patches, embeds[1:]])[None]
        length = sequence.shape[1]
        mask = torch.ones(1, 1, length, length, dtype=torch.bool)
        if not bidirectional:
            mask = torch.tril(mask)
        hidden = self.llm(
            inputs_embeds=sequence,
            attention_mask=mask,
            position_ids=torch.arange(length)[None],
        ).last_hidden_state[0]
        start = patches.shape[0] + num_prompt_tokens
        normalized = self.head_actions(hidden[start : start + num_actions]).double().numpy()
        low, high, action_mask = self.bounds('action', dataset)
        return np.where(
            action_mask, 0.5 * (normalized + 1) * (high - low + 1e-8) + low, normalized
        )


class OFTSetup:
    """One folder loaded by our loader (model, prompts, runner) and by the reference."""

    def __init__(self, folder: Path, settings: OFTSettings) -> None:
        self.settings = settings
        self.spec = read_oft_spec(folder, settings)
        self.model = load_oft_checkpoint(folder, spec=self.spec)
        self.builder = OFTPromptBuilder.from_checkpoint(folder, self.spec)
        self.reference = OFTReference(folder, settings)

    def run(
        self, robots: list[tuple[str, list[np.ndarray], np.ndarray | None]], *, seed: int
    ) -> np.ndarray:
        """Our actions for a batch of robots (instruction, images, state) on shuffled pages."""
        slots = PagedSlots(
            num_rows=len(robots) + 2, max_context_len=1024, num_pages=768, seed=seed
        )
        steps = []
        for k, (instruction, images, _) in enumerate(robots):
            prompt = self.builder.build(instruction)
            spans = tuple(
                ImageInput(
                    100 * k + c,
                    prompt.layout.image_offset(c),
                    prompt.layout.num_image_tokens,
                    image,
                )
                for c, image in enumerate(images)
            )
            ids = prompt.token_ids
            steps.append(Step(f'r{k}', k + 1, ids, 0, len(ids), spans, False, ANY_SAMPLING))
        batch = make_batch(slots, steps)
        runner = ParallelActionRunner(
            self.model, req_to_token=slots.req_to_token, num_kv_slots=slots.num_slots
        )
        return runner.forward_actions(batch, states=[state for _, _, state in robots])


def relative_error(ours: np.ndarray, ref: np.ndarray) -> float:
    assert ours.shape == ref.shape
    return float(np.abs(ours - ref).max() / np.abs(ref).max())


def robot(seed: int, instruction: str, settings: OFTSettings):
    rng = np.random.default_rng(seed)
    images = [random_image(seed * 10 + c, size=IMAGE_SIZE) for c in range(settings.num_images)]
    state = rng.uniform(-0.3, 0.4, settings.proprio_dim) if settings.use_proprio else None
    return instruction, images, state


@pytest.fixture(scope='module')
def folders(tmp_path_factory):
    """One tiny OFT folder with a proprio projector, and the same files without it."""
    with_proprio = write_openvla_oft_checkpoint(
        tmp_path_factory.mktemp('oft_proprio'), settings=oft_preset('libero'), seed=5
    )
    without = tmp_path_factory.mktemp('oft_no_proprio')
    for path in with_proprio.iterdir():
        if not path.name.startswith('proprio_projector--'):
            (without / path.name).symlink_to(path)
    return {True: with_proprio, False: without}


@pytest.fixture(scope='module')
def setups(folders):
    made: dict[tuple[int, bool], OFTSetup] = {}

    def get(num_images: int, use_proprio: bool) -> OFTSetup:
        key = (num_images, use_proprio)
        if key not in made:
            settings = oft_preset('libero', num_images=num_images, use_proprio=use_proprio)
            made[key] = OFTSetup(folders[use_proprio], settings)
        return made[key]

    return get


@pytest.mark.parametrize(
    ('num_images', 'use_proprio'), [(1, False), (1, True), (2, False), (2, True)]
)
def test_one_robots_action_chunk_equals_the_reference(setups, num_images, use_proprio):
    setup = setups(num_images, use_proprio)
    one = robot(1, 'Pick up the black bowl and place it on the plate', setup.settings)
    ours = setup.run([one], seed=1)
    ref = setup.reference.actions(*one)
    assert ours.shape == (1, 8, 7) and ours.dtype == np.float32
    assert float(np.abs(ref).std()) > 0.05  # the actions carry signal
    assert relative_error(ours[0], ref) <= RELATIVE_TOLERANCE


def test_batch_of_robots_with_different_instructions_equals_the_reference(setups):
    setup = setups(2, True)
    instructions = (
        'stack the cups',
        'push the blue button on the left side of the table',
        'close',
    )
    robots = [robot(seed, text, setup.settings) for seed, text in enumerate(instructions, start=4)]
    lengths = {len(setup.builder.build(text).token_ids) for text in instructions}
    assert len(lengths) == 3  # different sequence lengths in one batch
    ours = setup.run(robots, seed=4)
    for k, one in enumerate(robots):
        assert relative_error(ours[k], setup.reference.actions(*one)) <= RELATIVE_TOLERANCE
    assert relative_error(ours[0], ours[1]) > 1e-2  # each robot its own chunk


def test_causal_attention_would_give_other_actions(setups):
    setup = setups(2, True)
    one = robot(2, 'open the top drawer', setup.settings)
    ours = setup.run([one], seed=2)
    causal = setup.reference.actions(*one, bidirectional=False)
    assert relative_error(ours[0], causal) > 100 * RELATIVE_TOLERANCE


def test_gripper_is_left_as_the_head_gives_it(setups):
    setup = setups(1, True)
    one = robot(3, 'lift the lid', setup.settings)
    runner_spec = setup.model.spec
    ours = setup.run([one], seed=3)
    bounds = runner_spec.selected_action_bounds
    assert not bounds.mask[-1] and bounds.mask[:-1].all()
    slots = PagedSlots(num_rows=2, max_context_len=1024, num_pages=768, seed=3)
    prompt = setup.builder.build(one[0])
    spans = (ImageInput(7, 1, prompt.layout.num_image_tokens, one[1][0]),)
    ids = prompt.token_ids
    batch = make_batch(slots, [Step('r0', 0, ids, 0, len(ids), spans, False, ANY_SAMPLING)])
    runner = ParallelActionRunner(
        setup.model, req_to_token=slots.req_to_token, num_kv_slots=slots.num_slots
    )
    normalized = runner.forward_normalized(batch, states=[one[2]]).numpy()
    np.testing.assert_allclose(ours[0, :, -1], normalized[0, :, -1], rtol=1e-6, atol=0)
    expected = bounds.unnormalize(normalized[0])[:, :-1]
    np.testing.assert_allclose(ours[0, :, :-1], expected, rtol=1e-6, atol=1e-7)
