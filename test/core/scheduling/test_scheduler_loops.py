"""Normal and overlap loops, retract under KV pressure, and the latency counters."""

from __future__ import annotations

import pytest
from sched_testing import (
    admit_running,
    clone_req,
    expected_outputs,
    launched,
    make_req,
    make_scheduler,
    run_until_idle,
)

from vla_sched.core.forward_batch import ForwardOutput
from vla_sched.core.scheduling.batch_results import ResultProcessor
from vla_sched.core.scheduling.request import FinishKind, FinishReason
from vla_sched.core.scheduling.schedule_batch import FUTURE_TOKEN_ID, ScheduleBatch
from vla_sched.testing.sim_runner import CostModel

MS = 1_000_000


def _pressure_workload() -> list:
    """Four requests whose decodes cannot all fit a 40-token pool at once."""
    return [
        make_req(f'q{i}', range(10 * i + 10, 10 * i + 16), 12, robot_id=f'r{i}') for i in range(4)
    ]


def _pressure_scheduler(**config: object):
    config.setdefault('init_new_token_ratio', 0.05)
    return make_scheduler(num_pages=40, num_req_slots=4, **config)


def _run_staggered(sched, reqs: list, *, every: int = 2) -> None:
    """Add one request every ``every`` iterations (so the prefill budget sees the decodes
    of the earlier ones), then run until idle."""
    for req in reqs:
        sched.add_request(req)
        for _ in range(every):
            sched.run_once()
            sched.check_integrity()
    run_until_idle(sched)


@pytest.mark.parametrize('overlap', [False, True])
def test_retracted_requests_rejoin_the_queue_and_finish_with_identical_output(
    overlap: bool,
) -> None:
    sched = _pressure_scheduler(enable_overlap=overlap)
    reqs = _pressure_workload()
    _run_staggered(sched, reqs)
    assert sched.metrics.num_retracts_total > 0
    assert any(r.retraction_count for r in reqs)
    for req in reqs:
        assert req.finished_reason.kind is FinishKind.LENGTH
        assert req.output_ids == expected_outputs(req)
    per_robot = sum(sched.metrics.robot(f'r{i}').num_retracts for i in range(4))
    assert per_robot == sched.metrics.num_retracts_total
    assert sched.metrics.num_retracts_in_window(sched.clock()) == sched.metrics.num_retracts_total


def test_a_retracted_request_goes_to_the_back_of_the_queue() -> None:
    sched = _pressure_scheduler()
    reqs = _pressure_workload()
    for req in reqs[:3]:
        sched.add_request(req)
        sched.run_once()
        sched.run_once()
    sched.add_request(reqs[3])  # waits: the batch is full
    while not sched.metrics.num_retracts_total:
        sched.run_once()
    assert [r.rid for r in sched.waiting_queue] == ['q3', 'q2']
    assert reqs[2].is_retracted


def test_the_overlap_loop_gives_the_same_outputs_as_the_normal_loop() -> None:
    workload = [
        *_pressure_workload(),
        make_req('long', range(300, 330), 5),
        make_req('tiny', [7], 1),
    ]
    results = {}
    for overlap in (False, True):
        sched = _pressure_scheduler(enable_overlap=overlap, chunked_prefill_size=8)
        reqs = [clone_req(r) for r in workload]
        _run_staggered(sched, reqs)
        results[overlap] = {r.rid: (r.finished_reason.kind, r.output_ids) for r in reqs}
    assert results[True] == results[False]
    assert sched.metrics.num_retracts_total > 0
    assert results[False]['long'][1] == expected_outputs(workload[4])


def test_overlap_processes_results_one_step_late_and_decodes_from_future_tokens() -> None:
    sched = make_scheduler(enable_overlap=True)
    req = make_req('a', range(10, 15), 3)
    sched.add_request(req)
    sched.run_once()  # prefill launched, result pending
    assert req.output_ids == []
    sched.run_once()  # decode launched, prefill result processed
    assert len(req.output_ids) == 1
    first_decode = sched.runner.batches[1]
    assert first_decode.input_ids.tolist() == [FUTURE_TOKEN_ID]
    run_until_idle(sched)
    assert req.output_ids == expected_outputs(req)
    # one wasted decode: the step launched before the finish was seen
    assert [mode for mode, _ in launched(sched)] == ['extend', 'decode', 'decode', 'decode']


