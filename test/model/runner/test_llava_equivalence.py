"""Our paged forward against transformers' own LLaVA forward on the same tiny checkpoint."""

from __future__ import annotations

import pytest
import torch
from model_testing import PagedSlots, Step, make_batch, random_image

from vla_sched.core.forward_batch import ImageInput, SamplingParams
from vla_sched.model.families.openvla.prompt import VLAPromptBuilder
from vla_sched.model.layers.vision import preprocess_image
from vla_sched.model.loading.checkpoint import load_checkpoint
from vla_sched.model.loading.tiny_checkpoint import build_tiny_checkpoint
from vla_sched.model.runner.model_runner import ModelRunner, RunnerConfig

TOLERANCE = 1e-4


def hf_logits(hf_model, token_ids, image, model) -> torch.Tensor:
    """transformers' logits [T, V] for a whole sequence with one image."""
    pixels = preprocess_image(image, model.spec.preprocessing)[None]
    with torch.no_grad():
        out = hf_model(input_ids=torch.tensor([list(token_ids)]), pixel_values=pixels)
    return out.logits[0].float()


def prompt_with_image(builder, instruction, seed):
    layout = builder.build(instruction)
    image = random_image(seed)
    span = ImageInput(seed, layout.image_offset, layout.num_image_tokens, image)
    return list(layout.token_ids), span, image


def new_runner(model, slots, **config):
    return ModelRunner(
        model,
        req_to_token=slots.req_to_token,
        num_kv_slots=slots.num_slots,
        config=RunnerConfig(**config),
    )


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape
    return float((a - b).abs().max())


def test_whole_prompt_logits_equal_transformers(tiny_model, hf_model, prompt_builder):
    ids, span, image = prompt_with_image(prompt_builder, 'Pick up the red block', seed=1)
    slots = PagedSlots(seed=1)
    runner = new_runner(tiny_model, slots)
    batch = make_batch(slots, [Step('r0', 3, ids, 0, len(ids), (span,))])
    ours = runner.forward_logits(batch)
    ref = hf_logits(hf_model, ids, image, tiny_model)
    assert float(ref.std()) > 0.3  # logits carry signal, so the bound means something
    assert max_diff(ours, ref) <= TOLERANCE


def test_cached_prefix_then_chunk_through_the_image_equals_transformers(
    tiny_model, hf_model, prompt_builder
):
    ids, span, image = prompt_with_image(prompt_builder, 'open the drawer', seed=2)
    ref = hf_logits(hf_model, ids, image, tiny_model)
    slots = PagedSlots(seed=2)
    runner = new_runner(tiny_model, slots)
    cut = span.token_offset + 5  # the first chunk ends inside the image span
    first = make_batch(slots, [Step('r0', 0, ids, 0, cut, (span,), sample=False)])
    assert max_diff(runner.forward_logits(first), ref[:cut]) <= TOLERANCE
    second = make_batch(slots, [Step('r0', 0, ids, cut, len(ids), (span,))])
    assert max_diff(runner.forward_logits(second), ref[cut:]) <= TOLERANCE
    assert runner.feature_cache.num_hits == 1  # the image was encoded once


def test_token_by_token_decode_on_shuffled_pages_equals_transformers(
    tiny_model, hf_model, prompt_builder
):
    ids, span, image = prompt_with_image(prompt_builder, 'wipe the table', seed=3)
    slots = PagedSlots(seed=3, page_size=4)
    runner = new_runner(tiny_model, slots)
    start, end = prompt_builder.action_token_range
    runner.forward_logits(make_batch(slots, [Step('r0', 5, ids, 0, len(ids), (span,))]))
    pages = slots.req_to_token[5, : len(ids)] // slots.page_size
    assert not torch.equal(pages.sort().values, pages)  # pages really are out of order
    for _ in range(6):
        ref = hf_logits(hf_model, ids, image, tiny_model)[-1]
        ids = [*ids, int(torch.argmax(ref[start:end])) + start]
        batch = make_batch(slots, [Step('r0', 5, ids, len(ids) - 1, len(ids))], decode=True)
        ours = runner.forward_logits(batch)[0]
        ref_next = hf_logits(hf_model, ids, image, tiny_model)[-1]
        assert max_diff(ours, ref_next) <= TOLERANCE


