"""The sequential core serves an OpenVLA-format folder through transformers' generate."""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import pytest
import torch

from vla_sched.engine.config import EngineConfig
from vla_sched.engine.sequential_core import SequentialCore
from vla_sched.ipc.messages import StepRequest, StepResult
from vla_sched.model.families.openvla.hf_openvla import HFOpenVLAPolicy
from vla_sched.model.layers.image_crop import center_crop_image
from vla_sched.testing.openvla_writer import write_openvla_checkpoint

pytestmark = pytest.mark.slow
DATASETS = ('bridge_orig', 'fractal')


@pytest.fixture(scope='module')
def folder(tmp_path_factory):
    return write_openvla_checkpoint(tmp_path_factory.mktemp('seq_openvla'), datasets=DATASETS)


def _request(step_seq: int, robot_id: str = 'r1') -> StepRequest:
    now = time.time_ns()
    return StepRequest(
        robot_id=robot_id, step_seq=step_seq, stamp_ns=now, deadline_ns=now + 120 * 10**9,
        received_ns=now, images=(np.full((60, 80, 3), 30 * step_seq, np.uint8),),
        state=np.zeros(0, np.float32), instruction='put the cup on the plate',
        instruction_version=1,
    )  # fmt: skip


def _serve_one(core: SequentialCore, request: StepRequest) -> StepResult:
    assert core.submit(request, time.time_ns()) == []
    (result,) = core.step(time.time_ns())
    assert isinstance(result, StepResult) and not core.has_work()
    return result


def test_a_step_returns_openvlas_actions_for_the_chosen_dataset(folder):
    config = EngineConfig(
        core='sequential', model_path=str(folder), unnorm_key='fractal',
        robots={'libero': {'center_crop': True}},
    )  # fmt: skip
    core = SequentialCore.from_config(config)
    assert core.info.prompt_layout.startswith('image first')
    seen = []  # the images the model gets
    action_token_ids = core.baseline.openvla.action_token_ids

    def recording(image, *args, **kwargs):
        seen.append(image)
        return action_token_ids(image, *args, **kwargs)

    core.baseline.openvla.action_token_ids = recording
    try:
        request = _request(1)
        result = _serve_one(core, request)
        frame = np.random.default_rng(0).integers(0, 256, (60, 80, 3), dtype=np.uint8)
        cropping = dataclasses.replace(_request(1, robot_id='libero'), images=(frame,))
        cropped = _serve_one(core, cropping)
    finally:
        core.close()
    assert result.actions.shape == (1, 7) and result.actions.dtype == np.float32
    assert result.prefill_ms > 0 and result.decode_ms > 0
    policy = HFOpenVLAPolicy(folder, dtype=torch.float32, unnorm_key='fractal')
    expected = policy.predict(request.images[0], request.instruction)
    np.testing.assert_allclose(result.actions, expected, rtol=0, atol=1e-6)
    # The cropping robot's image reaches the model center-cropped, the other's as it came.
    assert seen[0] is request.images[0]
    np.testing.assert_array_equal(seen[1], center_crop_image(frame))
    expected = policy.predict(center_crop_image(frame), cropping.instruction)
    np.testing.assert_allclose(cropped.actions, expected, rtol=0, atol=1e-6)


def test_action_range_decoding_also_serves_an_openvla_folder(folder):
    config = EngineConfig(
        core='sequential', model_path=str(folder), unnorm_key='bridge_orig',
        action_decoding='action_range',
    )  # fmt: skip
    core = SequentialCore.from_config(config)
    try:
        assert not core.baseline.whole_vocab
        result = _serve_one(core, _request(2))
    finally:
        core.close()
    # Without clipping the decoder refuses any id outside the action tokens.
    assert result.actions.shape == (1, 7) and np.isfinite(result.actions).all()
