"""Every family counts an instruction's tokens as its steps' prompts hold them, so the engine
can bound instructions in tokens without knowing the family."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from vla_sched.engine.checkpoints import open_served
from vla_sched.engine.config import EngineConfig
from vla_sched.ipc.messages import StepRequest
from vla_sched.testing.openvla_oft_writer import write_openvla_oft_checkpoint
from vla_sched.testing.openvla_writer import write_openvla_checkpoint
from vla_sched.testing.pi0_writer import TOKENIZER_SUBFOLDER, write_pi0_checkpoint

SHORT = 'open the drawer'
LONG = 'put the red block in the bowl 🍎🍎 放进碗里'  # within pi0's truncation length


def _openvla(root):
    return EngineConfig(model_path=str(write_openvla_checkpoint(root / 'tiny-openvla')))


def _oft(root):
    folder = write_openvla_oft_checkpoint(root / 'tiny-oft', seed=3)
    return EngineConfig(model_path=str(folder), oft_preset='libero')


def _pi0(root):
    folder = write_pi0_checkpoint(root / 'tiny-pi0', policy_type='pi0', tokenizer=True)
    return EngineConfig(
        model_path=str(folder), pi0_tokenizer_path=str(folder / TOKENIZER_SUBFOLDER)
    )


@pytest.fixture(scope='module', params=[_openvla, _oft, _pi0], ids=['openvla', 'oft', 'pi0'])
def served(request, tmp_path_factory):
    config = request.param(tmp_path_factory.mktemp(request.param.__name__))
    return open_served(Path(config.model_path), config)


def _step(served, instruction: str) -> StepRequest:
    shape = served.shape
    now = time.time_ns()
    return StepRequest(
        robot_id='arm', step_seq=1, stamp_ns=now, deadline_ns=now + 10**9, received_ns=now,
        images=tuple(np.zeros((32, 32, 3), np.uint8) for _ in range(shape.num_images)),
        state=np.zeros(shape.num_state, np.float32), instruction=instruction,
        instruction_version=1,
    )  # fmt: skip


def _prompt_len(served, instruction: str) -> int:
    return len(served.translate(_step(served, instruction)).req.origin_input_ids)


def test_an_instructions_count_is_what_it_adds_to_its_steps_sequence(served):
    short, long = served.instruction_tokens(SHORT), served.instruction_tokens(LONG)
    assert 0 < short < long
    grown = _prompt_len(served, LONG) - _prompt_len(served, SHORT)
    assert abs(grown - (long - short)) <= 1  # a merge across the template's edge at most


def test_text_that_tokenizes_long_counts_more_tokens_than_characters(served):
    emoji = '🍎' * 20
    assert served.instruction_tokens(emoji) > len(emoji)
