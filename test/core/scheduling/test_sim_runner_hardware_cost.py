"""The simulated runner's hardware cost model: FLOPs and bytes over a device's rates."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from sched_testing import make_req, make_scheduler, run_until_idle

from vla_sched.core.forward_batch import ForwardMode, ImageInput
from vla_sched.testing.sim_runner import HardwareCostModel

GB = 1e9


def _cost(**changes: float) -> HardwareCostModel:
    values = {
        'decoder_flops_per_token': 1e9,
        'vision_flops_per_image': 50e9,
        'decoder_weight_bytes': 2 * GB,
        'vision_weight_bytes': 0.5 * GB,
        'kv_bytes_per_token': 1e6,
        'matmul_flops_per_s': 100e12,
        'memory_bytes_per_s': 1000 * GB,
    }
    return HardwareCostModel(**{**values, **changes})


def test_a_decode_pass_reads_the_weights_once_whatever_the_batch():
    cost = _cost(decode_fixed_ns=1e6)
    one = cost.decode_ns(1, 100)
    eight = cost.decode_ns(8, 800)
    assert one == pytest.approx(1e6 + 2e6 + 0.1e6)  # fixed + 2 GB + 100 MB at 1000 GB/s
    assert eight - one == pytest.approx(cost.kv_ns(700))


def test_a_prefill_pass_costs_its_flops_or_its_bytes_whichever_is_larger():
    cost = _cost()
    many = cost.prefill_ns(1000, 0)  # 1 TFLOP: 10 ms of compute beats 3 ms of memory
    assert many == pytest.approx(1000 * 1e9 / 100e12 * 1e9)
    few = cost.prefill_ns(10, 0)  # 10 GFLOP: 0.1 ms of compute, the weights take 2 ms
    assert few == pytest.approx(cost.weight_read_ns(2 * GB) + cost.kv_ns(10))
    with_image = cost.prefill_ns(10, 1)  # 60 GFLOP, and the vision weights come along
    assert with_image == pytest.approx(cost.weight_read_ns(2.5 * GB) + cost.kv_ns(10))
    slower = _cost(compute_utilization=0.5, prefill_fixed_ns=5e6)
    assert slower.prefill_ns(1000, 0) == pytest.approx(5e6 + 2 * many)


def test_the_runner_queues_each_pass_for_its_cost_and_counts_an_image_once():
    cost = _cost(vision_flops_per_image=2e12, prefill_fixed_ns=1e6, decode_fixed_ns=1e6)
    sched = make_scheduler(cost_model=cost, chunked_prefill_size=16, max_prefill_tokens=16)
    image = ImageInput(
        content_hash=7, token_offset=1, num_tokens=20, pixels=np.zeros((1, 1, 3), np.uint8)
    )
    sched.add_request(make_req('a', [1, *[500] * 20, 2, 3, 4], 3, images=[image]))
    run_until_idle(sched)
    steps = sched.runner.steps
    modes = [s.forward_mode for s in steps]
    assert modes == [
        ForwardMode.EXTEND,
        ForwardMode.EXTEND,
        ForwardMode.DECODE,
        ForwardMode.DECODE,
    ]
    durations = [s.end_ns - s.start_ns for s in steps]
    assert durations[0] == round(cost.prefill_ns(16, 1))  # holds the image's first token
    assert durations[1] == round(cost.prefill_ns(8, 0, num_prefix_tokens=16))
    assert durations[2] == round(cost.decode_ns(1, 25))
    assert durations[3] == round(cost.decode_ns(1, 26))
    assert all(a.end_ns <= b.start_ns for a, b in itertools.pairwise(steps))


def test_a_hardware_cost_model_refuses_rates_that_are_not_positive():
    with pytest.raises(ValueError, match='memory_bytes_per_s'):
        _cost(memory_bytes_per_s=0.0)
    with pytest.raises(ValueError, match='compute_utilization'):
        _cost(compute_utilization=-0.5)
    with pytest.raises(ValueError, match='prefill_fixed_ns'):
        _cost(prefill_fixed_ns=-1.0)
