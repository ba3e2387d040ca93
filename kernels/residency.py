"""How many programs of a compiled kernel one SM holds at once, from the build itself.

The decode split rule (``decode_attention.choose_num_kv_splits``) plans whole waves of
resident programs, and how many fit depends on the registers and shared memory the compiler
gave the kernel, which change with the Triton version (the decode kernel for 16 query heads
at head dim 80: 87 registers per thread with Triton 3.8, 121 with 3.6). So the number comes
from the build:

- ``KernelBuild``: registers per thread, spilled bytes, shared memory and warps of one
  compiled variant; ``build_of(compiled)`` reads them from Triton's compiled kernel on the
  device (``n_regs``, ``n_spills``, ``metadata.shared``, ``metadata.num_warps``), and the
  sm_90 build check reads the same numbers from ptxas's report without a GPU;
- ``DeviceLimits``: the SM's register file, shared memory, threads and program slots,
  ``device_limits(device)`` from ``torch.cuda.get_device_properties`` (``SM90`` for the
  H100/H200 without one);
- ``resident_programs(build, limits)``: the one computation both use.

The launchers record every variant they launch on a GPU (``record_launch``;
``launched_builds()`` lists them with their resident programs), so a benchmark can report
what ran. Pure Python: no Triton or CUDA call here.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass
from typing import Any

# Registers are allocated per thread in multiples of this on sm_70 and later.
REGISTER_GRANULE = 8
# Program (block) slots per SM by compute capability major.minor (CUDA's occupancy tables).
MAX_PROGRAMS_PER_SM = {(7, 0): 32, (7, 5): 16, (8, 0): 32, (8, 6): 16, (8, 9): 24, (9, 0): 32}


@dataclass(frozen=True, slots=True)
class DeviceLimits:
    """Per-SM resources: the register file (32-bit registers), shared memory in bytes (of
    which ``shared_reserved_per_program`` go to the runtime per resident program), threads
    and program slots."""

    num_sms: int
    registers_per_sm: int
    shared_bytes_per_sm: int
    max_threads_per_sm: int
    max_programs_per_sm: int
    shared_reserved_per_program: int = 1024


# The H100/H200 (sm_90): 64K registers, 228 KB shared memory, 2048 threads, 32 programs.
SM90 = DeviceLimits(
    num_sms=132,
    registers_per_sm=64 * 1024,
    shared_bytes_per_sm=228 * 1024,
    max_threads_per_sm=2048,
    max_programs_per_sm=32,
)


@dataclass(frozen=True, slots=True)
class KernelBuild:
    """What the compiler gave one kernel variant: registers per thread, bytes spilled to
    local memory, shared memory per program in bytes, warps per program."""

    registers: int
    spills: int
    shared_bytes: int
    num_warps: int


def resident_programs(build: KernelBuild, limits: DeviceLimits) -> int:
    """Programs of ``build`` one SM holds at once: the fewest its registers, shared memory,
    threads and program slots allow (at least 1: a kernel that launches runs one)."""
    threads = 32 * build.num_warps
    registers = -(-max(build.registers, 1) // REGISTER_GRANULE) * REGISTER_GRANULE
    by_registers = limits.registers_per_sm // (registers * threads)
    by_shared = limits.shared_bytes_per_sm // (
        build.shared_bytes + limits.shared_reserved_per_program
    )
    by_threads = limits.max_threads_per_sm // threads
    return max(min(by_registers, by_shared, by_threads, limits.max_programs_per_sm), 1)


@functools.cache
def device_limits(device) -> DeviceLimits:
    """The limits of CUDA device ``device`` (a ``torch.device`` or index), from its
    properties; read once per device."""
    import torch

    props = torch.cuda.get_device_properties(device)
    capability = (props.major, props.minor)
    return DeviceLimits(
        num_sms=props.multi_processor_count,
        registers_per_sm=getattr(props, 'regs_per_multiprocessor', 0) or 64 * 1024,
        shared_bytes_per_sm=props.shared_memory_per_multiprocessor,
        max_threads_per_sm=props.max_threads_per_multi_processor,
        max_programs_per_sm=MAX_PROGRAMS_PER_SM.get(capability, 16 if props.major < 9 else 32),
    )


def build_of(compiled) -> KernelBuild:
    """The build of Triton's compiled kernel ``compiled`` (loaded on the current device)."""
    if getattr(compiled, 'n_regs', None) is None:
        compiled._init_handles()  # loads the binary: the driver reports registers and spills
    return KernelBuild(
        registers=int(compiled.n_regs),
        spills=int(compiled.n_spills),
        shared_bytes=int(compiled.metadata.shared),
        num_warps=int(compiled.metadata.num_warps),
    )


_LAUNCHED: dict[tuple[int, str], dict[str, Any]] = {}


def record_launch(kernel: str, variant: dict[str, Any], compiled, device) -> None:
    """Notes that ``compiled`` (what Triton's launch returned) ran as ``kernel`` with the
    compile-time ``variant`` on CUDA device ``device``; once per variant. Nothing off a GPU
    (the interpreter returns no compiled kernel)."""
    if compiled is None or not hasattr(compiled, 'metadata'):
        return
    key = (id(compiled), str(device))
    if key in _LAUNCHED:
        return
    build = build_of(compiled)
    _LAUNCHED[key] = dict(
        kernel=kernel,
        variant=dict(variant),
        **asdict(build),
        resident=resident_programs(build, device_limits(device)),
    )


def launched_builds() -> list[dict[str, Any]]:
    """Every variant launched on a GPU in this process, with its build and resident
    programs."""
    return [dict(entry) for entry in _LAUNCHED.values()]
