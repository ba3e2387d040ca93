"""ReqToTokenPool: rows per request, owners, and bad input."""

from __future__ import annotations

import pytest
import torch

from vla_sched.engine.memory.kv_errors import DoubleFreeError, OutOfReqSlotsError
from vla_sched.engine.memory.req_to_token_pool import ReqToTokenPool


def test_rows_are_int32_and_handed_out_in_order() -> None:
    pool = ReqToTokenPool(num_req_slots=3, max_context_len=8)
    assert pool.req_to_token.dtype == torch.int32
    assert pool.req_to_token.shape == (3, 8)
    assert [pool.allocate(rid) for rid in 'abc'] == [0, 1, 2]
    assert pool.owner(1) == 'b'
    assert pool.num_free_slots == 0


def test_more_requests_than_slots_raises_naming_the_request() -> None:
    pool = ReqToTokenPool(num_req_slots=1, max_context_len=8)
    pool.allocate('a')
    with pytest.raises(OutOfReqSlotsError, match="request 'b'"):
        pool.allocate('b')


def test_freed_row_is_reused_after_the_other_free_rows() -> None:
    pool = ReqToTokenPool(num_req_slots=3, max_context_len=8)
    pool.allocate('a')
    pool.free(0, 'a')
    assert pool.free_slot_list() == [1, 2, 0]


def test_freeing_a_free_row_raises_naming_slot_and_request() -> None:
    pool = ReqToTokenPool(num_req_slots=2, max_context_len=8)
    row = pool.allocate('a')
    pool.free(row, 'a')
    with pytest.raises(DoubleFreeError, match="request 'a' frees request slot 0, which is free"):
        pool.free(row, 'a')


def test_freeing_another_requests_row_raises() -> None:
    pool = ReqToTokenPool(num_req_slots=2, max_context_len=8)
    row = pool.allocate('a')
    with pytest.raises(ValueError, match="owned by 'a'"):
        pool.free(row, 'b')
    assert pool.owner(row) == 'a'


def test_write_and_read_round_trip_and_context_limit() -> None:
    pool = ReqToTokenPool(num_req_slots=1, max_context_len=4)
    row = pool.allocate('a')
    pool.write(row, 1, torch.tensor([7, 8, 9]))
    assert pool.read(row, 1, 4).tolist() == [7, 8, 9]
    assert pool.read(row, 1, 4).dtype == torch.int64
    with pytest.raises(ValueError, match="request slot 0 \\('a'\\) would hold 5 tokens"):
        pool.write(row, 2, torch.tensor([1, 2, 3]))
