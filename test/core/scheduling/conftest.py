"""Fixtures of every scheduler test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True, scope='module')
def single_torch_thread() -> Iterator[None]:
    """Tiny CPU tensor ops are far slower with an intra-op thread pool on a busy machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
