"""A resumed chunked request does not take a request row from the waiting queue."""

from __future__ import annotations

from sched_testing import make_req, make_scheduler, run_until_idle


def test_a_waiting_request_joins_the_pass_that_finishes_a_chunked_prompt():
    sched = make_scheduler(num_req_slots=2, chunked_prefill_size=8, max_prefill_tokens=8)
    long = make_req('long', list(range(100, 110)), 2)  # 10 tokens: chunks of 8 and 2
    sched.add_request(long)
    sched.run_once()
    assert sched.chunked_req is long
    short = make_req('short', [7, 8, 9], 2)
    sched.add_request(short)
    sched.run_once()  # the last 2 tokens of long; 6 tokens of budget and one free row left
    sched.check_integrity()
    assert short.times.admitted_ns is not None
    assert sched.chunked_req is None  # the pass finished long's prompt
    assert long.times.first_token_ns is not None
    run_until_idle(sched)
    assert len(long.output_ids) == 2 and len(short.output_ids) == 2
