"""Triton kernel behind :mod:`vla_sched.kernels.rotary`.

Imported on the first launch, not with the package, so that the 'torch' backend imports
without Triton and ``TRITON_INTERPRET`` only has to be set before the first launch.
Inputs are validated by the public launcher; this module only launches.
"""

# Triton spells compile-time constants in upper case.

from __future__ import annotations

import torch
import triton
import triton.language as tl

HALF_ELEMENTS_PER_PROGRAM = 1024  # heads x half head_dim per program: 2048 values rotated
# Built without fp fusion: an fma would skip the rounding of the second product to the
# activation dtype, where torch rounds it (the sm_90 build check builds it the same way).
ROTARY_BUILD_OPTIONS = {'enable_fp_fusion': False}


@triton.jit
def _rotary_kernel(
    qk_ptr,  # [T, H, D], any token/head strides, unit stride in D; rotated in place
    cos_ptr,  # [T, D], unit stride in D
    signed_sin_ptr,  # [T, D], first half negated
    stride_qk_token,
    stride_qk_head,
    stride_cos_token,
    stride_sin_token,
    NUM_HEADS: tl.constexpr,
    HALF_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    offs_h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_HALF)
    mask_d = offs_d < HALF_DIM
    mask = (offs_h[:, None] < NUM_HEADS) & mask_d[None, :]
    dtype = qk_ptr.dtype.element_ty

    cos_row = cos_ptr + token * stride_cos_token
    sin_row = signed_sin_ptr + token * stride_sin_token
    cos_1 = tl.load(cos_row + offs_d, mask=mask_d, other=0.0).to(tl.float32)[None, :]
    cos_2 = tl.load(cos_row + HALF_DIM + offs_d, mask=mask_d, other=0.0).to(tl.float32)[None, :]
    sin_1 = tl.load(sin_row + offs_d, mask=mask_d, other=0.0).to(tl.float32)[None, :]
    sin_2 = tl.load(sin_row + HALF_DIM + offs_d, mask=mask_d, other=0.0).to(tl.float32)[None, :]

    first = qk_ptr + token * stride_qk_token + offs_h[:, None] * stride_qk_head + offs_d[None, :]
    x_1 = tl.load(first, mask=mask, other=0.0).to(tl.float32)
    x_2 = tl.load(first + HALF_DIM, mask=mask, other=0.0).to(tl.float32)
    # Each product rounded to the activation dtype, then the sum: torch's three ops.
    out_1 = (x_1 * cos_1).to(dtype).to(tl.float32) + (x_2 * sin_1).to(dtype).to(tl.float32)
    out_2 = (x_2 * cos_2).to(dtype).to(tl.float32) + (x_1 * sin_2).to(dtype).to(tl.float32)
    tl.store(first, out_1.to(dtype), mask=mask)
    tl.store(first + HALF_DIM, out_2.to(dtype), mask=mask)


def rotary_blocks(num_heads: int, head_dim: int) -> tuple[int, int]:
    """``(BLOCK_H, BLOCK_HALF)``: the half head dimension and as many heads as fill about
    ``HALF_ELEMENTS_PER_PROGRAM`` values."""
    block_half = triton.next_power_of_2(head_dim // 2)
    heads_fit = max(1, HALF_ELEMENTS_PER_PROGRAM // block_half)
    return min(triton.next_power_of_2(num_heads), heads_fit), block_half


def launch_rotary_embedding(
    *, qk: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor
) -> None:
    """Launches a program per token and block of heads; arguments validated by the caller."""
    num_tokens, num_heads, head_dim = qk.shape
    block_h, block_half = rotary_blocks(num_heads, head_dim)
    _rotary_kernel[(num_tokens, triton.cdiv(num_heads, block_h))](
        qk,
        cos,
        signed_sin,
        qk.stride(0),
        qk.stride(1),
        cos.stride(0),
        signed_sin.stride(0),
        NUM_HEADS=num_heads,
        HALF_DIM=head_dim // 2,
        BLOCK_H=block_h,
        BLOCK_HALF=block_half,
        num_warps=4,
        **ROTARY_BUILD_OPTIONS,
    )
