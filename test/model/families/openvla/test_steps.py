"""A step becomes one scheduler request: prompt, image span, action tokens, session prefix;
the longest step the engine accepts fits the request rows the engine sizes."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from vla_sched.core.memory.kv_memory import KVMemory
from vla_sched.core.scheduling.intake import RequestLimits, validate_new_request
from vla_sched.core.scheduling.scheduler_config import SchedulerConfig
from vla_sched.engine.assembly import kv_memory_config_for
from vla_sched.engine.checkpoints import open_served, resolve_checkpoint
from vla_sched.engine.config import EngineConfig
from vla_sched.ipc.messages import StepRequest
from vla_sched.model.config.checkpoint_spec import PromptTemplate
from vla_sched.model.families.images import image_content_hash
from vla_sched.model.families.openvla.family import serving_rules
from vla_sched.model.families.openvla.prompt import VLAPromptBuilder
from vla_sched.model.families.openvla.steps import StepTranslator
from vla_sched.model.layers.image_crop import center_crop_image


@pytest.fixture(scope='module')
def translator() -> StepTranslator:
    folder, _ = resolve_checkpoint('')
    return open_served(folder, EngineConfig()).translator


def _request(**kw) -> StepRequest:
    fields = dict(
        robot_id='arm', step_seq=3, stamp_ns=100, deadline_ns=900, received_ns=120,
        images=(np.full((6, 8, 3), 9, np.uint8),), state=np.zeros(7, np.float32),
        instruction='Open the drawer', instruction_version=4,
    )  # fmt: skip
    fields.update(kw)
    return StepRequest(**fields)


def test_the_request_carries_the_step_and_its_robot(translator):
    step = translator.translate(_request())
    req = step.req
    assert req.rid == 'arm/3'
    assert (req.robot_id, req.session_id, req.step_seq) == ('arm', 'arm', 3)
    assert (req.stamp_ns, req.deadline_ns, req.times.received_ns) == (100, 900, 120)
    assert req.max_new_tokens == translator.spec.num_action_tokens
    assert req.extra_key == translator.model_name
    start, end = translator.spec.action_token_range
    assert (req.sampling.allowed_token_start, req.sampling.allowed_token_end) == (start, end)
    assert step.instruction_version == 4


def test_the_prompt_is_the_template_and_the_image_span_is_keyed_by_the_pixels(translator):
    request = _request()
    step = translator.translate(request)
    layout = translator.prompts.build('Open the drawer')
    assert step.req.origin_input_ids == layout.token_ids
    (image,) = step.req.images
    assert (image.token_offset, image.num_tokens) == (layout.image_offset, 16)
    assert image.content_hash == image_content_hash(request.images[0])
    assert image.pixels is request.images[0]
    other = translator.translate(_request(images=(np.full((6, 8, 3), 10, np.uint8),)))
    assert other.req.images[0].content_hash != image.content_hash


def test_a_cropping_robots_frame_reaches_the_model_center_cropped_and_keyed_by_the_crop():
    folder, _ = resolve_checkpoint('')
    config = EngineConfig(robots={'cropped': {'center_crop': True}, 'plain': {}})
    translator = open_served(folder, config).translator
    frame = np.random.default_rng(0).integers(0, 256, (24, 32, 3), dtype=np.uint8)
    (cropped,) = translator.translate(_request(robot_id='cropped', images=(frame,))).req.images
    expected = center_crop_image(frame)
    assert cropped.pixels.shape == (224, 224, 3)
    np.testing.assert_array_equal(cropped.pixels, expected)
    assert cropped.content_hash == image_content_hash(expected)
    for robot_id in ('plain', 'unlisted'):
        (image,) = translator.translate(_request(robot_id=robot_id, images=(frame,))).req.images
        assert image.pixels is frame
        assert image.content_hash == image_content_hash(frame)


def test_the_session_prefix_is_the_instruction_part_in_the_model_namespace(translator):
    step = translator.translate(_request())
    layout = translator.prompts.build('Open the drawer')
    prefix = layout.token_ids[: layout.session_prefix_len]
    assert step.session_prefix.token_ids.tolist() == list(prefix)
    assert step.session_prefix_ids == prefix
    assert step.session_prefix.extra_key == translator.model_name
    assert step.req.kv.key.starts_with(step.session_prefix)


def test_whole_vocab_decoding_samples_from_the_whole_vocabulary(translator):
    whole = StepTranslator(
        translator.spec, translator.prompts, model_name='m', whole_vocab=True
    ).translate(_request())
    vocab = translator.spec.decoder.vocab_size
    assert (whole.req.sampling.allowed_token_start, whole.req.sampling.allowed_token_end) == (
        0,
        vocab,
    )
    assert whole.req.extra_key == 'm' and whole.session_prefix.extra_key == 'm'


def test_the_state_enters_the_prompt_only_when_the_template_has_state_tokens(translator):
    spec = dataclasses.replace(translator.spec, prompt=PromptTemplate(state_tokens=True))
    prompts = VLAPromptBuilder(spec, translator.prompts.tokenizer, bos_token_id=1)
    with_state = StepTranslator(spec, prompts, model_name='m', whole_vocab=False)
    low = with_state.translate(_request(state=np.full(7, -1.0, np.float32)))
    high = with_state.translate(_request(state=np.full(7, 1.0, np.float32)))
    assert low.req.origin_input_ids != high.req.origin_input_ids
    assert len(low.req.origin_input_ids) == len(high.req.origin_input_ids)
    a = translator.translate(_request(state=np.full(7, -1.0, np.float32)))
    b = translator.translate(_request(state=np.full(7, 1.0, np.float32)))
    assert a.req.origin_input_ids == b.req.origin_input_ids


def test_image_hash_tells_frames_apart_and_matches_equal_frames():
    a = np.zeros((4, 4, 3), np.uint8)
    b = a.copy()
    b[3, 3, 2] = 1
    assert image_content_hash(a) == image_content_hash(a.copy())
    assert image_content_hash(a) != image_content_hash(b)
    assert image_content_hash(a) != image_content_hash(np.zeros((2, 8, 3), np.uint8))
    assert 0 <= image_content_hash(b) < 2**63


@pytest.mark.parametrize('state_tokens', [False, True])
def test_the_longest_accepted_instruction_fits_the_engines_request_rows(translator, state_tokens):
    spec = dataclasses.replace(translator.spec, prompt=PromptTemplate(state_tokens=state_tokens))
    prompts = VLAPromptBuilder(spec, translator.prompts.tokenizer, bos_token_id=1)
    config = EngineConfig(max_instruction_bytes=100, max_running_requests=2, page_size=16)
    limits = RequestLimits.of(KVMemory(kv_memory_config_for(config, serving_rules(spec))))
    # One token per byte: the tiny checkpoint's tokenizer merges nothing in this text.
    step = StepTranslator(spec, prompts, model_name='m', whole_vocab=False).translate(
        _request(instruction='q' * 100)
    )
    assert len(step.req.origin_input_ids) >= 100 + spec.num_image_tokens
    assert validate_new_request(step.req, config=SchedulerConfig(), limits=limits) is None
