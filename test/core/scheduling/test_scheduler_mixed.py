"""Mixed passes (SGLang's mixed chunk): a prefill pass also decodes the running requests."""

from __future__ import annotations

import pytest
from sched_testing import (
    clone_req,
    expected_outputs,
    launched,
    make_req,
    make_scheduler,
    run_until_idle,
)

from vla_sched.core.forward_batch import FUTURE_TOKEN_ID


def _run_arrivals(sched, reqs: list, *, every: int) -> None:
    """Add one request every ``every`` iterations, checking integrity after each step."""
    for req in reqs:
        assert sched.add_request(req) is None
        for _ in range(every):
            sched.run_once()
            sched.check_integrity()
    run_until_idle(sched)


@pytest.mark.parametrize('overlap', [False, True])
def test_a_new_request_prefills_in_the_same_pass_as_the_running_decodes(overlap: bool) -> None:
    sched = make_scheduler(enable_mixed_chunk=True, enable_overlap=overlap)
    first = make_req('a', range(10, 15), 6)
    second = make_req('b', range(20, 24), 3)
    sched.add_request(first)
    sched.run_once()  # a: prefill
    sched.run_once()  # a: decode
    sched.add_request(second)
    sched.run_once()
    sched.check_integrity()
    mode, rows = launched(sched)[2]
    assert mode == 'extend'
    # b's whole prompt, then a's next token at the end of a's KV (prompt + 2 tokens)
    assert rows == [('b', 0, 4), ('a', 6, 7)]
    mixed = sched.runner.batches[2]
    expected_input = FUTURE_TOKEN_ID if overlap else first.output_ids[1]
    assert mixed.input_ids.tolist()[-1] == expected_input
    run_until_idle(sched)
    assert first.output_ids == expected_outputs(first)
    assert second.output_ids == expected_outputs(second)


def _passes_of(sched, rid: str) -> list[int]:
    return [i for i, (_, rows) in enumerate(launched(sched)) if any(r == rid for r, _, _ in rows)]


@pytest.mark.parametrize('overlap', [False, True])
def test_with_mixed_passes_a_running_request_decodes_in_every_pass_until_it_ends(
    overlap: bool,
) -> None:
    workload = [make_req(f'q{i}', range(10 * i + 10, 10 * i + 16), 6) for i in range(5)]
    gaps = {}
    for mixed in (False, True):
        sched = make_scheduler(
            enable_mixed_chunk=mixed, enable_overlap=overlap, prefill_decode_interval=1
        )
        reqs = [clone_req(r) for r in workload]
        _run_arrivals(sched, reqs, every=2)
        assert [r.output_ids for r in reqs] == [expected_outputs(r) for r in workload]
        passes = {r.rid: _passes_of(sched, r.rid) for r in reqs}
        gaps[mixed] = {rid: p[-1] - p[0] + 1 - len(p) for rid, p in passes.items()}
    assert set(gaps[True].values()) == {0}
    assert sum(gaps[False].values()) > 0


def test_no_decode_only_pass_is_due_after_a_mixed_pass() -> None:
    sched = make_scheduler(enable_mixed_chunk=True, prefill_decode_interval=1)
    sched.add_request(make_req('a', range(10, 15), 8))
    sched.run_once()  # a: prefill alone (nothing runs), so one decode pass is due
    sched.add_request(make_req('b', range(20, 25), 8))
    sched.run_once()  # that decode pass; b waits
    sched.run_once()  # b's prefill, with a decoding in it
    sched.add_request(make_req('c', range(30, 35), 8))
    sched.run_once()  # c's prefill at once, with a and b decoding in it
    modes = [(mode, [rid for rid, _, _ in rows]) for mode, rows in launched(sched)]
    assert modes == [
        ('extend', ['a']),
        ('decode', ['a']),
        ('extend', ['b', 'a']),
        ('extend', ['c', 'b', 'a']),
    ]
    sched.check_integrity()
    run_until_idle(sched)
