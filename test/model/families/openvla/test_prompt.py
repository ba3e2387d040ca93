"""The prompt builder the engine uses: token layout, session prefix, image span, state."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np
import pytest

from vla_sched.model.config.checkpoint_spec import PromptTemplate
from vla_sched.model.families.openvla.prompt import VLAPromptBuilder


def test_prompt_is_bos_instruction_image_then_suffix(prompt_builder):
    layout = prompt_builder.build('Pick up the cube')
    ids = list(layout.token_ids)
    prefix = prompt_builder.encode_text(
        'In: What action should the robot take to pick up the cube?\n'
    )
    assert ids[0] == 1  # <s>
    assert ids[1 : layout.session_prefix_len] == prefix
    assert layout.image_offset == layout.session_prefix_len
    assert ids[layout.image_offset : layout.image_end] == [516] * 16
    assert ids[layout.image_end :] == prompt_builder.encode_text('Out:')


def test_session_prefix_depends_only_on_the_instruction(prompt_builder):
    a = prompt_builder.build('open the drawer')
    b = prompt_builder.build('open the drawer')
    c = prompt_builder.build('close the drawer')
    n = a.session_prefix_len
    assert a.token_ids[:n] == b.token_ids[:n]
    assert a.token_ids[:n] != c.token_ids[: c.session_prefix_len]


def test_builder_reports_what_the_engine_needs(prompt_builder):
    assert prompt_builder.num_image_tokens == 16
    assert prompt_builder.action_token_range == (260, 516)
    assert (prompt_builder.action_horizon, prompt_builder.action_dim) == (1, 7)


def test_image_first_template_puts_the_image_right_after_bos(prompt_builder):
    spec = dataclasses.replace(
        prompt_builder.spec, prompt=PromptTemplate(image_first=True, suffix='')
    )
    builder = VLAPromptBuilder(spec, prompt_builder.tokenizer, bos_token_id=1)
    layout = builder.build('wave')
    assert layout.image_offset == 1 and layout.session_prefix_len == 1
    assert layout.token_ids[1:17] == (516,) * 16


def test_state_tokens_are_binned_with_the_proprio_statistics(prompt_builder):
    spec = dataclasses.replace(prompt_builder.spec, prompt=PromptTemplate(state_tokens=True))
    builder = VLAPromptBuilder(spec, prompt_builder.tokenizer, bos_token_id=1)
    state = np.array([-1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0])
    layout = builder.build('wave', state=state)
    state_ids = layout.token_ids[layout.image_end : layout.image_end + 7]
    assert state_ids[:3] == (515, 260, 388)  # same bins as actions: -1, +1, 0
    with pytest.raises(ValueError, match='needs the joint state'):
        builder.build('wave')


def test_prompt_modules_import_without_torch_or_transformers():
    import subprocess

    code = (
        'import sys, vla_sched.model.families.openvla.prompt;'
        'import vla_sched.model.families.openvla.action_tokenizer;'
        'print("torch" in sys.modules, "transformers" in sys.modules)'
    )
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, '-c', code], capture_output=True, text=True, check=True, cwd=root
    )
    assert out.stdout.split() == ['False', 'False']


# --- OpenVLA folders: the ids of OpenVLA's processor and predict_action -------------------

OPENVLA_SPACE_ID = 29871  # Llama 2's bare '▁' piece


@pytest.fixture(scope='module')
def llama_tokenizer():
    import tokenizers

    from vla_sched.testing.llama_tokenizer_files import llama_like_tokenizer_json

    return tokenizers.Tokenizer.from_str(llama_like_tokenizer_json())


def _openvla_builder(tokenizer, variant: str, prompt: PromptTemplate | None = None):
    from vla_sched.model.config.formats import spec_from_dicts
    from vla_sched.model.config.presets import openvla_config, openvla_norm_stats

    spec = spec_from_dicts(openvla_config(variant, tiny=True), {}, openvla_norm_stats())
    if prompt is not None:
        spec = dataclasses.replace(spec, prompt=prompt)
    return VLAPromptBuilder(spec, tokenizer, bos_token_id=1)


def _reference_ids(tokenizer, prompt: str, num_image_tokens: int, image_id: int) -> list[int]:
    """OpenVLA's procedure: the whole prompt tokenized with BOS, the image right after BOS,
    then 29871 appended unless the prompt already ends with it."""
    ids = list(tokenizer.encode(prompt, add_special_tokens=True).ids)
    assert ids[0] == 1
    ids = ids[:1] + [image_id] * num_image_tokens + ids[1:]
    if ids[-1] != OPENVLA_SPACE_ID:
        ids.append(OPENVLA_SPACE_ID)
    return ids


V01_SYSTEM = (
    'A chat between a curious user and an artificial intelligence assistant. The assistant '
    "gives helpful, detailed, and polite answers to the user's questions."
)
INSTRUCTIONS = ('Pick up the Red block', 'put the cup into the sink!', 'wipe: table, 2x Ünï')


@pytest.mark.parametrize('instruction', INSTRUCTIONS)
def test_openvla_prompt_ids_equal_openvlas_processor_and_predict_action(
    llama_tokenizer, instruction
):
    builder = _openvla_builder(llama_tokenizer, 'fused')
    text = f'In: What action should the robot take to {instruction.lower()}?\nOut:'
    layout = builder.build(instruction)
    assert list(layout.token_ids) == _reference_ids(llama_tokenizer, text, 256, 32000)
    assert (layout.image_offset, layout.num_image_tokens, layout.session_prefix_len) == (1, 256, 1)


@pytest.mark.parametrize('instruction', INSTRUCTIONS)
def test_openvla_v01_prompt_ids_equal_the_v01_chat_prompt(llama_tokenizer, instruction):
    builder = _openvla_builder(llama_tokenizer, 'v01')
    text = (
        f'{V01_SYSTEM} USER: What action should the robot take to {instruction.lower()}? '
        'ASSISTANT:'
    )
    layout = builder.build(instruction)
    assert list(layout.token_ids) == _reference_ids(llama_tokenizer, text, 256, 32000)


def test_appended_space_token_is_not_doubled_when_the_prompt_ends_with_it(llama_tokenizer):
    template = PromptTemplate(
        prefix='Do {instruction} ', suffix='', image_first=True, append_token_id=OPENVLA_SPACE_ID
    )
    builder = _openvla_builder(llama_tokenizer, 'fused', template)
    layout = builder.build('wave')
    assert layout.token_ids[-1] == OPENVLA_SPACE_ID != layout.token_ids[-2]
    assert list(layout.token_ids) == _reference_ids(llama_tokenizer, 'Do wave ', 256, 32000)


def test_template_without_append_token_ends_with_its_text(prompt_builder):
    layout = prompt_builder.build('wave')
    assert prompt_builder.spec.prompt.append_token_id is None
    assert list(layout.token_ids[layout.image_end :]) == prompt_builder.encode_text('Out:')


def test_append_token_id_is_read_from_a_prompt_mapping():
    template = PromptTemplate.from_mapping({'append_token_id': 29871, 'suffix': ''})
    assert template.append_token_id == 29871
    with pytest.raises(ValueError, match='append_token_id'):
        PromptTemplate(append_token_id=-1)
