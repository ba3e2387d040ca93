"""Shared fixtures: one tiny checkpoint, loaded once by us and once by transformers."""

from __future__ import annotations

import pytest
import torch

from vla_sched.model.families.openvla.prompt import VLAPromptBuilder
from vla_sched.model.loading.checkpoint import load_checkpoint
from vla_sched.model.loading.tiny_checkpoint import build_tiny_checkpoint


@pytest.fixture(scope='session')
def tiny_dir(tmp_path_factory):
    return build_tiny_checkpoint(tmp_path_factory.mktemp('tiny_vla'), seed=0)


@pytest.fixture(scope='session')
def tiny_model(tiny_dir):
    return load_checkpoint(tiny_dir, dtype=torch.float32)


@pytest.fixture(scope='session')
def prompt_builder(tiny_dir, tiny_model):
    return VLAPromptBuilder.from_checkpoint(tiny_dir, tiny_model.spec)


@pytest.fixture(scope='session')
def hf_model(tiny_dir):
    from transformers import LlavaForConditionalGeneration

    model, info = LlavaForConditionalGeneration.from_pretrained(
        tiny_dir, dtype=torch.float32, output_loading_info=True
    )
    assert not info['missing_keys'] and not info['unexpected_keys'], info
    return model.eval()
