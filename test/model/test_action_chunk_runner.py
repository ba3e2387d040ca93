"""ParallelActionRunner's contract: the inputs it refuses (naming the request), the KV slots
it writes (only the caller's), and images encoded once per content."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from model_testing import PagedSlots, Step, make_batch, random_image

from vla_sched.core.forward_batch import ImageInput, SamplingParams
from vla_sched.model.config.formats import read_checkpoint_spec
from vla_sched.model.config.openvla_oft import oft_preset
from vla_sched.model.loading.oft_model import load_oft_checkpoint
from vla_sched.model.prompting.oft_prompt import OFTPromptBuilder
from vla_sched.model.runner.action_chunk_runner import ParallelActionRunner
from vla_sched.testing.openvla_oft_writer import write_openvla_oft_checkpoint

ANY_SAMPLING = SamplingParams(0, 1)
STATE = np.linspace(-0.2, 0.3, 8)


@pytest.fixture(scope='module')
def oft(tmp_path_factory):
    settings = oft_preset('libero')
    folder = write_openvla_oft_checkpoint(tmp_path_factory.mktemp('oft'), settings=settings)
    spec = read_checkpoint_spec(folder, oft_settings=settings)
    return load_oft_checkpoint(folder, spec=spec), OFTPromptBuilder.from_checkpoint(folder, spec)


def make_step(builder, rid: str, row: int, instruction: str, hashes: tuple[int, ...]):
    prompt = builder.build(instruction)
    layout = prompt.layout
    images = tuple(
        ImageInput(h, layout.image_offset(c), layout.num_image_tokens, random_image(h, 224))
        for c, h in enumerate(hashes)
    )
    ids = prompt.token_ids
    return Step(rid, row, ids, 0, len(ids), images, False, ANY_SAMPLING)


def runner_for(model, slots: PagedSlots) -> ParallelActionRunner:
    return ParallelActionRunner(
        model, req_to_token=slots.req_to_token, num_kv_slots=slots.num_slots
    )


def test_the_pass_writes_kv_only_into_the_callers_slots(oft):
    model, builder = oft
    slots = PagedSlots(num_rows=3, max_context_len=1024, num_pages=512, seed=1)
    steps = [
        make_step(builder, 'a', 0, 'stack the cups', (1, 2)),
        make_step(builder, 'b', 2, 'open the drawer', (3, 4)),
    ]
    batch = make_batch(slots, steps)
    runner = runner_for(model, slots)
    actions = runner.forward_actions(batch, states=[STATE, -STATE])
    assert actions.shape == (2, 8, 7) and np.isfinite(actions).all()
    written = torch.zeros(slots.num_slots, dtype=torch.bool)
    for k_cache, _ in runner.kv_caches:
        written |= k_cache.abs().flatten(1).amax(dim=1) > 0
    expected = torch.zeros(slots.num_slots, dtype=torch.bool)
    expected[batch.out_cache_loc] = True
    assert torch.equal(written, expected)


def test_an_image_seen_twice_is_encoded_once(oft):
    model, builder = oft
    slots = PagedSlots(num_rows=2, max_context_len=1024, num_pages=512, seed=2)
    steps = [
        make_step(builder, 'a', 0, 'stack the cups', (7, 8)),
        make_step(builder, 'b', 1, 'stack the cups', (7, 8)),  # the same two frames
    ]
    runner = runner_for(model, slots)
    actions = runner.forward_actions(make_batch(slots, steps), states=[STATE, STATE])
    assert len(runner.feature_cache) == 2
    np.testing.assert_allclose(actions[0], actions[1], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ('hashes', 'states', 'message'),
    [
        ((1,), [STATE], 'request a: 1 images, the OFT settings take 2'),
        ((1, 2), [None], 'request a: the settings need a finite state of 8 values'),
        ((1, 2), [STATE[:7]], r'request a: .* got \(7,\)'),
        ((1, 2), [np.full(8, np.nan)], 'request a: the settings need a finite state'),
        ((1, 2), [], 'states needs one entry per request'),
    ],
)
def test_steps_that_do_not_fit_the_settings_are_refused_naming_the_request(
    oft, hashes, states, message
):
    model, builder = oft
    slots = PagedSlots(num_rows=1, max_context_len=1024, num_pages=512, seed=3)
    step = make_step(builder, 'a', 0, 'lift the lid', hashes)
    if len(hashes) == 1:  # a sequence laid out for two images, given one
        step.images = step.images[:1]
    batch = make_batch(slots, [step])
    with pytest.raises(ValueError, match=message):
        runner_for(model, slots).forward_actions(batch, states=states)


def test_an_image_off_its_span_is_refused(oft):
    model, builder = oft
    slots = PagedSlots(num_rows=1, max_context_len=1024, num_pages=512, seed=4)
    step = make_step(builder, 'a', 0, 'lift the lid', (1, 2))
    step.images = tuple(  # each image one position later than its span
        ImageInput(img.content_hash, img.token_offset + 1, img.num_tokens, img.pixels)
        for img in step.images
    )
    with pytest.raises(ValueError, match=r'request a: image 0 spans \[2, 258\)'):
        runner_for(model, slots).forward_actions(make_batch(slots, [step]), states=[STATE])


def test_launch_runs_a_prefill_only_batch_with_its_states(oft):
    model, builder = oft
    slots = PagedSlots(num_rows=2, max_context_len=1024, num_pages=512, seed=5)
    steps = [
        make_step(builder, 'a', 0, 'stack the cups', (1, 2)),
        make_step(builder, 'b', 1, 'open the drawer', (3, 4)),
    ]
    batch = make_batch(slots, steps)
    runner = runner_for(model, slots)
    expected = runner.forward_actions(batch, states=[STATE, -STATE])
    with pytest.raises(ValueError, match='prefill-only'):
        runner.launch(batch)
    prefill_only = dataclasses.replace(
        batch, prefill_only=True, sample=(True, True), proprio=(STATE, -STATE)
    )
    output = runner.launch(prefill_only).result()
    assert output.next_token_ids == (-1, -1)
    for ours, want in zip(output.action_chunks, expected, strict=True):
        assert ours.shape == (8, 7) and ours.dtype == np.float32
        np.testing.assert_allclose(ours, want, rtol=1e-5, atol=1e-6)
