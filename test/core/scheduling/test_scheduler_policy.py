"""Waiting-queue order: fcfs, lof, lpm (with its fcfs fallback and in-batch deprioritizing),
dfs-weight, and priority."""

from __future__ import annotations

from sched_testing import launched, make_req, make_scheduler, run_until_idle

from vla_sched.core.memory.kv_config import KVMemoryConfig
from vla_sched.core.memory.kv_memory import KVMemory
from vla_sched.core.memory.req_kv import ReqKV
from vla_sched.core.scheduling.policy import SchedulePolicy
from vla_sched.core.scheduling.scheduler_config import SchedulerConfig

PREFIX = [500, 501, 502, 503]


def _memory() -> KVMemory:
    return KVMemory(KVMemoryConfig(num_pages=128, num_req_slots=8, max_context_len=64))


def _cache(memory: KVMemory, tokens: list[int]) -> None:
    """Put ``tokens`` into the radix tree as a finished request would."""
    req = ReqKV.from_prompt(f'cached-{tokens}', tokens)
    memory.match_prefix(req)
    memory.admit(req)
    memory.allocate_extend([req], [req.num_tokens - req.kv_allocated_len])
    memory.release(req, insert=True)


def _queue(*specs: tuple[str, list[int], int, int | None]) -> list:
    reqs = []
    for entry, (rid, prompt, max_new, priority) in enumerate(specs):
        req = make_req(rid, prompt, max_new, priority=priority)
        req.times.wait_queue_entry_ns = entry
        reqs.append(req)
    return reqs


def _order(config: SchedulerConfig, queue: list, memory: KVMemory | None = None) -> list[str]:
    SchedulePolicy(config, memory or _memory()).calc_priority(queue)
    return [r.rid for r in queue]


def test_fcfs_keeps_arrival_order_without_priority() -> None:
    queue = _queue(('c', [1], 9, None), ('a', [2], 1, None), ('b', [3], 5, None))
    assert _order(SchedulerConfig(), queue) == ['c', 'a', 'b']


def test_fcfs_with_priority_sorts_by_priority_then_queue_entry() -> None:
    specs = (('p1', [1], 1, 1), ('p5a', [2], 1, 5), ('p5b', [3], 1, 5), ('p3', [4], 1, 3))
    high_first = SchedulerConfig(enable_priority_scheduling=True)
    assert _order(high_first, _queue(*specs)) == ['p5a', 'p5b', 'p3', 'p1']
    low_first = SchedulerConfig(
        enable_priority_scheduling=True, schedule_low_priority_values_first=True
    )
    assert _order(low_first, _queue(*specs)) == ['p1', 'p3', 'p5a', 'p5b']


def test_lof_puts_the_longest_output_first_after_priority() -> None:
    specs = (('short', [1], 3, 0), ('long', [2], 10, 0), ('mid', [3], 5, 0), ('vip', [4], 1, 9))
    assert _order(SchedulerConfig(schedule_policy='lof'), _queue(*specs)) == [
        'long',
        'mid',
        'short',
        'vip',
    ]
    prio = SchedulerConfig(schedule_policy='lof', enable_priority_scheduling=True)
    assert _order(prio, _queue(*specs)) == ['vip', 'long', 'mid', 'short']


def test_lpm_puts_the_longest_cached_prefix_first() -> None:
    memory = _memory()
    _cache(memory, [*PREFIX, 600, 601, 602, 603, 604])
    queue = _queue(
        ('none', [1, 2, 3], 1, None),
        ('half', [*PREFIX, 700, 701], 1, None),
        ('most', [*PREFIX, 600, 601, 602, 999], 1, None),
    )
    assert _order(SchedulerConfig(schedule_policy='lpm'), queue, memory) == [
        'most',
        'half',
        'none',
    ]
    assert [r.num_matched_prefix_tokens for r in queue] == [7, 4, 0]


def test_lpm_acts_as_fcfs_and_leaves_the_queue_alone_above_the_queue_limit() -> None:
    memory = _memory()
    _cache(memory, [*PREFIX, 600, 601])
    queue = _queue(('none', [1, 2, 3], 1, None), ('hit', [*PREFIX, 600, 7], 1, None))
    config = SchedulerConfig(schedule_policy='lpm', lpm_fcfs_fallback_queue_len=1)
    assert _order(config, queue, memory) == ['none', 'hit']


def test_lpm_pushes_back_a_request_sharing_an_uncached_prefix_with_one_ahead() -> None:
    shared = [800, 801, 802, 803, 804, 805]
    queue = _queue(
        ('first', [*shared, 1], 1, None),
        ('twin', [*shared, 2], 1, None),
        ('other', [900, 901, 902], 1, None),
    )
    config = SchedulerConfig(
        schedule_policy='lpm',
        in_batch_prefix_check_threshold=4,
        in_batch_prefix_deprioritize_threshold=4,
    )
    assert _order(config, queue) == ['first', 'other', 'twin']
    off = SchedulerConfig(schedule_policy='lpm', in_batch_prefix_check_threshold=-1)
    assert _order(off, _queue(('a', [*shared, 1], 1, None), ('b', [*shared, 2], 1, None))) == [
        'a',
        'b',
    ]


def test_dfs_weight_walks_heavier_subtrees_first_and_a_nodes_requests_after_its_subtree() -> None:
    memory = _memory()
    _cache(memory, [*PREFIX, 10, 11, 12])
    _cache(memory, [*PREFIX, 20, 21, 22])
    queue = _queue(
        ('z', [99, 98], 1, None),
        ('y', [*PREFIX, 20, 21, 5], 1, None),
        ('p', [*PREFIX, 30, 31], 1, None),
        ('x1', [*PREFIX, 10, 11, 7, 8], 1, None),
        ('x2', [*PREFIX, 10, 11, 9], 1, None),
    )
    assert _order(SchedulerConfig(schedule_policy='dfs-weight'), queue, memory) == [
        'x1',
        'x2',
        'y',
        'p',
        'z',
    ]


def test_the_scheduler_admits_in_policy_order() -> None:
    sched = make_scheduler(schedule_policy='lpm', prefill_max_requests=1)
    sched.add_request(make_req('seed', [*PREFIX, 600, 601, 602], 1))
    run_until_idle(sched)
    sched.add_request(make_req('cold', [1, 2, 3], 1))
    sched.add_request(make_req('warm', [*PREFIX, 600, 601, 9], 1))
    run_until_idle(sched)
    prefills = [step[1][0] for step in launched(sched) if step[0] == 'extend']
    assert prefills == [('seed', 0, 7), ('warm', 6, 7), ('cold', 0, 3)]
