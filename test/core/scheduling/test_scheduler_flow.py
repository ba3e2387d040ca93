"""Flow-matching requests (pi0's steps): a whole prefix pass attending both ways, then
``denoise_steps`` denoising passes batched across requests like decode rows (bursts, mixed
passes, retraction), the chunk from the last pass, and no KV kept or shared."""

from __future__ import annotations

import numpy as np
import pytest
from sched_testing import SAMPLING, launched, make_scheduler, run_until_idle

from vla_sched.core.forward_batch import ForwardMode
from vla_sched.core.scheduling.request import AbortReason, FinishKind, Req
from vla_sched.testing.sim_runner import reference_flow_chunk

STEPS = 3  # the simulated runner's denoising passes


def _flow(rid: str, prompt, *, robot: str | None = None, seed: int = 0, **fields) -> Req:
    noise = np.random.default_rng(seed).standard_normal((4, 6)).astype(np.float32)
    return Req(
        rid=rid,
        origin_input_ids=tuple(prompt),
        sampling=SAMPLING,
        max_new_tokens=STEPS + 1,
        robot_id=robot,
        denoise_steps=STEPS,
        noise=noise,
        **fields,
    )


def _expected(req: Req) -> np.ndarray:
    return reference_flow_chunk(req.origin_input_ids, req.images, req.noise, STEPS)


@pytest.mark.parametrize('overlap', [False, True])
@pytest.mark.parametrize('burst', [1, 8])
def test_each_request_gets_its_chunk_and_leaves_no_kv(overlap: bool, burst: int) -> None:
    sched = make_scheduler(enable_overlap=overlap, page_size=4, num_continuous_decode_steps=burst)
    total = sched.memory.num_free_tokens()
    reqs = [_flow(f'r{i}', range(10 * i + 1, 10 * i + 9), robot=f'robot{i}', seed=i)
            for i in range(3)]  # fmt: skip
    for req in reqs:
        assert sched.add_request(req) is None
    done = run_until_idle(sched)
    assert {r.rid for r in done} == {'r0', 'r1', 'r2'}
    for req in reqs:
        assert req.finished_reason.kind is FinishKind.LENGTH
        assert len(req.output_ids) == STEPS + 1
        np.testing.assert_allclose(req.action_chunk, _expected(req), rtol=1e-6)
    assert sched.memory.num_free_tokens() == total
    assert sched.memory.evictable_size() == 0


def test_the_prefix_pass_is_one_whole_row_and_the_denoising_passes_batch_as_decode_rows():
    sched = make_scheduler(page_size=4, num_continuous_decode_steps=1)
    for i in range(2):
        sched.add_request(_flow(f'r{i}', range(10 * i + 1, 10 * i + 9), seed=i))
    run_until_idle(sched)
    assert launched(sched) == [
        ('extend', [('r0', 0, 8), ('r1', 0, 8)]),
        ('decode', [('r0', 8, 9), ('r1', 8, 9)]),
        ('decode', [('r0', 9, 10), ('r1', 9, 10)]),
        ('decode', [('r0', 10, 11), ('r1', 10, 11)]),
    ]
    passes = [fb.denoise_passes for fb in sched.runner.batches]
    assert passes == [(-1, -1), (0, 0), (1, 1), (2, 2)]
    assert all(len(fb.noise) == 2 for fb in sched.runner.batches)


def test_a_request_joins_the_running_denoising_passes_once_its_prefix_is_done():
    sched = make_scheduler(page_size=4, num_continuous_decode_steps=1, enable_mixed_chunk=True)
    first = _flow('a', range(1, 9), seed=1)
    sched.add_request(first)
    sched.run_once()  # a's prefix
    sched.run_once()  # a's first denoising pass
    second = _flow('b', range(21, 29), seed=2)
    sched.add_request(second)
    run_until_idle(sched)
    batches = sched.runner.batches
    mixed = batches[2]
    assert mixed.forward_mode is ForwardMode.EXTEND
    assert dict(zip(mixed.rids, mixed.denoise_passes, strict=True)) == {'b': -1, 'a': 1}
    after = batches[3]
    assert dict(zip(after.rids, after.denoise_passes, strict=True)) == {'a': 2, 'b': 0}
    for req in (first, second):
        np.testing.assert_allclose(req.action_chunk, _expected(req), rtol=1e-6)


def test_identical_prompts_share_no_kv():
    sched = make_scheduler(page_size=4)
    first = _flow('a', range(1, 13))
    sched.add_request(first)
    run_until_idle(sched)
    second = _flow('b', range(1, 13))
    sched.add_request(second)
    run_until_idle(sched)
    assert second.num_cached_tokens == 0
    assert sched.runner.batches[-STEPS - 1].prefix_lens.tolist() == [0]


def test_a_prefix_longer_than_a_pass_is_refused_never_chunked():
    sched = make_scheduler(page_size=4, chunked_prefill_size=16)
    req = _flow('long', range(1, 30))
    sched.add_request(req)
    run_until_idle(sched)
    assert req.finished_reason.abort is AbortReason.PROMPT_TOO_LONG
    assert 'attends both ways' in req.finished_reason.message


def test_a_retracted_request_starts_over_from_its_prefix_and_gets_the_same_chunk():
    # A pool that holds both prefixes but not every pass's marker: one is retracted.
    sched = make_scheduler(
        page_size=1,
        num_pages=9,
        num_continuous_decode_steps=1,
        init_new_token_ratio=0.1,
        clip_max_new_tokens_estimation=1,
    )
    reqs = [_flow(f'r{i}', (10 * i + 1, 10 * i + 2), seed=i) for i in range(2)]
    for req in reqs:
        sched.add_request(req)
    run_until_idle(sched)
    assert sched.metrics.num_retracts_total >= 1
    retracted = [r for r in reqs if r.retraction_count]
    assert retracted
    for req in reqs:
        assert req.finished_reason.kind is FinishKind.LENGTH
        assert len(req.output_ids) == STEPS + 1
        np.testing.assert_allclose(req.action_chunk, _expected(req), rtol=1e-6)
    prefix_passes = [fb for fb in sched.runner.batches if -1 in (fb.denoise_passes or ())]
    assert sum(fb.rids.count(retracted[0].rid) for fb in prefix_passes) == 2


def test_a_flow_request_needs_one_marker_per_pass_and_its_noise():
    with pytest.raises(ValueError, match='max_new_tokens must be 4'):
        Req(rid='x', origin_input_ids=(1, 2), sampling=SAMPLING, max_new_tokens=3,
            denoise_steps=3, noise=np.zeros((2, 2), np.float32))  # fmt: skip
    with pytest.raises(ValueError, match='no initial noise'):
        Req(rid='x', origin_input_ids=(1, 2), sampling=SAMPLING, max_new_tokens=4,
            denoise_steps=3)  # fmt: skip
