"""bench.lib.profile_table: the per-step table of a profile's kernels or CPU ops."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch.autograd import DeviceType

from bench.lib.profile_table import launch_counts, profile_rows

LONG_NAME = 'void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>'


def _event(key: str, kind: DeviceType, count: int, *, device_us=0.0, cpu_us=0.0):
    return SimpleNamespace(
        key=key,
        device_type=kind,
        count=count,
        self_device_time_total=device_us,
        self_cpu_time_total=cpu_us,
    )


EVENTS = [
    _event('aten::mm', DeviceType.CPU, 6, cpu_us=30.0, device_us=500.0),
    _event('cudaLaunchKernel', DeviceType.CPU, 8, cpu_us=40.0),
    _event('cudaGraphLaunch', DeviceType.CPU, 2, cpu_us=10.0),
    _event('nvjet_gemm_bf16', DeviceType.CUDA, 6, device_us=300.0),
    _event(LONG_NAME, DeviceType.CUDA, 4, device_us=100.0),
    _event('Memcpy HtoD (Pageable -> Device)', DeviceType.CUDA, 2, device_us=100.0),
    _event('never_ran', DeviceType.CUDA, 0, device_us=0.0),
]


def test_cuda_rows_are_the_gpu_events_per_step_sorted_by_total_time_with_whole_names():
    rows = profile_rows(EVENTS, device='cuda', num_steps=2)
    assert [r.name for r in rows] == [
        'nvjet_gemm_bf16', 'Memcpy HtoD (Pageable -> Device)', LONG_NAME,
    ]  # fmt: skip
    gemm = rows[0]
    assert (gemm.calls, gemm.total_us, gemm.mean_us) == (3.0, 150.0, 50.0)
    assert gemm.share == pytest.approx(0.6)
    assert sum(r.share for r in rows) == pytest.approx(1.0)
    assert rows[2].mean_us == pytest.approx(25.0)  # per call, not per step


def test_cpu_rows_take_each_operator_self_time_and_no_device_event():
    rows = profile_rows(EVENTS, device='cpu')
    assert [(r.name, r.total_us) for r in rows] == [
        ('cudaLaunchKernel', 40.0), ('aten::mm', 30.0), ('cudaGraphLaunch', 10.0),
    ]  # fmt: skip


def test_launch_counts_are_per_step_and_only_from_the_host_side():
    assert launch_counts(EVENTS, num_steps=2) == {'kernel_launches': 4.0, 'graph_launches': 1.0}
    assert launch_counts(EVENTS[3:]) == {'kernel_launches': 0.0, 'graph_launches': 0.0}


def test_bad_device_or_step_count_is_refused_by_name():
    with pytest.raises(ValueError, match='device'):
        profile_rows(EVENTS, device='mps')
    with pytest.raises(ValueError, match='num_steps'):
        profile_rows(EVENTS, device='cpu', num_steps=0)


def test_a_real_cpu_profile_gives_its_ops_with_shares_that_sum_to_one():
    x = torch.randn(32, 32)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            torch.mm(x, x).relu_()
    rows = profile_rows(prof.key_averages(), device='cpu', num_steps=3)
    by_name = {r.name: r for r in rows}
    assert by_name['aten::mm'].calls == 1.0 and by_name['aten::relu_'].calls == 1.0
    assert sum(r.share for r in rows) == pytest.approx(1.0)
    assert rows == sorted(rows, key=lambda r: -r.total_us)
    assert profile_rows(prof.key_averages(), device='cuda') == []
