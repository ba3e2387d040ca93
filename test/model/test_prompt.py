"""The prompt builder the engine uses: token layout, session prefix, image span, state."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np
import pytest

from vla_sched.model.checkpoint_spec import PromptTemplate
from vla_sched.model.prompt import VLAPromptBuilder


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
        'import sys, vla_sched.model.prompt, vla_sched.model.action_tokenizer;'
        'print("torch" in sys.modules, "transformers" in sys.modules)'
    )
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, '-c', code], capture_output=True, text=True, check=True, cwd=root
    )
    assert out.stdout.split() == ['False', 'False']
