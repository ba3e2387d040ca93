"""ReqToTokenPool: rows per request, owners, and bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vla_sched.core.memory.kv_errors import DoubleFreeError, OutOfReqSlotsError
from vla_sched.core.memory.req_to_token_pool import ReqToTokenPool


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


def test_runs_of_slots_land_at_each_rows_positions_back_to_back() -> None:
    pool = ReqToTokenPool(num_req_slots=3, max_context_len=8)
    rows = [pool.allocate(rid) for rid in 'abc']
    pool.write_runs(rows, [1, 0, 5], [2, 0, 3], np.array([10, 11, 12, 13, 14]))
    assert pool.read(rows[0], 0, 4).tolist() == [0, 10, 11, 0]
    assert pool.read(rows[1], 0, 8).tolist() == [0] * 8
    assert pool.read(rows[2], 4, 8).tolist() == [0, 12, 13, 14]
    assert pool.slots_at(rows, [2, 0, 7]) == [11, 0, 14]


def test_one_slot_per_row_and_a_row_with_two_next_to_an_empty_one_both_land() -> None:
    pool = ReqToTokenPool(num_req_slots=2, max_context_len=4)
    rows = [pool.allocate(rid) for rid in 'ab']
    pool.write_runs(rows, [3, 1], [1, 1], np.array([7, 8]))  # a decode step
    assert pool.slots_at(rows, [3, 1]) == [7, 8]
    pool.write_runs(rows, [0, 0], [2, 0], np.array([5, 6]))  # as many slots as rows
    assert pool.read(rows[0], 0, 4).tolist() == [5, 6, 0, 7]
    assert pool.read(rows[1], 0, 4).tolist() == [0, 8, 0, 0]
