"""OpenVLA's predict_action through transformers' generate equals our scheduled engine.

``HFOpenVLAPolicy`` (``LlamaForCausalLM.generate`` over the projected image and the prompt)
is the one-request-at-a-time baseline; on tiny OpenVLA-format folders it must pick the same
greedy ids as our paged model runner and give the same actions as the scheduled core.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
from model_testing import PagedSlots, Step, make_batch

from vla_sched.core.forward_batch import ImageInput, SamplingParams
from vla_sched.engine.config import EngineConfig
from vla_sched.engine.scheduled_core import ScheduledCore
from vla_sched.ipc.messages import StepRequest, StepResult
from vla_sched.model.config.checkpoint_spec import CheckpointError
from vla_sched.model.families.openvla.action_tokenizer import ActionChunkDecoder
from vla_sched.model.families.openvla.hf_openvla import HFOpenVLAPolicy
from vla_sched.model.families.openvla.prompt import VLAPromptBuilder
from vla_sched.model.loading.checkpoint import load_checkpoint
from vla_sched.model.runner.model_runner import ModelRunner, RunnerConfig
from vla_sched.testing.openvla_writer import write_openvla_checkpoint

pytestmark = pytest.mark.slow
ACTION_TOLERANCE = 1e-6


def _frame(seed: int) -> np.ndarray:
    """A non-square frame, so both paths resize it to the towers' 224 px."""
    return np.random.default_rng(seed).integers(0, 256, size=(180, 240, 3), dtype=np.uint8)


@pytest.fixture(scope='module')
def folders(tmp_path_factory):
    made = {}

    def get(variant: str):
        if variant not in made:
            folder = tmp_path_factory.mktemp(f'hf_openvla_{variant}')
            made[variant] = write_openvla_checkpoint(folder, variant=variant, seed=5)
        return made[variant]

    return get


def _runner_greedy_ids(folder, image: np.ndarray, instruction: str) -> list[int]:
    """Our paged runner's greedy ids over the whole vocabulary (prefill, then decodes)."""
    model = load_checkpoint(folder, dtype=torch.float32)
    layout = VLAPromptBuilder.from_checkpoint(folder, model.spec).build(instruction)
    span = ImageInput(0, layout.image_offset, layout.num_image_tokens, image)
    sampling = SamplingParams(0, model.spec.decoder.vocab_size)
    slots = PagedSlots(max_context_len=512, seed=0)
    runner = ModelRunner(
        model, req_to_token=slots.req_to_token, num_kv_slots=slots.num_slots, config=RunnerConfig()
    )
    ids = list(layout.token_ids)
    batch = make_batch(slots, [Step('r0', 0, ids, 0, len(ids), (span,), sampling=sampling)])
    generated = []
    for _ in range(model.spec.num_action_tokens):
        token = int(runner.launch(batch).result().next_token_ids[0])
        generated.append(token)
        ids.append(token)
        step = Step('r0', 0, ids, len(ids) - 1, len(ids), sampling=sampling)
        batch = make_batch(slots, [step], decode=True)
    return generated


@pytest.mark.parametrize('variant', ['fused', 'v01'])
def test_generate_picks_the_same_greedy_ids_and_actions_as_our_runner(folders, variant):
    folder = folders(variant)
    policy = HFOpenVLAPolicy(folder, device='cpu', dtype=torch.float32)
    image, instruction = _frame(1), 'Pick up the red block'
    ids = policy.action_token_ids(image, instruction)
    assert len(ids) == policy.num_action_tokens == 7
    assert ids == _runner_greedy_ids(folder, image, instruction)
    expected = ActionChunkDecoder.for_checkpoint(policy.spec).decode(ids, clip_to_bins=True)
    actions = policy.predict(image, instruction)
    assert actions.shape == (1, 7)
    np.testing.assert_allclose(actions, expected, rtol=0, atol=ACTION_TOLERANCE)


def test_predict_equals_the_scheduled_cores_actions_for_the_same_frame(folders):
    folder = folders('fused')
    policy = HFOpenVLAPolicy(folder, device='cpu', dtype=torch.float32)
    image, instruction = _frame(2), 'open the drawer'
    core = ScheduledCore.from_config(
        EngineConfig(model_path=str(folder), device='cpu', kv_pool_tokens=1024, page_size=16)
    )
    try:
        now = time.time_ns()
        request = StepRequest(
            robot_id='r0', step_seq=1, stamp_ns=now, deadline_ns=now + 120 * 10**9,
            received_ns=now, images=(image,), state=np.zeros(0, np.float32),
            instruction=instruction, instruction_version=1,
        )  # fmt: skip
        assert core.submit(request, now) == []
        out = []
        for _ in range(100):
            if not core.has_work():
                break
            out += core.step(time.time_ns())
    finally:
        core.close()
    (result,) = out
    assert isinstance(result, StepResult)
    np.testing.assert_allclose(
        result.actions, policy.predict(image, instruction), rtol=0, atol=ACTION_TOLERANCE
    )


def test_the_unnorm_key_chooses_the_datasets_statistics(tmp_path):
    folder = write_openvla_checkpoint(tmp_path, seed=6, datasets=('bridge_orig', 'fractal'))
    image, instruction = _frame(3), 'stack the cups'
    bridge = HFOpenVLAPolicy(folder, unnorm_key='bridge_orig')
    fractal = HFOpenVLAPolicy(folder, unnorm_key='fractal')
    ids = bridge.action_token_ids(image, instruction)
    assert fractal.action_token_ids(image, instruction) == ids
    np.testing.assert_allclose(
        fractal.predict(image, instruction),
        fractal.spec.action_statistics['fractal'].unnormalize(
            bridge.decoder.decode_normalized(ids, clip_to_bins=True)
        ),
        rtol=0,
        atol=ACTION_TOLERANCE,
    )
    assert not np.allclose(bridge.predict(image, instruction), fractal.predict(image, instruction))


def test_a_llava_folder_is_refused(tmp_path):
    from vla_sched.model.loading.tiny_checkpoint import build_tiny_checkpoint

    with pytest.raises(CheckpointError, match='not an OpenVLA-format checkpoint'):
        HFOpenVLAPolicy(build_tiny_checkpoint(tmp_path, seed=0))