def test_mixed_batch_of_requests_at_different_positions_equals_transformers(
    tiny_model, hf_model, prompt_builder
):
    prompts = [
        prompt_with_image(prompt_builder, text, seed)
        for text, seed in (('stack the cups', 4), ('push the button', 5), ('close the lid', 6))
    ]
    refs = [hf_logits(hf_model, ids, image, tiny_model) for ids, _, image in prompts]
    slots = PagedSlots(seed=4)
    runner = new_runner(tiny_model, slots)
    (a, span_a, _), (b, span_b, _), (c, span_c, _) = prompts
    cut_c = span_c.token_offset + 3
    runner.forward_logits(make_batch(slots, [Step('b', 1, b, 0, len(b) - 1, (span_b,))]))
    runner.forward_logits(make_batch(slots, [Step('c', 2, c, 0, cut_c, (span_c,))]))
    mixed = make_batch(
        slots,
        [
            Step('a', 0, a, 0, len(a), (span_a,)),  # whole prompt
            Step('b', 1, b, len(b) - 1, len(b), (span_b,)),  # one token on a long prefix
            Step('c', 2, c, cut_c, len(c), (span_c,)),  # rest of a chunked prompt
        ],
    )
    ours = runner.forward_logits(mixed)
    expected = torch.cat([refs[0], refs[1][-1:], refs[2][cut_c:]])
    assert max_diff(ours, expected) <= TOLERANCE
    extended = [[*ids, 300 + k] for k, (ids, _, _) in enumerate(prompts)]
    decode = make_batch(
        slots,
        [
            Step(rid, row, ids, len(ids) - 1, len(ids))
            for rid, row, ids in zip('abc', (0, 1, 2), extended, strict=True)
        ],
        decode=True,
    )
    ours = runner.forward_logits(decode)
    for k, (ids, (_, _, image)) in enumerate(zip(extended, prompts, strict=True)):
        assert max_diff(ours[k], hf_logits(hf_model, ids, image, tiny_model)[-1]) <= TOLERANCE


VARIANTS = {
    'llama3_rope': {
        'rope_parameters': {
            'rope_type': 'llama3',
            'factor': 8.0,
            'low_freq_factor': 1.0,
            'high_freq_factor': 4.0,
            'original_max_position_embeddings': 64,
            'rope_theta': 500000.0,
        }
    },
    'linear_rope': {'rope_parameters': {'rope_type': 'linear', 'factor': 2.0}},
    'qwen2_attention_bias': {'text_model_type': 'qwen2'},
    'tied_embeddings': {'tie_word_embeddings': True},
}


@pytest.mark.parametrize('variant', sorted(VARIANTS))
def test_decoder_variants_equal_transformers(tmp_path, variant):
    from transformers import LlavaForConditionalGeneration

    folder = build_tiny_checkpoint(tmp_path, seed=7, **VARIANTS[variant])
    model = load_checkpoint(folder)
    hf = LlavaForConditionalGeneration.from_pretrained(folder, dtype=torch.float32).eval()
    builder = VLAPromptBuilder.from_checkpoint(folder, model.spec)
    ids, span, image = prompt_with_image(builder, 'fold the towel', seed=8)
    slots = PagedSlots(seed=8)
    runner = new_runner(model, slots)
    cut = len(ids) - 4
    ours = runner.forward_logits(make_batch(slots, [Step('r', 0, ids, 0, cut, (span,))]))
    ours = torch.cat(
        [ours, runner.forward_logits(make_batch(slots, [Step('r', 0, ids, cut, len(ids))]))]
    )
    assert max_diff(ours, hf_logits(hf, ids, image, model)) <= TOLERANCE


def test_greedy_action_tokens_equal_transformers_generate(tiny_model, hf_model, prompt_builder):
    ids, span, image = prompt_with_image(prompt_builder, 'lift the lid', seed=9)
    start, end = prompt_builder.action_token_range
    num_tokens = prompt_builder.num_action_tokens
    pixels = preprocess_image(image, tiny_model.spec.preprocessing)[None]
    outside = [t for t in range(tiny_model.spec.decoder.vocab_size) if not start <= t < end]
    generated = hf_model.generate(
        input_ids=torch.tensor([ids]),
        pixel_values=pixels,
        max_new_tokens=num_tokens,
        do_sample=False,
        suppress_tokens=outside,
    )[0, len(ids) :].tolist()
    slots = PagedSlots(seed=9)
    runner = new_runner(tiny_model, slots)
    sampling = SamplingParams(start, end)
    tokens = []
    batch = make_batch(slots, [Step('r', 0, ids, 0, len(ids), (span,), sampling=sampling)])
    while len(tokens) < num_tokens:
        tokens.append(runner.launch(batch).result().next_token_ids[0])
        ids = [*ids, tokens[-1]]
        step = Step('r', 0, ids, len(ids) - 1, len(ids), sampling=sampling)
        batch = make_batch(slots, [step], decode=True)
    assert tokens == generated
    assert all(start <= t < end for t in tokens)
