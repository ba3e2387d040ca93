"""Real-time chunking on pi0 / pi0.5: guided denoising served through the scheduler equals a
plain-torch reference of the paper's formulas (ΠGDM in the pi0 family's time direction) on
the independent reference model within 1e-4; no target or a zero mask gives plain sampling;
the guided chunk reproduces the frozen actions far more closely than the unguided one (a
wrong sign would push it away); the mask schedules are as specified."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from pi0_reference import ReferencePi0
from pi0_serving import reference_inputs, robot_steps, served_chunks

from vla_sched.core.forward_batch import FlowGuidance
from vla_sched.model.families.pi0.checkpoint import read_pi0_spec
from vla_sched.model.runner.flow_guidance import RtcSettings, soft_mask
from vla_sched.testing.pi0_writer import write_pi0_checkpoint

TOLERANCE = 1e-4
BETA = 10.0


@pytest.fixture(scope='module', params=['pi0', 'pi05'])
def folder(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(request.param)
    return write_pi0_checkpoint(
        root / 'tiny', policy_type=request.param, weights_dtype='float32', seed=5,
        chunk_size=8, n_action_steps=8, num_inference_steps=4,
    )  # fmt: skip


def _targets(spec, num: int) -> list[np.ndarray]:
    rng = np.random.default_rng(11)
    out = []
    for _ in range(num):
        target = np.zeros((spec.chunk_size, spec.max_action_dim), np.float32)
        target[:, : spec.action_dim] = rng.uniform(-1, 1, (spec.chunk_size, spec.action_dim))
        out.append(target)
    return out


def differentiable_velocity(reference, prefix, **inputs) -> torch.Tensor:
    """The reference's velocity without the no_grad its sampling runs under."""
    return ReferencePi0.velocity.__wrapped__(reference, prefix, **inputs)


def _reference_guided(reference, spec, steps, guidance) -> np.ndarray:
    """The paper's guided Euler loop written out on the reference model."""
    inputs = reference_inputs(spec, steps)
    state = inputs.pop('state')
    with torch.no_grad():
        prefix = reference.prefix(**inputs)
    x = torch.from_numpy(np.stack([s[3] for s in steps])).float()
    target = torch.from_numpy(np.stack([g.target for g in guidance]))
    weights = torch.from_numpy(np.stack([g.weights for g in guidance]))[..., None]
    num_steps = spec.num_inference_steps
    dt = -1.0 / num_steps
    for step in range(num_steps):
        t = torch.full((x.shape[0],), 1.0 + step * dt, dtype=torch.float32)
        with torch.enable_grad():
            x_in = x.detach().requires_grad_(True)
            v = differentiable_velocity(reference, prefix, state=state, x_t=x_in, t=t)
            clean = x_in - t[:, None, None] * v
            error = (weights * (target - clean)).detach()
            (g,) = torch.autograd.grad(clean, x_in, grad_outputs=error)
        tau = 1.0 - float(t[0])
        raw = math.inf if tau == 0 else (tau**2 + (1 - tau) ** 2) / (tau * (1 - tau))
        w = min(BETA, raw)
        x = (x + dt * (v.detach() - w * g)).detach()
    return x.numpy()


def _guidance(spec, delay: int, horizon: int, targets, schedule='linear'):
    weights = soft_mask(spec.chunk_size, delay=delay, horizon=horizon, schedule=schedule)
    return [FlowGuidance(target=t, weights=weights, max_weight=BETA) for t in targets]


def test_guided_chunks_equal_the_papers_formulas_on_the_reference(folder):
    spec = read_pi0_spec(folder)
    steps = robot_steps(spec)
    guidance = _guidance(spec, 2, 6, _targets(spec, len(steps)))
    reference = ReferencePi0.from_folder(folder, sizes=spec.sizes)
    want = _reference_guided(reference, spec, steps, guidance)
    got = served_chunks(folder, spec, steps, guidance=guidance)
    for n, chunk in enumerate(got):
        np.testing.assert_allclose(chunk, want[n], rtol=TOLERANCE, atol=TOLERANCE)


def test_a_zero_mask_or_no_guidance_is_plain_sampling_and_guided_rows_batch_with_plain_ones(
    folder,
):
    spec = read_pi0_spec(folder)
    steps = robot_steps(spec)
    plain = served_chunks(folder, spec, steps)
    targets = _targets(spec, len(steps))
    zero = [FlowGuidance(target=t, weights=np.zeros(spec.chunk_size, np.float32),
                         max_weight=BETA) for t in targets]  # fmt: skip
    for got, want in zip(served_chunks(folder, spec, steps, guidance=zero), plain, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    mixed = _guidance(spec, 2, 6, targets)
    mixed[1] = None
    served = served_chunks(folder, spec, steps, guidance=mixed)
    np.testing.assert_allclose(served[1], plain[1], rtol=1e-6, atol=1e-6)
    assert not np.allclose(served[0], plain[0], atol=1e-3)


def test_the_guided_chunk_reproduces_the_frozen_actions_far_better_than_the_plain_one(folder):
    spec = read_pi0_spec(folder)
    steps = robot_steps(spec)
    delay = 3
    targets = _targets(spec, len(steps))
    guided = served_chunks(folder, spec, steps, guidance=_guidance(spec, delay, 6, targets))
    plain = served_chunks(folder, spec, steps)
    cols = slice(0, spec.action_dim)
    for chunk, free, target in zip(guided, plain, targets, strict=True):
        guided_error = np.abs(chunk[:delay, cols] - target[:delay, cols]).mean()
        plain_error = np.abs(free[:delay, cols] - target[:delay, cols]).mean()
        assert guided_error < 0.5 * plain_error, (guided_error, plain_error)


@pytest.mark.parametrize(
    ('schedule', 'want'),
    [
        ('zeros', [1, 1, 0, 0, 0, 0, 0, 0]),
        ('ones', [1, 1, 1, 1, 1, 1, 0, 0]),
        ('linear', [1, 1, 0.8, 0.6, 0.4, 0.2, 0, 0]),
        ('exp', [1, 1, *(r * math.expm1(r) / (math.e - 1) for r in (0.8, 0.6, 0.4, 0.2)), 0, 0]),
    ],
)
def test_each_mask_schedule_is_as_specified(schedule, want):
    got = soft_mask(8, delay=2, horizon=6, schedule=schedule)
    np.testing.assert_allclose(got, np.asarray(want, np.float32), rtol=1e-6, atol=1e-7)


def test_a_mask_outside_its_bounds_is_refused():
    with pytest.raises(ValueError, match='delay 5 <= horizon 4'):
        soft_mask(8, delay=5, horizon=4)
    with pytest.raises(ValueError, match='unknown mask schedule'):
        soft_mask(8, delay=1, horizon=4, schedule='cosine')


def test_the_mask_ends_with_the_previous_chunk_so_its_zero_padding_is_no_target():
    settings = RtcSettings(execution_horizon=8, max_guidance=BETA, schedule='linear')
    target = np.zeros((10, 4), np.float32)
    target[:2] = 1.0
    guidance = settings.guidance(target, num_rows=2, delay=5)
    np.testing.assert_array_equal(guidance.weights, [1, 1, 0, 0, 0, 0, 0, 0, 0, 0])
    longer = settings.guidance(target, num_rows=10, delay=1)
    assert longer.weights[7] > 0 and not longer.weights[8:].any()
