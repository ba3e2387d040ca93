"""The padded prefill path at every size: a prefill past its largest prepared size or
request count runs in pieces, decode steps past the decode path run on it, and the runner
counts each path's real and padding work."""

from __future__ import annotations

import pytest
import torch
from model_testing import PagedSlots, Step, make_batch, random_image

from vla_sched.core.forward_batch import FUTURE_TOKEN_ID, ImageInput, SamplingParams
from vla_sched.model.runner.model_runner import ModelRunner, RunnerConfig
from vla_sched.model.runner.padding_stats import PaddingStats

ACTIONS = SamplingParams(260, 516)


def _runner(model, slots: PagedSlots, **config) -> ModelRunner:
    return ModelRunner(
        model,
        req_to_token=slots.req_to_token,
        num_kv_slots=slots.num_slots,
        config=RunnerConfig(**config),
    )


def _prompt(builder, text: str, seed: int) -> tuple[list[int], ImageInput]:
    layout = builder.build(text)
    span = ImageInput(seed, layout.image_offset, layout.num_image_tokens, random_image(seed))
    return list(layout.token_ids), span


def _kv(runner: ModelRunner, slots: PagedSlots, lens: list[int]) -> list[torch.Tensor]:
    rows = torch.cat([slots.req_to_token[i, :n] for i, n in enumerate(lens)]).long()
    return [cache[rows].clone() for layer in runner.kv_caches for cache in layer]


