"""Random operation sequences against KVMemory with check_integrity after every step."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from kv_random_driver import NUM_OPS, KVMemoryDriver

pytestmark = pytest.mark.slow  # seconds or more: not in the fast tier

_OPS = st.lists(
    st.tuples(st.integers(0, NUM_OPS - 1), st.integers(0, 7), st.integers(0, 7)),
    min_size=8,
    max_size=48,
)


@settings(
    max_examples=400,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    page_size=st.sampled_from([1, 4, 16]), step_kv=st.sampled_from(['free', 'insert']), ops=_OPS
)
def test_random_operation_sequences_keep_every_invariant(
    page_size: int, step_kv: str, ops: list[tuple[int, int, int]]
) -> None:
    driver = KVMemoryDriver(page_size=page_size, step_kv=step_kv)
    event(f'{len(ops) // 10 * 10}+ operations')
    for op, a, b in ops:
        driver.apply(op, a, b)


def test_the_random_driver_reaches_every_operation_and_memory_pressure() -> None:
    rng = random.Random(20240611)
    for page_size in (1, 16):
        driver = KVMemoryDriver(page_size=page_size, step_kv='insert')
        for _ in range(1500):
            driver.apply(rng.randrange(NUM_OPS), rng.randrange(8), rng.randrange(8))
        for kind in (
            'open', 'change_instruction', 'close', 'new_request', 'admit', 'prefill',
            'decode', 'finish', 'abort', 'retract', 'evict', 'reap', 'bad_call',
            'out_of_pages',
        ):  # fmt: skip
            assert driver.done[kind] > 0, f'page size {page_size}: no {kind}'
