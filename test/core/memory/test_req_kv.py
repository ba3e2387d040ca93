"""ReqKV: tokens appended after the prompt reach its radix key; bad tokens are refused."""

from __future__ import annotations

import pytest
import torch

from vla_sched.core.memory.radix_key import RadixKey
from vla_sched.core.memory.req_kv import ReqKV


def test_appended_tokens_are_counted_at_once_and_end_the_key() -> None:
    req = ReqKV.from_prompt('a', [5, 6, 7], extra_key='widowx')
    req.append_tokens([1])
    req.append_tokens(torch.tensor([[2, 3]]))
    assert req.num_tokens == 6
    assert req.key.token_ids.tolist() == [5, 6, 7, 1, 2, 3]
    assert req.key.token_ids.dtype == torch.int64
    assert req.key.extra_key == 'widowx'
    req.append_tokens([4])
    assert req.key.token_ids.tolist() == [5, 6, 7, 1, 2, 3, 4]
    assert len(req.key) == req.num_tokens == 7


def test_a_negative_generated_token_is_refused_and_nothing_is_appended() -> None:
    req = ReqKV.from_prompt('a', [5, 6])
    req.append_tokens([1])
    with pytest.raises(ValueError, match="request 'a': generated token ids must be >= 0"):
        req.append_tokens([2, -1])
    with pytest.raises(ValueError, match='must be >= 0'):
        req.append_tokens(torch.tensor([-5]))
    assert req.key.token_ids.tolist() == [5, 6, 1]


def test_a_new_key_replaces_the_tokens_appended_to_the_old_one() -> None:
    req = ReqKV('a', RadixKey(torch.tensor([1, 2])))
    req.append_tokens([3])
    req.key = RadixKey(torch.tensor([9]), 'franka')
    assert req.num_tokens == 1
    assert req.key.token_ids.tolist() == [9]
    assert not req.holds_memory
    assert req.prefix_len == 0
