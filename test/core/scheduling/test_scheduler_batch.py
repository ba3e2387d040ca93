"""ScheduleBatch: extend/decode steps, filter/merge, decode memory check and retract order."""

from __future__ import annotations

import pytest
from sched_testing import admit_running, make_req

from vla_sched.core.forward_batch import ForwardMode
from vla_sched.core.memory.kv_config import KVMemoryConfig
from vla_sched.core.memory.kv_memory import KVMemory
from vla_sched.core.scheduling.request import FinishReason
from vla_sched.core.scheduling.schedule_batch import FUTURE_TOKEN_ID, ScheduleBatch


def _memory(num_pages: int, page_size: int = 1) -> KVMemory:
    return KVMemory(
        KVMemoryConfig(
            num_pages=num_pages, page_size=page_size, num_req_slots=8, max_context_len=64
        )
    )


def _running(memory: KVMemory, rid: str, prompt_len: int, num_outputs: int, **fields):
    base = 100 * (1 + sum(map(ord, rid)) % 50)  # distinct prompts never share a page
    req = make_req(rid, range(base, base + prompt_len), 50, **fields)
    admit_running(memory, req, num_outputs)
    return req


def _retract(batch: ScheduleBatch, memory: KVMemory, policy: str = 'length', sign: int = -1):
    return batch.retract_decode(
        memory, retraction_policy=policy, priority_sign=sign, retract_decode_steps=20
    )


def test_retract_takes_the_fewest_outputs_and_among_those_the_longest_prompt() -> None:
    memory = _memory(num_pages=25)
    a = _running(memory, 'a', prompt_len=5, num_outputs=3)  # 7 slots
    b = _running(memory, 'b', prompt_len=5, num_outputs=1)  # 5
    c = _running(memory, 'c', prompt_len=8, num_outputs=1)  # 8
    d = _running(memory, 'd', prompt_len=4, num_outputs=2)  # 5
    assert memory.num_free_tokens() == 0
    batch = ScheduleBatch([a, b, c, d])
    assert not batch.check_decode_mem(memory)
    result = _retract(batch, memory)
    assert result.retracted == [c]
    assert result.to_abort == []
    assert batch.reqs == [a, b, d]
    assert (c.is_retracted, c.retraction_count, c.output_ids) == (True, 1, [1000])
    assert not c.kv.holds_memory
    assert memory.num_free_tokens() == 8
    memory.check_integrity([r.kv for r in (a, b, c, d)])


def test_retract_goes_on_until_the_next_decode_step_fits() -> None:
    memory = _memory(num_pages=14)
    a = _running(memory, 'a', prompt_len=1, num_outputs=1)  # 1 slot
    b = _running(memory, 'b', prompt_len=2, num_outputs=2)  # 3
    c = _running(memory, 'c', prompt_len=2, num_outputs=3)  # 4
    blocker = _running(memory, 'x', prompt_len=6, num_outputs=1)  # 6, not in the batch
    batch = ScheduleBatch([a, b, c])
    result = _retract(batch, memory)
    assert result.retracted == [a, b]  # freeing a's one slot leaves b and c one short
    assert batch.reqs == [c]
    assert batch.check_decode_mem(memory)
    memory.check_integrity([r.kv for r in (a, b, c, blocker)])


def test_ties_on_outputs_and_prompt_retract_the_later_row() -> None:
    memory = _memory(num_pages=8)
    p = _running(memory, 'p', prompt_len=3, num_outputs=1)
    q = _running(memory, 'q', prompt_len=3, num_outputs=1)
    _running(memory, 'x', prompt_len=2, num_outputs=1)
    batch = ScheduleBatch([p, q])
    assert _retract(batch, memory).retracted == [q]


def test_the_last_request_is_never_retracted_and_is_aborted_when_it_does_not_fit() -> None:
    memory = _memory(num_pages=12)
    blocker = _running(memory, 'x', prompt_len=9, num_outputs=1)
    only = _running(memory, 'o', prompt_len=3, num_outputs=1)
    batch = ScheduleBatch([only])
    result = _retract(batch, memory)
    assert result.retracted == []
    assert result.to_abort == [only]
    assert batch.is_empty()
    assert only.kv.holds_memory  # the scheduler's finish path releases it
    memory.check_integrity([blocker.kv, only.kv])


