"""Random workloads: every step keeps the scheduler and the KV memory consistent, every
request ends exactly once, and every completed request has the reference output."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sched_testing import expected_outputs, make_req, make_scheduler

from vla_sched.core.memory.radix_key import RadixKey
from vla_sched.core.scheduling.request import FinishKind
from vla_sched.core.scheduling.scheduler_config import PrefillDelayerConfig

pytestmark = pytest.mark.slow  # seconds or more: not in the fast tier

PREFIXES = ([500, 501, 502, 503, 504], [600, 601, 602])
ROBOTS = (None, 'r0', 'r1', 'r2')
SESSION_ROBOTS = ('r0', 'r1')  # robots r0 and r1 open a session on PREFIXES[0]


@st.composite
def configs(draw, *, pressure: bool) -> dict:
    page_size = draw(st.sampled_from([1, 2, 4]))
    policy = draw(st.sampled_from(['fcfs', 'lpm', 'dfs-weight', 'lof']))
    priority = policy in ('fcfs', 'lof') and draw(st.booleans())
    chunk = draw(st.sampled_from([None, 1, 2, 3]))
    return {
        'page_size': page_size,
        'num_pages': draw(st.integers(24, 60)) // page_size,
        'num_req_slots': draw(st.integers(2, 6) if pressure else st.integers(1, 4)),
        'enable_overlap': draw(st.booleans()),
        'schedule_policy': policy,
        'enable_priority_scheduling': priority,
        'priority_scheduling_preemption_threshold': draw(st.sampled_from([0, 2])),
        'chunked_prefill_size': None if chunk is None else chunk * page_size,
        'init_new_token_ratio': 0.01 if pressure else draw(st.sampled_from([0.01, 0.7])),
        'max_queued_requests': draw(st.sampled_from([None, 3])),
        'late_policy': draw(st.sampled_from(['drop', 'deliver_late'])),
        'enable_mixed_chunk': draw(st.booleans()),
        'num_continuous_decode_steps': draw(st.sampled_from([1, 3])),
        'prefill_delayer': PrefillDelayerConfig(
            enabled=draw(st.booleans()), near_done_decode_tokens=2, max_delay_passes=3
        ),
    }


@st.composite
def arrivals(draw, *, pressure: bool) -> list[dict]:
    """Requests, each with the iteration it arrives at (and maybe one it is aborted at).

    Under ``pressure`` requests arrive one by one with short prompts and long outputs, so
    a low new-token ratio admits more decodes than the pool holds and they retract.
    """
    events = []
    seq = dict.fromkeys(ROBOTS, 0)
    for i in range(draw(st.integers(1, 8))):
        robot = draw(st.sampled_from(ROBOTS))
        seq[robot] += 1
        shared = draw(st.sampled_from([0, 0, 1, None]))
        prefix = PREFIXES[shared] if shared is not None else []
        if robot in SESSION_ROBOTS:
            prefix = PREFIXES[0]
        suffix = draw(st.lists(st.integers(0, 9), min_size=1, max_size=4))
        if pressure:
            robot, prefix = None, []
        events.append(
            {
                'rid': f'q{i}',
                'at': 2 * i if pressure else draw(st.integers(0, 12)),
                'prompt': [*prefix, *suffix],
                'max_new': draw(st.integers(8, 16) if pressure else st.integers(1, 10)),
                'robot': robot,
                'seq': seq[robot],
                'priority': draw(st.integers(0, 9)),
                'deadline_ms': None if pressure else draw(st.sampled_from([None] * 3 + [4, 20])),
                'abort_at': None if pressure else draw(st.sampled_from([None] * 5 + [2, 9])),
            }
        )
    return events


def _request(event: dict, now: int, config: dict):
    robot = event['robot']
    deadline = event['deadline_ms']
    return make_req(
        event['rid'],
        event['prompt'],
        event['max_new'],
        robot_id=robot,
        step_seq=event['seq'],
        session_id=robot if robot in SESSION_ROBOTS else None,
        priority=event['priority'] if config['enable_priority_scheduling'] else None,
        deadline_ns=None if deadline is None else now + deadline * 1_000_000,
    )


@settings(
    max_examples=500,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(data=st.data())
def test_random_workloads_keep_every_invariant(data: st.DataObject) -> None:
    pressure = data.draw(st.booleans(), label='pressure')
    config = data.draw(configs(pressure=pressure), label='config')
    events = data.draw(arrivals(pressure=pressure), label='events')
    sched = make_scheduler(max_context_len=64, **config)
    prefix = RadixKey(torch.tensor(PREFIXES[0], dtype=torch.int64))
    for robot in SESSION_ROBOTS:
        sched.open_or_update_session(robot, prefix)
    ended: dict[str, object] = {}
    reqs = {}
    for it in range(300):
        for event in events:
            if event['at'] == it:
                req = reqs[event['rid']] = _request(event, sched.clock(), config)
                if sched.add_request(req) is not None:
                    ended[req.rid] = req
            if event['abort_at'] == it and event['rid'] in reqs:
                sched.abort(event['rid'])
        for req in sched.run_once():
            assert req.rid not in ended, f'{req.rid} ended twice'
            ended[req.rid] = req
        sched.check_integrity()
        sched.clock.advance(1_000_000)
        if it > 12 and not sched.has_work():
            break
    assert not sched.has_work(), 'the scheduler did not drain'
    assert set(ended) == set(reqs)
    for req in reqs.values():
        if req.finished_reason.kind is FinishKind.LENGTH:
            assert req.output_ids == expected_outputs(req)
    assert sched.memory.admitted_reqs() == []
    sched.check_integrity()
