"""check_batch on batches of several requests: each bad slot, row or id names its request,
and the slot table's leftovers past a request's length are not its slots."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from model_testing import PagedSlots, Step, make_batch

from vla_sched.core.forward_batch import FUTURE_TOKEN_ID
from vla_sched.model.runner.step_inputs import check_batch

VOCAB = 520


def _check(slots: PagedSlots, batch) -> None:
    check_batch(batch, req_to_token=slots.req_to_token, num_kv_slots=slots.num_slots,
                vocab_size=VOCAB)  # fmt: skip


def _decode(slots: PagedSlots, lengths=(5, 9, 7)):
    steps = [
        Step(f'r{row}', row, [3] * length, length - 1, length)
        for row, length in enumerate(lengths)
    ]
    return make_batch(slots, steps, decode=True)


def test_a_good_decode_batch_passes_whatever_lies_past_each_length():
    slots = PagedSlots()
    batch = _decode(slots)
    slots.req_to_token[0, 5:] = -7  # request r0 reads positions 0..4 only
    _check(slots, batch)
    _check(slots, dataclasses.replace(batch, input_ids=torch.full((3,), FUTURE_TOKEN_ID)))


def test_a_bad_slot_inside_a_length_names_its_request():
    slots = PagedSlots()
    batch = _decode(slots)
    slots.req_to_token[1, 2] = slots.num_slots
    with pytest.raises(IndexError, match=r'request r1: req_to_token\[1, 2\] = 1024 is outside'):
        _check(slots, batch)


def test_a_slot_written_twice_in_one_batch_is_refused():
    slots = PagedSlots()
    batch = _decode(slots)
    slots.req_to_token[2, 6] = slots.req_to_token[0, 4]
    twice = batch.out_cache_loc.clone()
    twice[2] = twice[0]
    with pytest.raises(ValueError, match='writes one KV slot twice'):
        _check(slots, dataclasses.replace(batch, out_cache_loc=twice))


def test_prefill_mismatches_and_bad_ids_name_the_request_they_fall_in():
    slots = PagedSlots()
    steps = [Step('a', 0, list(range(10)), 0, 10), Step('b', 1, list(range(10)), 4, 10)]
    batch = make_batch(slots, steps)
    _check(slots, batch)
    moved = batch.out_cache_loc.clone()
    moved[12] = slots.num_slots - 1  # token 12: request b's third new token
    with pytest.raises(ValueError, match=r'request b: out_cache_loc does not match'):
        _check(slots, dataclasses.replace(batch, out_cache_loc=moved))
    ids = batch.input_ids.clone()
    ids[11] = VOCAB
    with pytest.raises(ValueError, match=r'request b: input id 520 outside \[0, 520\)'):
        _check(slots, dataclasses.replace(batch, input_ids=ids))
    ids[11] = -2
    with pytest.raises(ValueError, match=r'request b: input id -2 outside'):
        _check(slots, dataclasses.replace(batch, input_ids=ids))


def test_bad_rows_and_lengths_name_the_request():
    slots = PagedSlots()
    batch = _decode(slots)
    with pytest.raises(IndexError, match='request r2: req_pool_index -1 outside'):
        _check(slots, dataclasses.replace(batch, req_pool_indices=torch.tensor([0, 1, -1])))
    long = torch.tensor([5, 300, 7])
    with pytest.raises(ValueError, match='request r1: prefix_len 299, seq_len 300'):
        _check(
            slots,
            dataclasses.replace(batch, prefix_lens=long - 1, seq_lens=long),
        )