def test_a_prefill_past_the_largest_size_runs_in_pieces_that_equal_the_plain_path(
    tiny_model, prompt_builder
):
    prompts = [_prompt(prompt_builder, t, s) for t, s in (('a', 61), ('bb', 62), ('ccc', 63))]
    lens = [len(ids) for ids, _ in prompts]
    outputs = []
    for padded in (False, True):
        slots = PagedSlots(seed=13)
        config = {'padded_prefill': True, 'prefill_token_counts': (16, 48)} if padded else {}
        runner = _runner(tiny_model, slots, **config)
        steps = [
            Step(str(i), i, ids, 0, len(ids), (span,)) for i, (ids, span) in enumerate(prompts)
        ]
        logits = runner.forward_logits(make_batch(slots, steps))
        outputs.append((logits, _kv(runner, slots, lens), runner.padding_stats()['prefill']))
    (plain, plain_kv, eager), (pieces, pieces_kv, padded_stats) = outputs
    # Pieces cut through prompts and their images: other shapes, so equal up to float32
    # rounding; a token missing its request's earlier piece would differ entirely.
    torch.testing.assert_close(pieces, plain, rtol=1e-5, atol=1e-5)
    for a, b in zip(pieces_kv, plain_kv, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    num_tokens = sum(lens)  # 198: four full pieces of 48, then 6 tokens padded to 16
    assert num_tokens == 198
    assert padded_stats == PaddingStats(num_padded_runs=5, num_real=198, num_padding=10)
    assert eager == PaddingStats(num_eager_runs=1, num_eager=198)


def test_a_mixed_pass_split_by_request_count_equals_separate_plain_passes(
    tiny_model, prompt_builder
):
    running = [_prompt(prompt_builder, t, s) for t, s in (('go', 71), ('stop', 72), ('up', 73))]
    new_ids, new_span = _prompt(prompt_builder, 'pick it up', 74)
    results = {}
    for mixed in (False, True):
        slots = PagedSlots(seed=14)
        config = (
            {'padded_prefill': True, 'prefill_token_counts': (16, 128), 'prefill_max_requests': 2}
            if mixed
            else {}
        )
        runner = _runner(tiny_model, slots, **config)
        prefill = [
            Step(f'r{i}', i, ids, 0, len(ids), (span,), sampling=ACTIONS)
            for i, (ids, span) in enumerate(running)
        ]
        first = runner.launch(make_batch(slots, prefill)).result().next_token_ids
        grown = [[*ids, t] for (ids, _), t in zip(running, first, strict=True)]
        new = Step('new', 3, new_ids, 0, len(new_ids), (new_span,), sampling=ACTIONS)
        if mixed:
            # the overlap loop's form: each running request's input is the token it sampled
            decode = [
                Step(f'r{i}', i, [*g[:-1], FUTURE_TOKEN_ID], len(g) - 1, len(g), sampling=ACTIONS)
                for i, g in enumerate(grown)
            ]
            batch = make_batch(slots, [new, *decode])
            before = runner.padding_stats()['prefill']
            # logits first: they sample nothing, so the launch resolves the same inputs
            logits = runner.forward_logits(batch)
            tokens = runner.launch(batch).result().next_token_ids
            new_logits, decode_logits = logits[len(new_ids) - 1], logits[len(new_ids) :]
            # each pass: the prompt and one row in a piece of 128, two rows in one of 16
            pieces = runner.padding_stats()['prefill'].since(before)
            assert (pieces.num_padded_runs, pieces.num_padding) == (4, 2 * (128 - 75 + 14))
        else:
            decode = [
                Step(f'r{i}', i, g, len(g) - 1, len(g), sampling=ACTIONS)
                for i, g in enumerate(grown)
            ]
            new_tokens = runner.launch(make_batch(slots, [new])).result().next_token_ids
            decode_tokens = runner.launch(make_batch(slots, decode, decode=True)).result()
            tokens = new_tokens + decode_tokens.next_token_ids
            new_logits = runner.forward_logits(make_batch(slots, [new]))[-1]
            decode_logits = runner.forward_logits(make_batch(slots, decode))
        kv = _kv(runner, slots, [len(g) for g in grown] + [len(new_ids)])
        results[mixed] = (tokens, new_logits, decode_logits, kv)
    separate, together = results[False], results[True]
    assert together[0] == separate[0]
    torch.testing.assert_close(together[1], separate[1], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(together[2], separate[2], rtol=1e-4, atol=1e-4)
    for a, b in zip(together[3], separate[3], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_a_decode_step_past_the_decode_sizes_runs_on_the_prefill_path(tiny_model, prompt_builder):
    prompts = [_prompt(prompt_builder, t, s) for t, s in (('a', 81), ('b', 82), ('c', 83))]
    outputs = []
    for padded in (False, True):
        slots = PagedSlots(seed=15)
        config = {}
        if padded:
            config = {'padded_decode': True, 'decode_batch_sizes': (2,), 'padded_prefill': True,
                      'prefill_token_counts': (4, 256)}  # fmt: skip
        runner = _runner(tiny_model, slots, **config)
        steps = [
            Step(str(i), i, ids, 0, len(ids), (span,), sampling=ACTIONS)
            for i, (ids, span) in enumerate(prompts)
        ]
        first = runner.launch(make_batch(slots, steps)).result().next_token_ids
        grown = [[*ids, t] for (ids, _), t in zip(prompts, first, strict=True)]
        decode = [
            Step(str(i), i, g, len(g) - 1, len(g), sampling=ACTIONS) for i, g in enumerate(grown)
        ]
        tokens = runner.launch(make_batch(slots, decode, decode=True)).result().next_token_ids
        outputs.append((tokens, runner.padding_stats()))
    (plain_tokens, plain_stats), (tokens, stats) = outputs
    assert tokens == plain_tokens
    assert stats['decode'] == PaddingStats()  # 3 rows: past the decode path's 2
    assert stats['prefill'].num_padded_runs == 2  # the prompts, then the 3 decode rows at 4
    assert (stats['prefill'].num_real, stats['prefill'].num_padding) == (
        sum(len(g) for g in grown),
        256 - sum(len(ids) for ids, _ in prompts) + 1,
    )
    assert plain_stats['decode'] == PaddingStats(num_eager_runs=1, num_eager=3)


def test_the_runner_counts_real_and_padding_work_per_path(tiny_model, prompt_builder):
    prompts = [_prompt(prompt_builder, t, s) for t, s in (('a', 91), ('b', 92), ('c', 93))]
    slots = PagedSlots(seed=16)
    runner = _runner(
        tiny_model, slots, padded_decode=True, decode_batch_sizes=(2, 4), padded_vision=True,
        vision_batch_sizes=(2, 4), padded_prefill=True, prefill_token_counts=(64, 256),
    )  # fmt: skip
    assert set(runner.padding_stats()) == {'decode', 'prefill', 'vision'}
    steps = [
        Step(str(i), i, ids, 0, len(ids), (span,), sampling=ACTIONS)
        for i, (ids, span) in enumerate(prompts)
    ]
    first = runner.launch(make_batch(slots, steps)).result().next_token_ids
    before = runner.padding_stats()
    grown = [[*ids, t] for (ids, _), t in zip(prompts, first, strict=True)]
    decode = [Step(str(i), i, g, len(g) - 1, len(g)) for i, g in enumerate(grown)]
    runner.launch(make_batch(slots, decode, decode=True)).result()
    after = runner.padding_stats()
    num_tokens = sum(len(ids) for ids, _ in prompts)
    assert before['prefill'] == PaddingStats(
        num_padded_runs=1, num_real=num_tokens, num_padding=256 - num_tokens
    )
    assert before['vision'] == PaddingStats(num_padded_runs=1, num_real=3, num_padding=1)
    assert after['decode'].since(before['decode']) == PaddingStats(
        num_padded_runs=1, num_real=3, num_padding=1
    )
    assert after['decode'].padding_share == 0.25
    assert after['prefill'] == before['prefill'] and after['vision'] == before['vision']


@pytest.mark.slow
def test_triton_pieces_under_the_interpreter_match_the_plain_torch_path(
    tiny_model, prompt_builder
):
    prompts = [_prompt(prompt_builder, 'go', 101)]
    lens = [len(ids) for ids, _ in prompts]
    triton_pieces = {
        'backend': 'triton',
        'padded_prefill': True,
        'prefill_token_counts': (24, 48),
        'prefill_max_requests': 1,  # a small grid: the interpreter runs every program
    }
    outputs = []
    for config in ({'backend': 'torch'}, triton_pieces):
        slots = PagedSlots(seed=17)
        runner = _runner(tiny_model, slots, **config)
        steps = [
            Step(str(i), i, ids, 0, len(ids), (span,)) for i, (ids, span) in enumerate(prompts)
        ]
        logits = runner.forward_logits(make_batch(slots, steps))
        outputs.append((logits, _kv(runner, slots, lens), runner.padding_stats()['prefill']))
    (plain, plain_kv, _), (pieces, pieces_kv, stats) = outputs
    # 66 tokens: 48, then 18 on a prefix of 48 (through the image), padded to 24
    assert (stats.num_padded_runs, stats.num_padding) == (2, 6)
    assert float((pieces - plain).abs().max()) <= 1e-4
    for a, b in zip(pieces_kv, plain_kv, strict=True):
        assert float((a - b).abs().max()) <= 1e-4
