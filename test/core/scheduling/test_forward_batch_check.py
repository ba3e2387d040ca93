"""ForwardBatch.check: every disagreement between the fields is refused; decode steps."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from vla_sched.core.forward_batch import (
    FUTURE_TOKEN_ID,
    ForwardBatch,
    ForwardMode,
    SamplingParams,
)


def _t(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


def _batch(
    mode: ForwardMode, prefix: list[int], extend: list[int], input_ids: list[int]
) -> ForwardBatch:
    b = len(prefix)
    return ForwardBatch(
        forward_mode=mode,
        rids=tuple(f'r{i}' for i in range(b)),
        req_pool_indices=_t(list(range(b))),
        prefix_lens=_t(prefix),
        extend_lens=_t(extend),
        seq_lens=_t([p + e for p, e in zip(prefix, extend, strict=True)]),
        input_ids=_t(input_ids),
        out_cache_loc=_t(list(range(100, 100 + len(input_ids)))),
        sample=(True,) * b,
        sampling=(SamplingParams(0, 10),) * b,
        images=((),) * b,
    )


def test_consistent_batches_pass_and_report_their_decode_steps() -> None:
    extend = _batch(ForwardMode.EXTEND, [0, 4], [3, 2], [1, 2, 3, 4, 5])
    extend.check()
    assert extend.num_decode_steps == 1
    decode = _batch(ForwardMode.DECODE, [5, 9], [1, 1], [7, FUTURE_TOKEN_ID])
    decode.check()
    assert decode.num_decode_steps == 1
    burst = _batch(ForwardMode.DECODE, [5, 9], [3, 3], [7, -1, -1, 8, -1, -1])
    burst.check()
    assert burst.num_decode_steps == 3
    empty = _batch(ForwardMode.DECODE, [], [], [])
    empty.check()
    assert empty.num_decode_steps == 0


def test_wrong_dtype_or_length_of_a_per_request_tensor_is_refused() -> None:
    batch = _batch(ForwardMode.EXTEND, [0, 4], [3, 2], [1, 2, 3, 4, 5])
    with pytest.raises(ValueError, match=r'prefix_lens must be int64 \[2\]'):
        dataclasses.replace(batch, prefix_lens=batch.prefix_lens.to(torch.int32)).check()
    with pytest.raises(ValueError, match=r'req_pool_indices must be int64 \[2\]'):
        dataclasses.replace(batch, req_pool_indices=_t([0])).check()
    with pytest.raises(ValueError, match='one entry per request'):
        dataclasses.replace(batch, sample=(True,)).check()


def test_lengths_that_do_not_add_up_are_refused() -> None:
    batch = _batch(ForwardMode.EXTEND, [0, 4], [3, 2], [1, 2, 3, 4, 5])
    with pytest.raises(ValueError, match='seq_lens != prefix_lens \\+ extend_lens'):
        dataclasses.replace(batch, seq_lens=_t([3, 7])).check()
    with pytest.raises(ValueError, match='must hold 5 tokens'):
        dataclasses.replace(batch, input_ids=_t([1, 2, 3, 4])).check()
    with pytest.raises(ValueError, match='must hold 5 tokens'):
        dataclasses.replace(batch, out_cache_loc=_t([1, 2, 3, 4, 5, 6])).check()


def test_a_decode_batch_extends_every_request_by_the_same_known_first_token() -> None:
    with pytest.raises(ValueError, match='same k >= 1 tokens'):
        _batch(ForwardMode.DECODE, [5, 9], [1, 2], [7, 8, -1]).check()
    with pytest.raises(ValueError, match='same k >= 1 tokens'):
        _batch(ForwardMode.DECODE, [5, 9], [0, 0], []).check()
    with pytest.raises(ValueError, match='knows only its first input id'):
        _batch(ForwardMode.DECODE, [5, 9], [2, 2], [7, -1, 8, 9]).check()
