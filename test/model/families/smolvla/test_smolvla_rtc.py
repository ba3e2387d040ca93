"""Real-time chunking on SmolVLA: guided denoising served through the scheduler equals the
paper's formulas (ΠGDM in LeRobot's time direction) written out on the independent reference
model within 1e-4; a zero mask or no guidance gives plain sampling, guided rows batched with
plain ones; the guided chunk reproduces the frozen actions far more closely than the unguided
one (a wrong sign would push it away); the translator builds the guidance from the step's
previous actions normalized as the model made them, the mask capped at the previous rows."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from smolvla_reference import ReferenceSmolVLA
from test_smolvla_equivalence import _pixels, _served_chunks, _steps

from vla_sched.core.forward_batch import FlowGuidance
from vla_sched.ipc.messages import StepRequest
from vla_sched.model.families.smolvla.checkpoint import read_smolvla_spec
from vla_sched.model.families.smolvla.processor import SmolVLAProcessor, load_vlm_tokenizer
from vla_sched.model.families.smolvla.steps import SmolVLAStepTranslator
from vla_sched.model.runner.flow_guidance import RtcSettings, soft_mask
from vla_sched.testing.smolvla_writer import write_smolvla_checkpoint

TOLERANCE = 1e-4
BETA = 10.0


@pytest.fixture(scope='module')
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp('smolvla-rtc')
    return write_smolvla_checkpoint(
        root / 'tiny', seed=5, chunk_size=8, n_action_steps=8, num_steps=4
    )


@pytest.fixture(scope='module')
def spec(folder):
    return read_smolvla_spec(folder, vlm_folder=folder / 'vlm')


@pytest.fixture(scope='module')
def reference(folder):
    return ReferenceSmolVLA.from_folder(folder, vlm_folder=folder / 'vlm')


def _targets(spec, num: int) -> list[np.ndarray]:
    rng = np.random.default_rng(11)
    out = []
    for _ in range(num):
        target = np.zeros((spec.chunk_size, spec.max_action_dim), np.float32)
        target[:, : spec.action_dim] = rng.uniform(-1, 1, (spec.chunk_size, spec.action_dim))
        out.append(target)
    return out


def _guidance(spec, delay: int, horizon: int, targets, schedule='linear'):
    weights = soft_mask(spec.chunk_size, delay=delay, horizon=horizon, schedule=schedule)
    return [FlowGuidance(target=t, weights=weights, max_weight=BETA) for t in targets]


def _reference_guided(reference, spec, steps, guidance) -> np.ndarray:
    """The paper's guided Euler loop written out on the reference model."""
    longest = max(len(ids) for ids, *_ in steps)
    lang = torch.zeros((len(steps), longest), dtype=torch.int64)
    valid = torch.zeros((len(steps), longest), dtype=torch.bool)
    for n, (ids, *_) in enumerate(steps):
        lang[n, : len(ids)] = torch.tensor(ids)
        valid[n, : len(ids)] = True
    pixels = [
        torch.cat([_pixels([images[c]]) for _, images, _, _ in steps])
        for c in range(len(spec.camera_keys))
    ]
    state = torch.from_numpy(np.stack([s for _, _, s, _ in steps]))
    prefix = reference.prefix(pixels=pixels, lang_ids=lang, lang_valid=valid, state=state)
    velocity = ReferenceSmolVLA.velocity.__wrapped__  # without its no_grad
    x = torch.from_numpy(np.stack([s[3] for s in steps])).float()
    target = torch.from_numpy(np.stack([g.target for g in guidance]))
    weights = torch.from_numpy(np.stack([g.weights for g in guidance]))[..., None]
    num_steps = spec.num_inference_steps
    dt = -1.0 / num_steps
    for step in range(num_steps):
        t = torch.full((x.shape[0],), 1.0 + step * dt, dtype=torch.float32)
        with torch.enable_grad():
            x_in = x.detach().requires_grad_(True)
            v = velocity(reference, prefix, x_t=x_in, t=t)
            clean = x_in - t[:, None, None] * v
            error = (weights * (target - clean)).detach()
            (g,) = torch.autograd.grad(clean, x_in, grad_outputs=error)
        tau = 1.0 - float(t[0])
        raw = math.inf if tau == 0 else (tau**2 + (1 - tau) ** 2) / (tau * (1 - tau))
        w = min(BETA, raw)
        x = (x + dt * (v.detach() - w * g)).detach()
    return x.numpy()


