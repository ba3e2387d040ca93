"""ParallelActionRunner's contract: the inputs it refuses (naming the request), the KV slots
it writes (only the caller's), images encoded once per content, and its padded passes (the
plain pass's actions and KV, their padding counted)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from model_testing import PagedSlots, Step, make_batch, random_image

from vla_sched.core.forward_batch import ImageInput, SamplingParams
from vla_sched.model.families.openvla_oft.checkpoint import oft_preset, read_oft_spec
from vla_sched.model.families.openvla_oft.graphs import NUM_OFT_PADDING_SLOTS, OFTGraphs
from vla_sched.model.families.openvla_oft.model import load_oft_checkpoint
from vla_sched.model.families.openvla_oft.passes import OFTPassSizes, PassSize, oft_fixed_len
from vla_sched.model.families.openvla_oft.prompt import OFTPromptBuilder
from vla_sched.model.families.openvla_oft.runner import ParallelActionRunner
from vla_sched.model.layers.attention import AttentionMetadata
from vla_sched.model.runner.padding_stats import PaddingCounter, PaddingStats
from vla_sched.testing.openvla_oft_writer import write_openvla_oft_checkpoint

pytestmark = pytest.mark.slow  # seconds or more: not in the fast tier

ANY_SAMPLING = SamplingParams(0, 1)
STATE = np.linspace(-0.2, 0.3, 8)


@pytest.fixture(scope='module')
def oft(tmp_path_factory):
    settings = oft_preset('libero')
    folder = write_openvla_oft_checkpoint(tmp_path_factory.mktemp('oft'), settings=settings)
    spec = read_oft_spec(folder, settings)
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


LONG_INSTRUCTION = 'open the top drawer of the cabinet and put the bowl inside'
PADDED_CASES = {
    # name: (instructions, prepared sizes, token counts of the padded passes, requests run
    # on the plain eager pass)
    'one robot': (['stack the cups'], OFTPassSizes(), [640], []),
    'three robots on a size of four': (
        ['stack the cups'] * 3,
        OFTPassSizes(robot_counts=(4,)),
        [2496],
        [],
    ),
    'more robots than the largest size, three instructions': (
        ['stack the cups', LONG_INSTRUCTION, 'go', 'stack the cups', LONG_INSTRUCTION],
        OFTPassSizes(robot_counts=(1, 2)),
        [1280, 1280, 640],
        [],
    ),
    'a sequence of exactly a size, one longer than every size': (
        ['stack the cups', LONG_INSTRUCTION],  # 588 and 603 tokens
        OFTPassSizes(robot_counts=(1,), prompt_tokens=17, token_multiple=1),  # 571 + 17
        [588],
        [1],
    ),
}


def plain_and_padded(model, builder, instructions, pass_sizes):
    """Per path (plain, padded): the actions, the KV at the batch's slots, the runner and
    the batch."""
    steps = [
        make_step(builder, f'r{i}', i, text, (2 * i + 1, 2 * i + 2))
        for i, text in enumerate(instructions)
    ]
    states = [STATE * (1 + 0.1 * i) for i in range(len(steps))]
    outputs = []
    for sizes in (None, pass_sizes):
        slots = PagedSlots(num_rows=len(steps), max_context_len=1024, num_pages=1024, seed=7)
        batch = make_batch(slots, steps)
        runner = ParallelActionRunner(
            model,
            req_to_token=slots.req_to_token,
            num_kv_slots=slots.num_slots,
            backend='torch',
            pass_sizes=sizes,
        )
        actions = runner.forward_actions(batch, states=states)
        kv = [cache[batch.out_cache_loc] for layer in runner.kv_caches for cache in layer]
        outputs.append((actions, kv, runner, batch))
    return outputs


def relative_error(ours, want) -> float:
    ours, want = np.asarray(ours), np.asarray(want)
    return float(np.abs(ours - want).max() / np.abs(want).max())


@pytest.mark.parametrize('case', list(PADDED_CASES))
def test_padded_passes_give_the_plain_actions_and_kv_and_count_their_padding(oft, case):
    model, builder = oft
    instructions, pass_sizes, pass_tokens, eager = PADDED_CASES[case]
    plain_out, padded_out = plain_and_padded(model, builder, instructions, pass_sizes)
    (plain, plain_kv, plain_runner, _), (padded, padded_kv, runner, batch) = plain_out, padded_out
    assert padded.shape == plain.shape == (len(instructions), 8, 7)
    assert relative_error(padded, plain) <= 1e-5
    for ours, want in zip(padded_kv, plain_kv, strict=True):
        assert relative_error(ours, want) <= 1e-5
    # Padding tokens write only the reserved slots past the caller's.
    num_slots = runner.num_kv_slots
    written = torch.zeros(num_slots, dtype=torch.bool)
    for k_cache, _ in runner.kv_caches:
        written |= k_cache[:num_slots].abs().flatten(1).amax(dim=1) > 0
    expected = torch.zeros(num_slots, dtype=torch.bool)
    expected[batch.out_cache_loc] = True
    assert torch.equal(written, expected)
    # Counted: tokens of the padded passes and the eager ones, images of the encoder pass.
    lens = batch.seq_lens.tolist()
    eager_tokens = sum(lens[i] for i in eager)
    num_real, num_images = sum(lens) - eager_tokens, 2 * len(lens)
    assert runner.padding_stats() == {
        'oft': PaddingStats(
            num_padded_runs=len(pass_tokens),
            num_real=num_real,
            num_padding=sum(pass_tokens) - num_real,
            num_eager_runs=len(eager),
            num_eager=eager_tokens,
        ),
        'vision': PaddingStats(  # one encoder pass, padded to a power of two
            num_padded_runs=1,
            num_real=num_images,
            num_padding=(1 << (num_images - 1).bit_length()) - num_images,
        ),
    }
    assert plain_runner.padding_stats() == {
        'oft': PaddingStats(num_eager_runs=1, num_eager=sum(lens)),
        'vision': PaddingStats(num_eager_runs=1, num_eager=num_images),
    }


def test_the_padded_pass_on_the_triton_kernels_matches_the_plain_torch_pass(oft):
    """OFTGraphs on two short made-up sequences (the interpreter runs every program of every
    kernel): one pass at a size of three requests and 128 tokens, so one request row is
    unused and 6 tokens pad; the plain pass is the eager runner's, on the torch kernels."""
    model, _ = oft
    decoder = model.vla.decoder
    seq_lens, head_offsets = [60, 62], [2, 5]  # the head reads 56 rows from its offset
    slots = PagedSlots(num_rows=2, max_context_len=64, num_pages=64, seed=9)
    for row, seq_len in enumerate(seq_lens):
        slots.ensure(row, seq_len)
    lens = torch.tensor(seq_lens)
    rows = torch.arange(2)
    out_cache_loc = torch.cat([slots.req_to_token[r, :n] for r, n in enumerate(seq_lens)]).long()
    embeds = torch.randn(
        sum(seq_lens), decoder.spec.hidden_size, generator=torch.Generator().manual_seed(3)
    )
    rope = decoder.rope_tables(64)
    plain_kv = decoder.allocate_kv_cache(slots.num_slots)
    meta = AttentionMetadata.build(
        is_decode=False,
        req_to_token=slots.req_to_token,
        req_pool_indices=rows,
        prefix_lens=torch.zeros_like(lens),
        extend_lens=lens,
        out_cache_loc=out_cache_loc,
        device=torch.device('cpu'),
        backend='torch',
        image_spans=torch.stack([torch.zeros_like(lens), lens], dim=1),
    )
    hidden = decoder(embeds, meta, plain_kv, rope=rope.at(meta.positions))
    read = torch.tensor([[0, 60][i] + head_offsets[i] for i in range(2)])[:, None] + torch.arange(
        56
    )
    plain = model.action_head(hidden[read])

    kv = decoder.allocate_kv_cache(slots.num_slots + NUM_OFT_PADDING_SLOTS)
    counter = PaddingCounter()
    graphs = OFTGraphs(
        model,
        kv,
        slots.req_to_token,
        rope=rope,
        sizes=[PassSize(1, 64), PassSize(3, 128)],
        first_pad_slot=slots.num_slots,
        capture=False,
        backend='triton',
        padding=counter,
    )
    (one_pass,) = graphs.plan(seq_lens)
    assert one_pass.size == PassSize(3, 128)
    with torch.inference_mode():
        padded = graphs.run_pass(
            one_pass,
            embeds=embeds,
            seq_lens=seq_lens,
            out_cache_loc=out_cache_loc,
            req_pool_indices=rows,
            head_offsets=head_offsets,
        )
    assert relative_error(padded, plain.detach()) <= 1e-5
    for (k, v), (plain_k, plain_v) in zip(kv, plain_kv, strict=True):
        assert relative_error(k[out_cache_loc], plain_k[out_cache_loc]) <= 1e-5
        assert relative_error(v[out_cache_loc], plain_v[out_cache_loc]) <= 1e-5
    assert counter.snapshot() == PaddingStats(num_padded_runs=1, num_real=122, num_padding=6)


def test_the_fixed_length_is_every_position_but_the_prompt(oft):
    model, builder = oft
    for text in ('go', LONG_INSTRUCTION):
        layout = builder.build(text).layout
        assert layout.seq_len - layout.prompt_len == oft_fixed_len(model.spec) == 571


def test_cuda_graphs_need_a_cuda_device(oft):
    model, _ = oft
    slots = PagedSlots(num_rows=1, max_context_len=1024, num_pages=512, seed=3)
    with pytest.raises(ValueError, match='CUDA graphs need the model on a CUDA device'):
        ParallelActionRunner(
            model, req_to_token=slots.req_to_token, num_kv_slots=slots.num_slots, cuda_graphs=True
        )
