"""Part ``environment``: versions, the GPU, the decode kernel's builds on it (before any
timing: ``builds``), and the device's copy bandwidth and matmul rate (the rates every later
floor is set against, measured once here)."""

from __future__ import annotations

import importlib.metadata
import platform
from typing import Any

from bench.gpu_check.parts import PartContext

DISTRIBUTIONS = ('triton', 'transformers', 'msgpack', 'timm', 'safetensors', 'tokenizers')


def run(ctx: PartContext) -> dict[str, Any]:
    import numpy
    import torch

    from bench.gpu_check.builds import check_decode_builds
    from bench.lib.device_timing import measure_rates

    versions = {'python': platform.python_version(), 'torch': torch.__version__}
    versions['cuda'] = torch.version.cuda or ''
    versions['numpy'] = numpy.__version__
    versions.update({name: _dist_version(name) for name in DISTRIBUTIONS})
    ctx.require_cuda()
    gpu: dict[str, Any] = {'name': 'CPU (dry run)'}
    if not ctx.dry_run:
        props = torch.cuda.get_device_properties(0)
        gpu = {
            'name': props.name,
            'memory_gib': props.total_memory / 2**30,
            'num_sms': props.multi_processor_count,
            'capability': f'{props.major}.{props.minor}',
            'driver_visible_devices': torch.cuda.device_count(),
        }
    # Before any timing: does every decode variant build without spills and fit as planned?
    builds = check_decode_builds(
        dry_run=ctx.dry_run, progress=lambda line: print(line, flush=True)
    )
    rates = measure_rates(torch.device(ctx.device), ctx.dtype)
    print(
        f'copy {rates.copy_gb_per_s:.0f} GB/s, {rates.matmul_dtype} matmul '
        f'{rates.matmul_tflops:.1f} TFLOP/s',
        flush=True,
    )
    return {
        'versions': versions,
        'gpu': gpu,
        'kernel_builds': builds,
        'copy_gb_per_s': rates.copy_gb_per_s,
        'matmul_tflops': rates.matmul_tflops,
        'matmul_dtype': rates.matmul_dtype,
    }


def _dist_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return 'absent'


def summary_line(env: dict[str, Any]) -> str:
    """The machine, its versions and its rates in one line of the report."""
    v, gpu = env['versions'], env['gpu']
    memory = ''
    if 'memory_gib' in gpu:
        memory = f' ({gpu["memory_gib"]:.0f} GiB, {gpu["num_sms"]} SMs, sm_{gpu["capability"]})'
    return (
        f'{gpu["name"]}{memory}; Python {v["python"]}, torch {v["torch"]} '
        f'(CUDA {v["cuda"] or "-"}), triton {v["triton"]}, transformers '
        f'{v["transformers"]}, numpy {v["numpy"]}. Copy {env["copy_gb_per_s"]:.0f} GB/s '
        f'(reads + writes), {env["matmul_dtype"]} matmul {env["matmul_tflops"]:.3g} TFLOP/s.'
    )
