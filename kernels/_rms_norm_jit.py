"""Triton kernel behind :mod:`vla_sched.kernels.rms_norm`.

Imported on the first launch, not with the package, so that the 'torch' backend imports
without Triton and ``TRITON_INTERPRET`` only has to be set before the first launch.
Inputs are validated by the public launchers; this module only launches.
"""

# Triton spells compile-time constants in upper case.

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rms_norm_kernel(
    x_ptr,  # [T, hidden], unit stride in hidden
    residual_ptr,  # [T, hidden] (read only when HAS_RESIDUAL)
    weight_ptr,  # [hidden]
    out_ptr,  # [T, hidden] normalized rows
    residual_out_ptr,  # [T, hidden] x + residual (written only when HAS_RESIDUAL)
    stride_x,
    stride_residual,
    stride_out,
    stride_residual_out,
    eps,
    HIDDEN: tl.constexpr,
    BLOCK: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < HIDDEN
    dtype = out_ptr.dtype.element_ty
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        residual = tl.load(residual_ptr + row * stride_residual + offs, mask=mask, other=0.0)
        # Rounded to the activation dtype before the norm reads it, as a torch add would.
        x = (x.to(tl.float32) + residual.to(tl.float32)).to(dtype)
        tl.store(residual_out_ptr + row * stride_residual_out + offs, x, mask=mask)
    x32 = x.to(tl.float32)
    mean_square = tl.sum(x32 * x32, axis=0) / HIDDEN
    rstd = tl.math.rsqrt(mean_square + eps)
    normed = (x32 * rstd).to(dtype)  # transformers rounds before the weight's scale
    weight = tl.load(weight_ptr + offs, mask=mask, other=0.0)
    out = (weight.to(tl.float32) * normed.to(tl.float32)).to(dtype)
    tl.store(out_ptr + row * stride_out + offs, out, mask=mask)


def norm_num_warps(block: int) -> int:
    """Warps per row: 16 bytes of bf16 per thread and load at 4096 (8 warps), 1 to 16."""
    return max(1, min(16, block // 512))


def launch_rms_norm(
    *,
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor,
    eps: float,
    out: torch.Tensor,
    residual_out: torch.Tensor | None,
) -> None:
    """Launches one program per row; every argument was validated by the caller.

    Without a residual, ``x`` and ``out`` stand in for its pointers (never read or written).
    """
    num_rows, hidden = x.shape
    has_residual = residual is not None
    residual = residual if has_residual else x
    residual_out = residual_out if has_residual else out
    block = triton.next_power_of_2(hidden)
    _rms_norm_kernel[(num_rows,)](
        x,
        residual,
        weight,
        out,
        residual_out,
        x.stride(0),
        residual.stride(0),
        out.stride(0),
        residual_out.stride(0),
        eps,
        HIDDEN=hidden,
        BLOCK=block,
        HAS_RESIDUAL=has_residual,
        num_warps=norm_num_warps(block),
    )
