"""Our pi0 / pi0.5 on the paged KV, served through the scheduler, against the independent
reference (``pi0_reference``: transformers' SigLIP and Gemma plus LeRobot's additions in plain
torch) on tiny float32 folders: several robots with different instructions and states
batched, every chunk within 1e-4; each error a port could make (a causal prefix, suffix
positions from zero, no embedding scale, causal actions) moves the reference's actions
beyond that tolerance, so this comparison would catch it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from pi0_reference import ReferencePi0
from pi0_serving import reference_chunks, reference_inputs, robot_steps, served_chunks

from vla_sched.model.families.pi0.checkpoint import read_pi0_spec
from vla_sched.testing.pi0_writer import write_pi0_checkpoint

TOLERANCE = 1e-4


@pytest.fixture(scope='module', params=['pi0', 'pi05'])
def folder(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(request.param)
    return write_pi0_checkpoint(
        root / 'tiny', policy_type=request.param, weights_dtype='float32', seed=4
    )


@pytest.mark.parametrize('burst', [1, 8])
def test_served_chunks_equal_the_reference_for_robots_batched(folder, burst):
    spec = read_pi0_spec(folder)
    steps = robot_steps(spec)
    reference = ReferencePi0.from_folder(folder, sizes=spec.sizes)
    want = reference_chunks(reference, spec, steps)
    got = served_chunks(folder, spec, steps, burst=burst)
    for n, chunk in enumerate(got):
        assert chunk is not None and chunk.shape == want[n].shape
        np.testing.assert_allclose(chunk, want[n], rtol=TOLERANCE, atol=TOLERANCE)


@pytest.mark.parametrize(
    'mutation',
    ['causal_prefix', 'suffix_positions_from_zero', 'no_embedding_scale', 'causal_actions'],
)
def test_each_porting_error_moves_the_reference_beyond_the_tolerance(folder, mutation):
    spec = read_pi0_spec(folder)
    steps = robot_steps(spec)
    reference = ReferencePi0.from_folder(folder, sizes=spec.sizes)
    right = reference_chunks(reference, spec, steps)
    wrong = reference_chunks(reference.mutated(**{mutation: True}), spec, steps)
    assert np.abs(right - wrong).max() > 10 * TOLERANCE


def test_every_denoising_steps_velocity_equals_the_references(folder, monkeypatch):
    from vla_sched.model.families.pi0.model import Pi0Model

    spec = read_pi0_spec(folder)
    steps = robot_steps(spec)
    reference = ReferencePi0.from_folder(folder, sizes=spec.sizes)
    noise = torch.from_numpy(np.stack([x for *_, x in steps]))
    _, want = reference.sample_actions(
        **reference_inputs(spec, steps), noise=noise, num_steps=spec.num_inference_steps
    )
    recorded: list[torch.Tensor] = []
    plain = Pi0Model.velocity

    def recording(self, **inputs):
        v = plain(self, **inputs)
        recorded.append(v.detach().clone())
        return v

    monkeypatch.setattr(Pi0Model, 'velocity', recording)
    for n, step in enumerate(steps):  # one robot at a time: each pass holds one row
        recorded.clear()
        served_chunks(folder, spec, [step])
        assert len(recorded) == spec.num_inference_steps
        for k, v in enumerate(recorded):
            np.testing.assert_allclose(
                v[0].numpy(), want[k][n].numpy(), rtol=TOLERANCE, atol=TOLERANCE
            )
