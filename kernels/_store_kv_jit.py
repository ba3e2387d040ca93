"""Triton kernel behind :func:`vla_sched.kernels.store_kv.store_kv`.

Imported on the first launch, not with the package, so that the 'torch' backend imports
without Triton and ``TRITON_INTERPRET`` only has to be set before the first launch.
Inputs are validated by the public launcher; this module only launches.
"""

# Triton spells compile-time constants in upper case.

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vla_sched.kernels.residency import record_launch


@triton.jit
def _store_kv_kernel(
    k_ptr,  # [T, Hkv, D], any token/head strides, unit stride in D
    v_ptr,  # [T, Hkv, Dv]
    k_cache_ptr,  # [num_slots, Hkv, D], contiguous
    v_cache_ptr,  # [num_slots, Hkv, Dv], contiguous
    loc_ptr,  # [T] slot of each token
    stride_k_token,
    stride_k_head,
    stride_v_token,
    stride_v_head,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    V_HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(loc_ptr + token).to(tl.int64)
    offs_h = tl.arange(0, BLOCK_H)
    mask_h = offs_h < NUM_KV_HEADS

    offs_d = tl.arange(0, BLOCK_D)
    mask_k = mask_h[:, None] & (offs_d[None, :] < HEAD_DIM)
    src_k = k_ptr + token * stride_k_token + offs_h[:, None] * stride_k_head + offs_d[None, :]
    dst_k = k_cache_ptr + slot * (NUM_KV_HEADS * HEAD_DIM)
    dst_k += offs_h[:, None] * HEAD_DIM + offs_d[None, :]
    tl.store(dst_k, tl.load(src_k, mask=mask_k), mask=mask_k)

    offs_dv = tl.arange(0, BLOCK_DV)
    mask_v = mask_h[:, None] & (offs_dv[None, :] < V_HEAD_DIM)
    src_v = v_ptr + token * stride_v_token + offs_h[:, None] * stride_v_head + offs_dv[None, :]
    dst_v = v_cache_ptr + slot * (NUM_KV_HEADS * V_HEAD_DIM)
    dst_v += offs_h[:, None] * V_HEAD_DIM + offs_dv[None, :]
    tl.store(dst_v, tl.load(src_v, mask=mask_v), mask=mask_v)


def launch_store_kv(
    *,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    out_cache_loc: torch.Tensor,
) -> None:
    """Launches one program per token; every argument was validated by the caller."""
    num_tokens, num_kv_heads, head_dim = k.shape
    v_head_dim = v.shape[2]
    compiled = _store_kv_kernel[(num_tokens,)](
        k,
        v,
        k_cache,
        v_cache,
        out_cache_loc,
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        NUM_KV_HEADS=num_kv_heads,
        HEAD_DIM=head_dim,
        V_HEAD_DIM=v_head_dim,
        BLOCK_H=triton.next_power_of_2(num_kv_heads),
        BLOCK_D=triton.next_power_of_2(head_dim),
        BLOCK_DV=triton.next_power_of_2(v_head_dim),
        num_warps=4,
    )
    if k.device.type == 'cuda':
        variant = dict(dtype=str(k.dtype).removeprefix('torch.'), HEAD_DIM=head_dim)
        record_launch('store_kv', dict(variant, NUM_KV_HEADS=num_kv_heads), compiled, k.device)
