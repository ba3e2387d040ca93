"""Triton kernel behind :mod:`vla_sched.kernels.activation`.

Imported on the first launch, not with the package, so that the 'torch' backend imports
without Triton and ``TRITON_INTERPRET`` only has to be set before the first launch.
Inputs are validated by the public launcher; this module only launches.
"""

# Triton spells compile-time constants in upper case.

from __future__ import annotations

import torch
import triton
import triton.language as tl

MAX_BLOCK = 1024  # columns per program: 4 warps, 16 bytes of bf16 per thread and load


@triton.jit
def _silu_and_mul_kernel(
    gate_up_ptr,  # [T, 2 * INNER], unit stride in the last dimension
    out_ptr,  # [T, INNER], contiguous
    stride_gate_up,
    INNER: tl.constexpr,
    BLOCK: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < INNER
    dtype = out_ptr.dtype.element_ty
    row = gate_up_ptr + token * stride_gate_up
    gate = tl.load(row + offs, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(row + INNER + offs, mask=mask, other=0.0)
    silu = (gate / (1.0 + tl.exp(-gate))).to(dtype)  # rounded as torch's silu rounds it
    out = (silu.to(tl.float32) * up.to(tl.float32)).to(dtype)
    tl.store(out_ptr + token * INNER + offs, out, mask=mask)


def activation_block(inner: int) -> int:
    """Columns per program: the whole row up to ``MAX_BLOCK``."""
    return min(triton.next_power_of_2(inner), MAX_BLOCK)


def launch_silu_and_mul(*, gate_up: torch.Tensor, out: torch.Tensor) -> None:
    """Launches a program per token and block of columns; arguments validated by the caller."""
    num_tokens, inner = out.shape
    block = activation_block(inner)
    _silu_and_mul_kernel[(num_tokens, triton.cdiv(inner, block))](
        gate_up,
        out,
        gate_up.stride(0),
        INNER=inner,
        BLOCK=block,
        num_warps=max(1, min(4, block // 256)),
    )