def test_a_single_request_that_fits_is_kept_without_retracting() -> None:
    memory = _memory(num_pages=12)
    only = _running(memory, 'o', prompt_len=3, num_outputs=1)
    batch = ScheduleBatch([only])
    result = _retract(batch, memory)
    assert (result.retracted, result.to_abort, batch.reqs) == ([], [], [only])


@pytest.mark.parametrize(('sign', 'victim'), [(-1, 'c'), (1, 'a')])
def test_priority_retraction_takes_the_least_important_first(sign: int, victim: str) -> None:
    memory = _memory(num_pages=11)
    a = _running(memory, 'a', prompt_len=3, num_outputs=1, priority=5)
    b = _running(memory, 'b', prompt_len=3, num_outputs=3, priority=1)
    c = _running(memory, 'c', prompt_len=3, num_outputs=1, priority=1)
    assert memory.num_free_tokens() == 0
    batch = ScheduleBatch([a, b, c])
    result = _retract(batch, memory, policy='priority', sign=sign)
    assert [r.rid for r in result.retracted] == [victim]


def test_check_decode_mem_evicts_unlocked_cache_to_make_room() -> None:
    memory = _memory(num_pages=10)
    done = _running(memory, 'd', prompt_len=6, num_outputs=1)
    memory.release(done.kv, insert=True)  # 6 tokens evictable
    run = _running(memory, 'r', prompt_len=4, num_outputs=1)
    assert (memory.num_free_tokens(), memory.evictable_size()) == (0, 6)
    assert ScheduleBatch([run]).check_decode_mem(memory)
    assert memory.evictable_size() == 0


def test_extend_step_covers_each_rows_extend_range_and_samples_only_complete_rows() -> None:
    memory = _memory(num_pages=32, page_size=4)
    whole = make_req('w', range(10, 16), 4)
    chunk = make_req('c', range(20, 33), 4)
    for req, end in ((whole, 6), (chunk, 8)):
        memory.match_prefix(req.kv)
        memory.admit(req.kv)
        req.set_extend_range(0, end)
    fb = ScheduleBatch([whole, chunk]).prepare_for_extend(memory)
    assert fb.forward_mode is ForwardMode.EXTEND
    assert fb.extend_lens.tolist() == [6, 8]
    assert fb.input_ids.tolist() == list(range(10, 16)) + list(range(20, 28))
    assert fb.sample == (True, False)
    assert (whole.kv.kv_allocated_len, chunk.kv.kv_allocated_len) == (6, 8)


def test_extend_range_must_start_where_the_requests_kv_ends() -> None:
    memory = _memory(num_pages=16)
    req = make_req('r', range(10, 16), 4)
    memory.match_prefix(req.kv)
    memory.admit(req.kv)
    req.set_extend_range(2, 6)
    with pytest.raises(RuntimeError, match=r"request 'r'.*starts at 2 but its KV ends at 0"):
        ScheduleBatch([req]).prepare_for_extend(memory)


def test_decode_input_is_the_last_token_or_a_future_token_when_not_processed_yet() -> None:
    memory = _memory(num_pages=32)
    known = _running(memory, 'k', prompt_len=4, num_outputs=2)
    pending = _running(memory, 'p', prompt_len=4, num_outputs=0)  # result not processed yet
    fb = ScheduleBatch([known, pending]).prepare_for_decode(memory)
    assert fb.forward_mode is ForwardMode.DECODE
    assert fb.input_ids.tolist() == [1000, FUTURE_TOKEN_ID]
    assert fb.prefix_lens.tolist() == [5, 4]
    assert fb.seq_lens.tolist() == [6, 5]


def test_filter_drops_finished_and_excluded_rows_and_merge_appends() -> None:
    memory = _memory(num_pages=32)
    a, b, c = (_running(memory, rid, 2, 1) for rid in 'abc')
    b.finished_reason = FinishReason.length()
    batch = ScheduleBatch([a, b, c])
    batch.filter_batch(exclude=(c,))
    assert batch.reqs == [a]
    other = ScheduleBatch([c])
    batch.merge_batch(other)
    assert batch.reqs == [a, c]
    batch.filter_batch(keep_indices=[1])
    assert batch.reqs == [c]
