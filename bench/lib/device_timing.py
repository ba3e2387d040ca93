"""Timing work on a device, and the two rates every floor is measured against.

``Timer`` takes the median of many launches, rotating over input sets and flushing the L2
cache before each so that no launch finds its data cached; on a GPU it times with CUDA
events, on the CPU with the host clock. ``measure_rates`` gives the device-to-device copy
bandwidth (bytes read plus bytes written) and the matmul rate of a dtype, both through it.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

L2_FLUSH_BYTES = 256 << 20


class Timer:
    """Median milliseconds of ``fn(inputs)`` over rotating input sets, L2 flushed each time."""

    def __init__(self, device: torch.device, num_reps: int) -> None:
        if num_reps < 1:
            raise ValueError(f'num_reps must be >= 1, got {num_reps}')
        self.device = device
        self.num_reps = num_reps
        self.is_cuda = device.type == 'cuda'
        flush_bytes = L2_FLUSH_BYTES if self.is_cuda else 1
        self.flush_buffer = torch.empty(flush_bytes, dtype=torch.uint8, device=device)

    def median_ms(self, fn: Callable[[dict], object], input_sets: list[dict]) -> float:
        fn(input_sets[0])  # compile and warm up outside the measurement
        times = []
        for rep in range(self.num_reps):
            inputs = input_sets[rep % len(input_sets)]
            self.flush_buffer.zero_()
            if self.is_cuda:
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                fn(inputs)
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end))
            else:
                begin = time.perf_counter()
                fn(inputs)
                times.append((time.perf_counter() - begin) * 1e3)
        return statistics.median(times)


def copy_bandwidth_gbs(timer: Timer, num_bytes: int) -> float:
    """Device-to-device copy bandwidth in GB/s, counting bytes read plus bytes written."""

    def buffer() -> torch.Tensor:
        return torch.empty(num_bytes, dtype=torch.uint8, device=timer.device)

    sets = [{'src': buffer(), 'dst': buffer()} for _ in range(2)]
    ms = timer.median_ms(lambda s: s['dst'].copy_(s['src']), sets)
    return 2 * num_bytes / ms / 1e6


def matmul_tflops(timer: Timer, dtype: torch.dtype, n: int) -> float:
    """The rate of an ``n`` x ``n`` by ``n`` x ``n`` matmul in ``dtype``, in TFLOP/s."""
    a, b = (torch.randn(n, n, device=timer.device, dtype=dtype) for _ in 'ab')
    ms = timer.median_ms(lambda s: torch.mm(s['a'], s['b']), [{'a': a, 'b': b}])
    return 2 * n**3 / ms / 1e9


@dataclass(frozen=True, slots=True)
class MeasuredRates:
    """A device's copy bandwidth (reads + writes) and matmul rate of one dtype."""

    copy_gb_per_s: float
    matmul_tflops: float
    matmul_dtype: str


def measure_rates(
    device: torch.device, dtype: torch.dtype, *, num_reps: int = 10
) -> MeasuredRates:
    """Copy bandwidth over 1 GiB and an 8192-wide matmul on a GPU (64 MiB and 512 on a CPU)."""
    timer = Timer(device, num_reps)
    on_gpu = device.type == 'cuda'
    return MeasuredRates(
        copy_gb_per_s=copy_bandwidth_gbs(timer, (1 << 30) if on_gpu else (64 << 20)),
        matmul_tflops=matmul_tflops(timer, dtype, 8192 if on_gpu else 512),
        matmul_dtype=str(dtype).removeprefix('torch.'),
    )
