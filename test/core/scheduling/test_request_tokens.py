"""Req: prompt and outputs read as one token sequence, and outputs reach the radix key."""

from __future__ import annotations

import pytest

from vla_sched.core.forward_batch import SamplingParams
from vla_sched.core.scheduling.request import Req


def _req() -> Req:
    return Req(
        rid='r', origin_input_ids=(10, 11, 12), sampling=SamplingParams(0, 50), max_new_tokens=4
    )


def test_fill_ids_reads_any_range_across_prompt_and_outputs() -> None:
    req = _req()
    req.append_output([20, 21])
    assert req.fill_ids() == [10, 11, 12, 20, 21]
    assert req.fill_ids(1, 4) == [11, 12, 20]
    assert req.fill_ids(3, 4) == [20]
    assert req.fill_ids(4) == [21]
    assert req.fill_ids(5) == []
    assert req.fill_ids(4, 2) == []
    assert req.fill_ids(0, 2) == [10, 11]


def test_outputs_are_appended_as_ints_to_the_outputs_and_the_key() -> None:
    req = _req()
    req.append_output((20, 21))
    req.append_output([22])
    assert req.output_ids == [20, 21, 22]
    assert req.num_fill_tokens == req.kv.num_tokens == 6
    assert req.kv.key.token_ids.tolist()[3:] == [20, 21, 22]
    assert req.num_remaining_tokens == 1


def test_a_negative_sampled_token_is_refused() -> None:
    req = _req()
    with pytest.raises(ValueError, match='must be >= 0'):
        req.append_output([-2])
