"""The prefill delayer: its triggers, its bounds, and its effect on running robots."""

from __future__ import annotations

import pytest
from sched_testing import launched, make_req, make_scheduler

from vla_sched.core.scheduling.prefill_delayer import DelayDecision, PrefillDelayer
from vla_sched.core.scheduling.scheduler_config import PrefillDelayerConfig

MS = 1_000_000


def _running(remaining: int):
    req = make_req(f'run-{remaining}', [1, 2], 10)
    req.output_ids.extend([1000] * (10 - remaining))
    return req


def _delayer(**fields: object) -> PrefillDelayer:
    fields.setdefault('enabled', True)
    return PrefillDelayer(PrefillDelayerConfig(**fields))


def _decide(delayer: PrefillDelayer, running, *, usage: float = 0.5, now: int = 0):
    return delayer.decide(now_ns=now, running=running, token_usage=usage)


def test_disabled_or_idle_always_allows() -> None:
    assert _decide(PrefillDelayer(PrefillDelayerConfig()), [_running(1)]) is DelayDecision.DISABLED
    assert _decide(_delayer(), []) is DelayDecision.IDLE


def test_near_done_decodes_delay_for_at_most_max_delay_passes_minus_one() -> None:
    delayer = _delayer(max_delay_passes=4, near_done_decode_tokens=3)
    running = [_running(3), _running(2)]
    decisions = [_decide(delayer, running) for _ in range(5)]
    assert decisions == [DelayDecision.DELAY] * 3 + [
        DelayDecision.WAIT_TIMEOUT,
        DelayDecision.DELAY,
    ]


def test_only_a_running_request_close_to_done_holds_the_prefill() -> None:
    delayer = _delayer(near_done_decode_tokens=3)
    assert _decide(delayer, [_running(4), _running(9)]) is DelayDecision.NO_WAIT
    assert _decide(delayer, [_running(9), _running(3)]) is DelayDecision.DELAY
    assert _decide(delayer, [_running(4)]) is DelayDecision.WAIT_SUCCESS


def test_near_done_is_off_by_default() -> None:
    assert _decide(_delayer(), [_running(1)]) is DelayDecision.NO_WAIT


def test_low_kv_headroom_delays_and_the_low_watermark_always_allows() -> None:
    delayer = _delayer(token_usage_high_watermark=0.8, token_usage_low_watermark=0.3)
    far = [_running(9)]
    assert _decide(delayer, far, usage=0.85) is DelayDecision.DELAY
    assert _decide(delayer, far, usage=0.5) is DelayDecision.WAIT_SUCCESS
    assert _decide(delayer, [_running(1)], usage=0.2) is DelayDecision.TOKEN_WATERMARK


def test_the_delay_never_outlasts_max_delay_ms() -> None:
    delayer = _delayer(near_done_decode_tokens=3, max_delay_ms=10)
    near = [_running(1)]
    assert _decide(delayer, near, now=0) is DelayDecision.DELAY
    assert _decide(delayer, near, now=9 * MS) is DelayDecision.DELAY
    assert _decide(delayer, near, now=10 * MS) is DelayDecision.WAIT_TIMEOUT


@pytest.mark.parametrize(
    ('max_delay_passes', 'num_delayed', 'prefill_at'), [(30, 3, 6), (2, 1, 4)]
)
def test_a_new_prefill_waits_for_a_nearly_done_robot(
    max_delay_passes: int, num_delayed: int, prefill_at: int
) -> None:
    delayer = PrefillDelayerConfig(
        enabled=True,
        near_done_decode_tokens=3,
        token_usage_high_watermark=None,
        max_delay_passes=max_delay_passes,
    )
    sched = make_scheduler(prefill_delayer=delayer)
    first = make_req('a', range(10, 14), 6)
    sched.add_request(first)
    for _ in range(3):
        sched.run_once()  # prefill and two decodes: 3 tokens left
    sched.add_request(make_req('b', range(20, 24), 2))
    while sched.has_work():
        sched.run_once()
    modes = [(mode, rows[0][0]) for mode, rows in launched(sched)]
    assert modes.index(('extend', 'b')) == prefill_at
    assert sched.metrics.num_delayed_prefills == num_delayed
