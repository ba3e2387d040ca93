"""A mixed pass (a prefill with running requests' one-token decodes as extra rows) computes
what the separate prefill and decode passes compute."""

from __future__ import annotations

import torch
from model_testing import PagedSlots, Step, make_batch, random_image

from vla_sched.core.forward_batch import ImageInput
from vla_sched.model.runner.model_runner import ModelRunner, RunnerConfig


def _runner(model, slots: PagedSlots) -> ModelRunner:
    return ModelRunner(
        model, req_to_token=slots.req_to_token, num_kv_slots=slots.num_slots, config=RunnerConfig()
    )


def _prompt(builder, text: str, seed: int) -> tuple[list[int], ImageInput]:
    layout = builder.build(text)
    span = ImageInput(seed, layout.image_offset, layout.num_image_tokens, random_image(seed))
    return list(layout.token_ids), span


def test_a_mixed_pass_gives_the_logits_and_kv_of_separate_prefill_and_decode_passes(
    tiny_model, prompt_builder
):
    running = [_prompt(prompt_builder, text, seed) for text, seed in (('go', 51), ('stop', 52))]
    new_ids, new_span = _prompt(prompt_builder, 'pick it up', 53)
    results = {}
    for mixed in (False, True):
        slots = PagedSlots(seed=3)
        runner = _runner(tiny_model, slots)
        prefill = [
            Step(f'r{i}', i, ids, 0, len(ids), (span,)) for i, (ids, span) in enumerate(running)
        ]
        first = runner.launch(make_batch(slots, prefill)).result().next_token_ids
        grown = [[*ids, t] for (ids, _), t in zip(running, first, strict=True)]
        # decode rows carry their prompt's image, as the scheduler's do: outside the range
        decode = [
            Step(f'r{i}', i, g, len(g) - 1, len(g), (running[i][1],)) for i, g in enumerate(grown)
        ]
        new = Step('new', 2, new_ids, 0, len(new_ids), (new_span,))
        if mixed:
            logits = runner.forward_logits(make_batch(slots, [new, *decode]))
            new_logits, decode_logits = logits[len(new_ids) - 1], logits[len(new_ids) :]
        else:
            new_logits = runner.forward_logits(make_batch(slots, [new]))[-1]
            decode_logits = runner.forward_logits(make_batch(slots, decode, decode=True))
        rows = [slots.req_to_token[i, : len(g)] for i, g in enumerate(grown)]
        rows.append(slots.req_to_token[2, : len(new_ids)])
        kv = [cache[torch.cat(rows).long()] for layer in runner.kv_caches for cache in layer]
        results[mixed] = (new_logits, decode_logits, kv)
    separate, together = results[False], results[True]
    torch.testing.assert_close(together[0], separate[0], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(together[1], separate[1], rtol=1e-4, atol=1e-4)
    for a, b in zip(together[2], separate[2], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
