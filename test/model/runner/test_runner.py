"""ModelRunner behaviour: sampling, the overlap seam, image features, padded decode, errors."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from model_testing import PagedSlots, Step, make_batch, random_image

from vla_sched.core.forward_batch import ForwardBatch, ForwardMode, ImageInput, SamplingParams
from vla_sched.model.layers.sampling import sample_next_tokens
from vla_sched.model.runner.model_runner import ModelRunner, RunnerConfig

ACTIONS = SamplingParams(260, 516)


def new_runner(model, slots, **config) -> ModelRunner:
    return ModelRunner(
        model,
        req_to_token=slots.req_to_token,
        num_kv_slots=slots.num_slots,
        config=RunnerConfig(**config),
    )


def prompt(builder, text, seed, image=None):
    layout = builder.build(text)
    pixels = random_image(seed) if image is None else image
    span = ImageInput(seed, layout.image_offset, layout.num_image_tokens, pixels)
    return list(layout.token_ids), span


def test_greedy_picks_the_best_token_inside_the_allowed_range():
    logits = torch.zeros(2, 10)
    logits[:, 0] = 9.0  # best overall, but outside the range
    logits[0, 6], logits[1, 4] = 3.0, 2.0
    params = [SamplingParams(4, 8), SamplingParams(4, 8)]
    assert sample_next_tokens(logits, params, [5, 5]).tolist() == [6, 4]


def test_temperature_sampling_is_seeded_and_stays_in_range():
    logits = torch.zeros(64, 50)
    params = [SamplingParams(10, 20, temperature=1.0, seed=3)] * 64
    first = sample_next_tokens(logits, params, list(range(64)))
    again = sample_next_tokens(logits, params, list(range(64)))
    other = sample_next_tokens(
        logits, [dataclasses.replace(params[0], seed=4)] * 64, list(range(64))
    )
    assert torch.equal(first, again)
    assert not torch.equal(first, other)
    assert bool(((first >= 10) & (first < 20)).all())
    assert len(set(first.tolist())) > 5  # flat logits: draws spread over the range


def test_runner_returns_minus_one_for_rows_that_do_not_sample(tiny_model, prompt_builder):
    slots = PagedSlots()
    runner = new_runner(tiny_model, slots)
    (a, span_a), (b, span_b) = prompt(prompt_builder, 'go', 1), prompt(prompt_builder, 'stop', 2)
    batch = make_batch(
        slots,
        [
            Step('a', 0, a, 0, len(a) - 2, (span_a,), sample=False, sampling=ACTIONS),
            Step('b', 1, b, 0, len(b), (span_b,), sampling=ACTIONS),
        ],
    )
    tokens = runner.launch(batch).result().next_token_ids
    assert tokens[0] == -1 and 260 <= tokens[1] < 516


def test_future_token_input_uses_the_last_sampled_token(tiny_model, prompt_builder):
    ids, span = prompt(prompt_builder, 'grab the cup', 3)
    outputs = []
    for use_future in (False, True):
        slots = PagedSlots(seed=5)
        runner = new_runner(tiny_model, slots)
        first = make_batch(slots, [Step('r', 2, ids, 0, len(ids), (span,), sampling=ACTIONS)])
        token = runner.launch(first).result().next_token_ids[0]
        grown = [*ids, -1 if use_future else token]
        step = Step('r', 2, grown, len(ids), len(grown), sampling=ACTIONS)
        outputs.append(runner.launch(make_batch(slots, [step], decode=True)).result())
    assert outputs[0] == outputs[1]


def test_each_image_is_encoded_once_and_chunks_take_their_rows(tiny_model, prompt_builder):
    slots = PagedSlots()
    runner = new_runner(tiny_model, slots)
    image = random_image(11)
    (a, span_a), (b, span_b) = (prompt(prompt_builder, t, 11, image) for t in ('go', 'halt'))
    cut = span_b.token_offset + 7
    batch = make_batch(
        slots,
        [Step('a', 0, a, 0, len(a), (span_a,)), Step('b', 1, b, 0, cut, (span_b,), sample=False)],
    )
    whole = runner.forward_logits(batch)
    assert runner.feature_cache.num_misses == 1 and len(runner.feature_cache) == 1
    runner.forward_logits(make_batch(slots, [Step('b', 1, b, cut, len(b), (span_b,))]))
    assert runner.feature_cache.num_hits == 1
    assert whole.shape == (len(a) + cut, 520)


def test_padded_decode_path_equals_the_plain_path_and_keeps_real_kv(tiny_model, prompt_builder):
    prompts = [prompt(prompt_builder, t, s) for t, s in (('a', 1), ('b', 2), ('c', 3))]
    results = []
    for padded in (False, True):
        slots = PagedSlots(seed=6)
        runner = new_runner(tiny_model, slots, padded_decode=padded, decode_batch_sizes=(2, 4))
        steps = [
            Step(str(i), i, ids, 0, len(ids), (span,)) for i, (ids, span) in enumerate(prompts)
        ]
        runner.forward_logits(make_batch(slots, steps))
        grown = [[*ids, 300 + i] for i, (ids, _) in enumerate(prompts)]
        decode = make_batch(
            slots,
            [Step(str(i), i, g, len(g) - 1, len(g)) for i, g in enumerate(grown)],
            decode=True,
        )
        tokens = runner.launch(decode).result().next_token_ids
        real = slots.req_to_token[:3, : len(grown[0])].reshape(-1).long()
        results.append((tokens, runner.kv_caches[1][0][real].clone()))
    assert results[0][0] == results[1][0]
    # A padded batch runs other matmul shapes: equal up to float32 rounding, while a pad
    # row writing into a real slot would change that slot's KV entirely.
    torch.testing.assert_close(results[0][1], results[1][1], rtol=1e-5, atol=1e-5)


def test_padded_vision_path_equals_the_eager_encoder_and_keeps_cached_features(
    tiny_model, prompt_builder
):
    first = [prompt(prompt_builder, t, s) for t, s in (('a', 21), ('b', 22), ('c', 23))]
    second = [prompt(prompt_builder, t, s) for t, s in (('d', 24), ('e', 25))]
    again = [prompt(prompt_builder, 'f', 21)]  # image 21 again: served from the cache
    outputs = []
    for padded in (False, True):
        slots = PagedSlots(seed=8)
        runner = new_runner(tiny_model, slots, padded_vision=padded, vision_batch_sizes=(2, 4))
        assert (runner.vision_graphs is not None) == padded
        logits = []
        for group in (first, second, again):
            steps = [
                Step(str(i), i, ids, 0, len(ids), (span,)) for i, (ids, span) in enumerate(group)
            ]
            logits.append(runner.forward_logits(make_batch(slots, steps)))
        assert runner.feature_cache.num_hits == 1
        outputs.append(logits)
    for plain, padded in zip(*outputs, strict=True):
        # 3 images run padded to 4, 2 at 2: other shapes, so equal up to float32 rounding;
        # features overwritten by a later pass would differ entirely.
        torch.testing.assert_close(padded, plain, rtol=1e-5, atol=1e-5)


def test_more_new_images_than_the_largest_vision_size_run_in_several_padded_passes(
    tiny_model, prompt_builder
):
    group = [prompt(prompt_builder, t, s) for t, s in (('a', 31), ('b', 32), ('c', 33))]
    steps = [Step(str(i), i, ids, 0, len(ids), (span,)) for i, (ids, span) in enumerate(group)]
    outputs = []
    for config in ({}, {'padded_vision': True, 'vision_batch_sizes': (2,)}):
        slots = PagedSlots(seed=9)
        runner = new_runner(tiny_model, slots, **config)
        outputs.append(runner.forward_logits(make_batch(slots, steps)))
        vision = runner.padding_stats()['vision']
    torch.testing.assert_close(outputs[1], outputs[0], rtol=1e-5, atol=1e-5)
    # 3 images: a pass of 2, then 1 padded to 2; none eagerly
    assert (vision.num_padded_runs, vision.num_real, vision.num_padding) == (2, 3, 1)
    assert vision.num_eager_runs == 0


def test_a_decode_burst_samples_what_single_decode_steps_sample(tiny_model, prompt_builder):
    prompts = [prompt(prompt_builder, t, s) for t, s in (('go', 41), ('halt', 42))]
    num_steps = 3
    outputs = []
    for burst in (False, True):
        slots = PagedSlots(seed=10)
        runner = new_runner(tiny_model, slots)
        steps = [
            Step(str(i), i, ids, 0, len(ids), (span,), sampling=ACTIONS)
            for i, (ids, span) in enumerate(prompts)
        ]
        first = runner.launch(make_batch(slots, steps)).result().next_token_ids
        grown = [[*ids, t] for (ids, _), t in zip(prompts, first, strict=True)]
        if burst:
            steps = [
                Step(str(i), i, [*g, *[-1] * (num_steps - 1)], len(g) - 1,
                     len(g) - 1 + num_steps, sampling=ACTIONS)
                for i, g in enumerate(grown)
            ]  # fmt: skip
            out = runner.launch(make_batch(slots, steps, decode=True)).result()
            assert out.next_token_ids == tuple(row[-1] for row in out.burst_token_ids)
            outputs.append([list(row) for row in out.burst_token_ids])
            continue
        tokens = [[] for _ in grown]
        for _ in range(num_steps):
            steps = [
                Step(str(i), i, g, len(g) - 1, len(g), sampling=ACTIONS)
                for i, g in enumerate(grown)
            ]
            out = runner.launch(make_batch(slots, steps, decode=True)).result()
            for i, token in enumerate(out.next_token_ids):
                tokens[i].append(token)
                grown[i] = [*grown[i], token]
        outputs.append(tokens)
    assert outputs[0] == outputs[1]


def test_a_decode_burst_must_know_only_its_first_input_ids(tiny_model, prompt_builder):
    ids, _ = prompt(prompt_builder, 'go', 43)
    slots = PagedSlots()
    known = Step('r', 0, [*ids, 300, 301], len(ids), len(ids) + 2)
    with pytest.raises(ValueError, match='first input id'):
        make_batch(slots, [known], decode=True).check()


def test_forward_logits_refuses_a_decode_burst(tiny_model, prompt_builder):
    ids, span = prompt(prompt_builder, 'go', 44)
    slots = PagedSlots()
    runner = new_runner(tiny_model, slots)
    first = runner.launch(make_batch(slots, [Step('r', 0, ids, 0, len(ids), (span,))]))
    grown = [*ids, first.result().next_token_ids[0], -1]
    burst = Step('r', 0, grown, len(ids), len(ids) + 2)
    with pytest.raises(ValueError, match='decode burst of 2 steps'):
        runner.forward_logits(make_batch(slots, [burst], decode=True))


def test_padded_prefill_path_equals_the_eager_prefill_and_keeps_real_kv(
    tiny_model, prompt_builder
):
    prompts = [prompt(prompt_builder, t, s) for t, s in (('a', 51), ('bb', 52), ('ccc', 53))]
    cut = len(prompts[0][0]) - 5
    outputs = []
    for padded in (False, True):
        slots = PagedSlots(seed=11)
        runner = new_runner(
            tiny_model, slots, padded_prefill=padded, prefill_token_counts=(32, 256),
            prefill_max_requests=4,
        )  # fmt: skip
        assert (runner.prefill_graphs is not None) == padded
        # A chunk of one prompt, then its rest beside two whole prompts (a cached prefix).
        first = make_batch(slots, [Step('0', 0, prompts[0][0], 0, cut, (prompts[0][1],))])
        logits = [runner.forward_logits(first)]
        rest = [Step('0', 0, prompts[0][0], cut, len(prompts[0][0]), (prompts[0][1],))]
        rest += [
            Step(str(i), i, ids, 0, len(ids), (span,))
            for i, (ids, span) in enumerate(prompts[1:], start=1)
        ]
        logits.append(runner.forward_logits(make_batch(slots, rest)))
        lens = [len(ids) for ids, _ in prompts]
        kv = [
            runner.kv_caches[1][0][slots.req_to_token[i, :n].long()].clone()
            for i, n in enumerate(lens)
        ]
        outputs.append((logits, kv))
    (plain_logits, plain_kv), (padded_logits, padded_kv) = outputs
    for plain, padded in zip(plain_logits + plain_kv, padded_logits + padded_kv, strict=True):
        # Other shapes, so equal up to float32 rounding; a padding token writing a real
        # slot, or a padding request attending, would change them entirely.
        torch.testing.assert_close(padded, plain, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_triton_kernels_under_the_interpreter_match_the_torch_path(tiny_model, prompt_builder):
    ids, span = prompt(prompt_builder, 'go', 4)
    outputs = []
    for backend in ('torch', 'triton'):
        slots = PagedSlots(seed=7)
        runner = new_runner(
            tiny_model, slots, backend=backend, padded_decode=True, decode_batch_sizes=(1,)
        )
        cut = len(ids) - 3
        first = runner.forward_logits(make_batch(slots, [Step('r', 0, ids, 0, cut, (span,))]))
        rest = runner.forward_logits(make_batch(slots, [Step('r', 0, ids, cut, len(ids))]))
        grown = [*ids, 301]
        step = Step('r', 0, grown, len(ids), len(grown), sampling=ACTIONS)
        token = runner.launch(make_batch(slots, [step], decode=True)).result()
        outputs.append((torch.cat([first, rest]), token))
    assert float((outputs[0][0] - outputs[1][0]).abs().max()) <= 1e-4
    assert outputs[0][1] == outputs[1][1]


def test_idle_batch_returns_no_tokens(tiny_model):
    slots = PagedSlots()
    runner = new_runner(tiny_model, slots)
    empty = torch.zeros(0, dtype=torch.int64)
    batch = ForwardBatch(
        ForwardMode.IDLE, (), empty, empty, empty, empty, empty, empty, (), (), ()
    )
    assert runner.launch(batch).result().next_token_ids == ()


def test_cuda_graphs_are_refused_on_the_cpu(tiny_model):
    slots = PagedSlots()
    with pytest.raises(ValueError, match='CUDA graphs need'):
        new_runner(tiny_model, slots, cuda_graphs=True)


def _bad(batch: ForwardBatch, **changes) -> ForwardBatch:
    return dataclasses.replace(batch, **changes)


def test_bad_batches_fail_naming_the_request(tiny_model, prompt_builder):
    slots = PagedSlots()
    runner = new_runner(tiny_model, slots)
    ids, span = prompt(prompt_builder, 'go', 1)
    good = make_batch(slots, [Step('robot7', 0, ids, 0, len(ids), (span,))])
    wrong_slots = good.out_cache_loc.flip(0)
    with pytest.raises(ValueError, match='request robot7: out_cache_loc does not match'):
        runner.forward_logits(_bad(good, out_cache_loc=wrong_slots))
    slots.req_to_token[0, 3] = slots.num_slots + 5
    with pytest.raises(IndexError, match=r'request robot7: req_to_token\[0, 3\]'):
        runner.forward_logits(good)
    slots.req_to_token[0, 3] = good.out_cache_loc[3]
    text_ids = good.input_ids.clone()
    text_ids[span.token_offset] = 42
    with pytest.raises(ValueError, match=r'request robot7: positions .* image token 516'):
        runner.forward_logits(_bad(good, input_ids=text_ids))
    with pytest.raises(ValueError, match='request robot7: allowed tokens'):
        runner.launch(_bad(good, sampling=(SamplingParams(0, 600),)))
    gray = ImageInput(9, span.token_offset, span.num_tokens, random_image(1)[..., 0])
    with pytest.raises(ValueError, match='request robot7, image 9: image must have shape'):
        runner.forward_logits(_bad(good, images=((gray,),)))
    bad_ids = good.input_ids.clone()
    bad_ids[-1] = 520
    with pytest.raises(ValueError, match=r'request robot7: input id 520 outside \[0, 520\)'):
        runner.forward_logits(_bad(good, input_ids=bad_ids))
    with pytest.raises(IndexError, match='request robot7: req_pool_index 8 outside'):
        runner.forward_logits(_bad(good, req_pool_indices=torch.tensor([8])))
    short = dataclasses.replace(span, num_tokens=span.num_tokens - 1)
    with pytest.raises(ValueError, match=r'request robot7: the span of image 1 at tokens .* '
                       r'holds 15 tokens, but the model makes 16 image features'):  # fmt: skip
        runner.forward_logits(_bad(good, images=((short,),)))
    assert runner.forward_logits(good).shape == (len(ids), 520)  # the good batch still runs