@pytest.mark.slow
def test_guided_chunks_equal_the_papers_formulas_on_the_reference(folder, spec, reference):
    steps = _steps(spec)
    guidance = _guidance(spec, 2, 6, _targets(spec, len(steps)))
    want = _reference_guided(reference, spec, steps, guidance)
    got = _served_chunks(folder, spec, steps, burst=1, guidance=guidance)
    for n, chunk in enumerate(got):
        np.testing.assert_allclose(chunk, want[n], rtol=TOLERANCE, atol=TOLERANCE)


@pytest.mark.slow
def test_a_zero_mask_or_no_guidance_is_plain_sampling_and_guided_rows_batch_with_plain_ones(
    folder, spec
):
    steps = _steps(spec)
    plain = _served_chunks(folder, spec, steps, burst=1)
    targets = _targets(spec, len(steps))
    zero = [FlowGuidance(target=t, weights=np.zeros(spec.chunk_size, np.float32),
                         max_weight=BETA) for t in targets]  # fmt: skip
    served = _served_chunks(folder, spec, steps, burst=1, guidance=zero)
    for got, want in zip(served, plain, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    mixed = _guidance(spec, 2, 6, targets)
    mixed[1] = None
    served = _served_chunks(folder, spec, steps, burst=4, guidance=mixed)
    np.testing.assert_allclose(served[1], plain[1], rtol=1e-6, atol=1e-6)
    assert not np.allclose(served[0], plain[0], atol=1e-3)


@pytest.mark.slow
def test_the_guided_chunk_reproduces_the_frozen_actions_far_better_than_the_plain_one(
    folder, spec
):
    steps = _steps(spec)
    delay = 3
    targets = _targets(spec, len(steps))
    guided = _served_chunks(
        folder, spec, steps, burst=1, guidance=_guidance(spec, delay, 6, targets)
    )
    plain = _served_chunks(folder, spec, steps, burst=1)
    cols = slice(0, spec.action_dim)
    for chunk, free, target in zip(guided, plain, targets, strict=True):
        guided_error = np.abs(chunk[:delay, cols] - target[:delay, cols]).mean()
        plain_error = np.abs(free[:delay, cols] - target[:delay, cols]).mean()
        assert guided_error < 0.5 * plain_error, (guided_error, plain_error)


def _step_fields(spec, previous: np.ndarray, delay: int) -> StepRequest:
    rng = np.random.default_rng(0)
    images = tuple(
        rng.integers(0, 256, (spec.image_size, spec.image_size, 3), dtype=np.uint8)
        for _ in spec.camera_keys
    )
    return StepRequest(
        robot_id='arm', step_seq=3, stamp_ns=0, deadline_ns=10**12, received_ns=0,
        images=images, state=np.zeros(spec.state_dim, np.float32),
        instruction='pick up the cube', instruction_version=1,
        previous_actions=previous, inference_delay=delay,
    )  # fmt: skip


def test_the_translator_guides_towards_the_previous_actions_as_the_model_made_them(folder, spec):
    processor = SmolVLAProcessor(spec, load_vlm_tokenizer(folder / 'vlm'))
    settings = RtcSettings(execution_horizon=6, max_guidance=7.0, schedule='linear')
    translator = SmolVLAStepTranslator(spec, processor, model_name='tiny', seed=0, rtc=settings)
    chunk = np.random.default_rng(1).standard_normal((spec.chunk_size, spec.max_action_dim))
    chunk = chunk.astype(np.float32)
    previous = processor.unnormalize_actions(chunk).numpy()[:4]  # 4 rows left of the chunk
    req = translator.translate(_step_fields(spec, previous, 2)).req
    guidance = req.guidance
    assert guidance is not None and guidance.max_weight == 7.0
    cols = slice(0, spec.action_dim)
    np.testing.assert_allclose(guidance.target[:4, cols], chunk[:4, cols], atol=1e-5)
    assert not guidance.target[4:].any() and not guidance.target[:, spec.action_dim :].any()
    np.testing.assert_array_equal(guidance.weights, soft_mask(8, delay=2, horizon=4))
    none = translator.translate(
        _step_fields(spec, np.zeros((0, spec.action_dim), np.float32), 0)
    ).req
    assert none.guidance is None
