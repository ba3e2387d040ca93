"""The table a profile is read from: each kernel (or CPU op) with its calls, total and mean
time and share, from torch.profiler's key averages.

``profile_rows`` takes the ``key_averages()`` of a profile that covered ``num_steps`` runs of
one step and gives, per step, the device's work on ``device``: on ``cuda`` every event the
GPU ran (kernels, memcpy, memset) with its device time; on ``cpu`` every operator with its
self time (so no time is counted twice in a nested op). Names are kept whole, rows are
sorted by total time (longest first), and the shares sum to 1 over the rows. It reads only
an event's ``key``, ``count``, ``device_type`` and times, so any object with those works.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

DEVICES = ('cuda', 'cpu')
# Host calls that launch work on a CUDA device (the CPU side of a profile).
LAUNCH_CALLS = {
    'kernel_launches': ('cudaLaunchKernel', 'cuLaunchKernel', 'cuLaunchKernelEx'),
    'graph_launches': ('cudaGraphLaunch', 'cuGraphLaunch'),
}


@dataclass(frozen=True, slots=True)
class ProfileRow:
    """One kernel (or CPU op) per profiled step: calls, total and mean microseconds, and its
    share of the table's total time."""

    name: str
    calls: float
    total_us: float
    mean_us: float
    share: float


def _device_name(event: Any) -> str:
    kind = event.device_type
    return str(getattr(kind, 'name', kind)).lower()


def profile_rows(events: Iterable[Any], *, device: str, num_steps: int = 1) -> list[ProfileRow]:
    """The per-step table of ``device``'s events (see the module doc).

    Args:
        events: ``profiler.key_averages()`` (or objects with the same attributes).
        device: ``cuda`` (device time of what the GPU ran) or ``cpu`` (operators' self time).
        num_steps: How many runs of the step the profile covered; calls and totals are per
            step (the mean is per call).
    """
    if device not in DEVICES:
        raise ValueError(f'device must be one of {DEVICES}, got {device!r}')
    if num_steps < 1:
        raise ValueError(f'num_steps must be >= 1, got {num_steps}')
    totals: dict[str, list[float]] = {}  # name: [calls, total us]
    for event in events:
        if _device_name(event) != device:
            continue
        us = event.self_device_time_total if device == 'cuda' else event.self_cpu_time_total
        if us <= 0:
            continue
        calls_and_us = totals.setdefault(event.key, [0, 0.0])
        calls_and_us[0] += event.count
        calls_and_us[1] += us
    whole_us = sum(us for _, us in totals.values())
    rows = [
        ProfileRow(
            name=name,
            calls=calls / num_steps,
            total_us=us / num_steps,
            mean_us=us / calls if calls else 0.0,
            share=us / whole_us,
        )
        for name, (calls, us) in totals.items()
    ]
    return sorted(rows, key=lambda r: (-r.total_us, r.name))


def launch_counts(events: Iterable[Any], *, num_steps: int = 1) -> dict[str, float]:
    """Host calls per step that launched kernels one by one and CUDA graphs (the CPU side
    of a GPU profile; all zero on a CPU)."""
    counts = dict.fromkeys(LAUNCH_CALLS, 0.0)
    for event in events:
        if _device_name(event) != 'cpu':
            continue
        for label, names in LAUNCH_CALLS.items():
            if event.key in names:
                counts[label] += event.count / num_steps
    return counts