class _ProbeRunner:
    """Records how many results were unprocessed at each launch."""

    def __init__(self, sched) -> None:
        self.inner = sched.loop.runner
        self.sched = sched
        self.pending_at_launch: list[int] = []

    def launch(self, batch):
        self.pending_at_launch.append(len(self.sched.loop.result_queue))
        return self.inner.launch(batch)


@pytest.mark.parametrize(('disable', 'pending'), [(False, [0, 1]), (True, [0, 0])])
def test_consecutive_prefills_can_fall_back_to_synchronous_processing(
    disable: bool, pending: list[int]
) -> None:
    sched = make_scheduler(enable_overlap=True, disable_consecutive_prefill_overlap=disable)
    probe = _ProbeRunner(sched)
    sched.loop.runner = probe
    sched.add_request(make_req('a', range(10, 15), 2))
    sched.run_once()
    sched.add_request(make_req('b', range(20, 25), 2))
    sched.run_once()
    assert probe.pending_at_launch == pending


def test_latency_counters_follow_the_simulated_clock() -> None:
    cost = CostModel(
        prefill_base_ns=0,
        prefill_ns_per_token=MS,
        decode_base_ns=2 * MS,
        decode_ns_per_req=0,
        decode_ns_per_kv_token=0,
    )
    sched = make_scheduler(cost_model=cost)
    req = make_req('a', range(10, 15), 4, robot_id='r1')
    sched.add_request(req)
    run_until_idle(sched)
    robot = sched.metrics.robot('r1')
    assert robot.ttft.percentile_ms(50) == pytest.approx(5.0)  # 5 prompt tokens
    assert len(robot.itl) == 3
    assert robot.itl.percentile_ms(99) == pytest.approx(2.0)
    assert robot.arrival_to_finish.max_ms() == pytest.approx(11.0)
    assert req.times.token_ns == [5 * MS, 7 * MS, 9 * MS, 11 * MS]


def _processor(sched) -> ResultProcessor:
    return ResultProcessor(
        memory=sched.memory, metrics=sched.metrics, clock=sched.clock, finish=sched.finish
    )


def test_results_of_rows_retracted_or_finished_after_launch_are_skipped() -> None:
    sched = make_scheduler()
    retracted = make_req('re', range(10, 14), 5)
    readmitted = make_req('ad', range(20, 24), 5)
    finished = make_req('fi', range(30, 34), 5)
    reqs = (retracted, readmitted, finished)
    for req in reqs:
        admit_running(sched.memory, req, num_outputs=1)
    batch = ScheduleBatch(list(reqs))
    batch.prepare_for_decode(sched.memory)
    snapshot = batch.copy()
    for req in (retracted, readmitted):
        sched.memory.retract(req.kv)
        req.reset_for_retract()
    admit_running(sched.memory, readmitted, num_outputs=0)  # back in, prefilled again
    finished.finished_reason = FinishReason.length()
    _processor(sched).process(snapshot, ForwardOutput((1001, 1002, 1003)))
    assert [r.output_ids for r in reqs] == [[1000], [1000], [1000]]


def test_a_middle_chunk_only_counts_down_and_a_final_row_caches_the_prompt() -> None:
    sched = make_scheduler(page_size=2)
    req = make_req('c', range(10, 17), 3)
    sched.memory.match_prefix(req.kv)
    sched.memory.admit(req.kv)
    req.set_extend_range(0, 4)
    req.inflight_middle_chunks = 1
    batch = ScheduleBatch([req])
    batch.prepare_for_extend(sched.memory)
    _processor(sched).process(batch.copy(), ForwardOutput((-1,)))
    assert (req.inflight_middle_chunks, req.output_ids) == (0, [])
    req.set_extend_range(4, 7)
    batch.prepare_for_extend(sched.memory)
    _processor(sched).process(batch.copy(), ForwardOutput((1005,)))
    assert req.output_ids == [1005]
    assert req.kv.cache_protected_len == 6  # the page-aligned prompt is in the tree
