"""Triton kernels behind :func:`vla_sched.kernels.decode_attention.decode_attention`.

Imported on the first launch, not with the package, so that the 'torch' backend imports
without Triton and ``TRITON_INTERPRET`` only has to be set before the first launch.
Inputs are validated by the public launcher; this module only launches.

Split ``s`` of a request with ``seq_len`` tokens and ``n`` splits covers positions
``[s * L, min((s + 1) * L, seq_len))`` with ``L = ceil(ceil(seq_len / n) / SPLIT_ALIGN) *
SPLIT_ALIGN``; both stages compute the same ``L``, and splits that start at or past
``seq_len`` are skipped by both.
"""

# Triton spells compile-time constants in upper case, and a constexpr branch is clearer as
# an if/else block than as a ternary.
# ruff: noqa: SIM108

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vla_sched.kernels._validate import check_interpreter_numpy
from vla_sched.kernels.attention_configs import DecodeConfig
from vla_sched.kernels.residency import KernelBuild, build_of, record_launch

LOG2E = 1.4426950408889634  # scores are kept in base 2 so the kernels can use exp2
STAGE2_WARPS, STAGE2_STAGES = 4, 2


@triton.jit
def _split_len(
    seq_len, num_splits_ptr, batch, MAX_KV_SPLITS: tl.constexpr, SPLIT_ALIGN: tl.constexpr
):
    num_splits = tl.load(num_splits_ptr + batch)
    num_splits = tl.minimum(tl.maximum(num_splits, 1), MAX_KV_SPLITS)
    split_len = tl.cdiv(tl.cdiv(seq_len, num_splits), SPLIT_ALIGN) * SPLIT_ALIGN
    return tl.maximum(split_len, SPLIT_ALIGN)  # never 0, even for an empty request


@triton.jit
def _decode_stage1_kernel(
    q_ptr,  # [B, Hq, D], unit stride in D
    k_cache_ptr,  # [num_slots, Hkv, D], contiguous
    v_cache_ptr,  # [num_slots, Hkv, Dv], contiguous
    req_to_token_ptr,  # [num_rows, max_context_len], contiguous
    req_pool_indices_ptr,  # [B]
    seq_lens_ptr,  # [B]
    num_kv_splits_ptr,  # [B] int32
    attn_logits_ptr,  # [B, Hq, MAX_KV_SPLITS, Dv] fp32, contiguous
    attn_lse_ptr,  # [B, Hq, MAX_KV_SPLITS] fp32, contiguous
    sm_scale_log2,  # sm_scale * log2(e)
    stride_q_batch,
    stride_q_head,
    stride_req_row,
    NUM_Q_HEADS: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    GROUP: tl.constexpr,  # query heads per KV head
    NUM_HEAD_BLOCKS: tl.constexpr,  # ceil(GROUP / BLOCK_H)
    HEAD_DIM: tl.constexpr,
    V_HEAD_DIM: tl.constexpr,
    MAX_KV_SPLITS: tl.constexpr,
    SPLIT_ALIGN: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    DOT_FP32: tl.constexpr,  # upcast tiles and use exact fp32 dots
):
    batch = tl.program_id(0)
    kv_head = tl.program_id(1) // NUM_HEAD_BLOCKS
    head_block = tl.program_id(1) % NUM_HEAD_BLOCKS
    split = tl.program_id(2)

    seq_len = tl.load(seq_lens_ptr + batch).to(tl.int32)
    split_len = _split_len(seq_len, num_kv_splits_ptr, batch, MAX_KV_SPLITS, SPLIT_ALIGN)
    split_start = split * split_len
    split_end = tl.minimum(split_start + split_len, seq_len)
    if split_end > split_start:
        offs_g = head_block * BLOCK_H + tl.arange(0, BLOCK_H)
        mask_h = offs_g < GROUP
        q_heads = kv_head * GROUP + offs_g
        offs_d = tl.arange(0, BLOCK_D)
        mask_d = offs_d < HEAD_DIM
        offs_dv = tl.arange(0, BLOCK_DV)
        mask_dv = offs_dv < V_HEAD_DIM

        q_offs = batch.to(tl.int64) * stride_q_batch + q_heads[:, None] * stride_q_head
        q = tl.load(
            q_ptr + q_offs + offs_d[None, :], mask=mask_h[:, None] & mask_d[None, :], other=0.0
        )
        if DOT_FP32:
            q = q.to(tl.float32)
        row = tl.load(req_pool_indices_ptr + batch).to(tl.int64)
        slot_row_ptr = req_to_token_ptr + row * stride_req_row
        k_head_ptr = k_cache_ptr + kv_head * HEAD_DIM
        v_head_ptr = v_cache_ptr + kv_head * V_HEAD_DIM

        m_i = tl.full([BLOCK_H], float('-inf'), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
        acc = tl.zeros([BLOCK_H, BLOCK_DV], dtype=tl.float32)
        for start in range(split_start, split_end, BLOCK_N):
            offs_n = start + tl.arange(0, BLOCK_N)
            mask_n = offs_n < split_end
            slots = tl.load(slot_row_ptr + offs_n, mask=mask_n, other=0).to(tl.int64)
            k = tl.load(
                k_head_ptr + slots[None, :] * (NUM_KV_HEADS * HEAD_DIM) + offs_d[:, None],
                mask=mask_n[None, :] & mask_d[:, None],
                other=0.0,
            )  # [BLOCK_D, BLOCK_N]
            if DOT_FP32:
                qk = tl.dot(q, k.to(tl.float32), input_precision='ieee')
            else:
                qk = tl.dot(q, k)
            qk = tl.where(mask_n[None, :], qk * sm_scale_log2, float('-inf'))
            m_new = tl.maximum(m_i, tl.max(qk, 1))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(qk - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(
                v_head_ptr + slots[:, None] * (NUM_KV_HEADS * V_HEAD_DIM) + offs_dv[None, :],
                mask=mask_n[:, None] & mask_dv[None, :],
                other=0.0,
            )  # [BLOCK_N, BLOCK_DV]
            if DOT_FP32:
                pv = tl.dot(p, v.to(tl.float32), input_precision='ieee')
            else:
                pv = tl.dot(p.to(v.dtype), v)
            acc = acc * alpha[:, None] + pv
            m_i = m_new

        scratch_row = (batch * NUM_Q_HEADS + q_heads).to(tl.int64) * MAX_KV_SPLITS + split
        tl.store(
            attn_logits_ptr + scratch_row[:, None] * V_HEAD_DIM + offs_dv[None, :],
            acc / l_i[:, None],
            mask=mask_h[:, None] & mask_dv[None, :],
        )
        # Natural-log log-sum-exp of the split's scaled scores (base-2 state times ln 2).
        lse = (m_i + tl.log2(l_i)) * 0.6931471805599453
        tl.store(attn_lse_ptr + scratch_row, lse, mask=mask_h)


@triton.jit
def _decode_stage2_kernel(
    attn_logits_ptr,  # [B, Hq, MAX_KV_SPLITS, Dv] fp32, contiguous
    attn_lse_ptr,  # [B, Hq, MAX_KV_SPLITS] fp32, contiguous
    seq_lens_ptr,  # [B]
    num_kv_splits_ptr,  # [B] int32
    out_ptr,  # [B, Hq, Dv], unit stride in Dv
    stride_out_batch,
    stride_out_head,
    NUM_Q_HEADS: tl.constexpr,
    V_HEAD_DIM: tl.constexpr,
    MAX_KV_SPLITS: tl.constexpr,
    SPLIT_ALIGN: tl.constexpr,
    BLOCK_DV: tl.constexpr,
):
    batch = tl.program_id(0)
    head = tl.program_id(1)
    seq_len = tl.load(seq_lens_ptr + batch).to(tl.int32)
    split_len = _split_len(seq_len, num_kv_splits_ptr, batch, MAX_KV_SPLITS, SPLIT_ALIGN)
    num_active = tl.cdiv(seq_len, split_len)
    offs_dv = tl.arange(0, BLOCK_DV)
    mask_dv = offs_dv < V_HEAD_DIM
    scratch_row = (batch * NUM_Q_HEADS + head).to(tl.int64) * MAX_KV_SPLITS

    running_max = float('-inf')
    denom = 0.0
    acc = tl.zeros([BLOCK_DV], dtype=tl.float32)
    for split in range(0, num_active):
        lse = tl.load(attn_lse_ptr + scratch_row + split)
        partial = tl.load(
            attn_logits_ptr + (scratch_row + split) * V_HEAD_DIM + offs_dv, mask=mask_dv, other=0.0
        )
        new_max = tl.maximum(running_max, lse)
        old_scale = tl.exp(running_max - new_max)
        weight = tl.exp(lse - new_max)
        acc = acc * old_scale + weight * partial
        denom = denom * old_scale + weight
        running_max = new_max

    result = tl.where(denom > 0.0, acc / denom, 0.0)
    out_offs = batch.to(tl.int64) * stride_out_batch + head * stride_out_head
    tl.store(out_ptr + out_offs + offs_dv, result.to(out_ptr.dtype.element_ty), mask=mask_dv)


def stage1_constexprs(
    *,
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    v_head_dim: int,
    max_kv_splits: int,
    config: DecodeConfig,
    dot_fp32: bool,
) -> dict:
    """Stage 1's compile-time arguments for a shape and launch config: what a launch
    compiles, and what a build check or the residency of ``stage1_build`` compiles."""
    group = num_q_heads // num_kv_heads
    return dict(
        NUM_Q_HEADS=num_q_heads,
        NUM_KV_HEADS=num_kv_heads,
        GROUP=group,
        NUM_HEAD_BLOCKS=triton.cdiv(group, config.block_h),
        HEAD_DIM=head_dim,
        V_HEAD_DIM=v_head_dim,
        MAX_KV_SPLITS=max_kv_splits,
        SPLIT_ALIGN=config.split_align,
        BLOCK_H=config.block_h,
        BLOCK_N=config.block_n,
        BLOCK_D=triton.next_power_of_2(head_dim),
        BLOCK_DV=triton.next_power_of_2(v_head_dim),
        DOT_FP32=dot_fp32,
    )


def stage1_build(
    *,
    dtype: torch.dtype,
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    v_head_dim: int,
    max_kv_splits: int,
    config: DecodeConfig,
) -> KernelBuild:
    """Compiles stage 1 for the current CUDA device without launching it (Triton's warmup,
    which fills the same kernel cache a launch reads) and returns its build: 16-byte aligned
    tensors of ``dtype`` (int64 request indices and lengths, as the engine passes them) and
    strides divisible by 16, as a launch from the model has them."""
    constexprs = stage1_constexprs(
        num_q_heads=num_q_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        v_head_dim=v_head_dim,
        max_kv_splits=max_kv_splits,
        config=config,
        dot_fp32=dtype == torch.float32,
    )
    compiled = _decode_stage1_kernel.warmup(
        dtype,  # q
        dtype,  # k_cache
        dtype,  # v_cache
        torch.int32,  # req_to_token
        torch.int64,  # req_pool_indices
        torch.int64,  # seq_lens
        torch.int32,  # num_kv_splits
        torch.float32,  # attn_logits
        torch.float32,  # attn_lse
        1.0,
        num_q_heads * head_dim,
        head_dim,
        16,
        grid=(1,),
        **constexprs,
        num_warps=config.num_warps,
        num_stages=config.num_stages,
    )
    return build_of(compiled)


def launch_decode_attention(
    *,
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    out: torch.Tensor,
    attn_logits: torch.Tensor,
    attn_lse: torch.Tensor,
    num_kv_splits: torch.Tensor,
    sm_scale: float,
    config: DecodeConfig,
) -> None:
    """Launches stage 1 with ``config`` and stage 2; every argument was validated by the
    caller. On a GPU each variant launched is recorded (``residency.record_launch``)."""
    if q.device.type != 'cuda':
        check_interpreter_numpy()
    batch_size, num_q_heads, head_dim = q.shape
    num_kv_heads, v_head_dim = v_cache.shape[1], v_cache.shape[2]
    max_kv_splits = attn_logits.shape[2]
    constexprs = stage1_constexprs(
        num_q_heads=num_q_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        v_head_dim=v_head_dim,
        max_kv_splits=max_kv_splits,
        config=config,
        dot_fp32=q.dtype == torch.float32 or q.device.type != 'cuda',
    )
    stage1 = _decode_stage1_kernel[
        (batch_size, num_kv_heads * constexprs['NUM_HEAD_BLOCKS'], max_kv_splits)
    ](
        q,
        k_cache,
        v_cache,
        req_to_token,
        req_pool_indices,
        seq_lens,
        num_kv_splits,
        attn_logits,
        attn_lse,
        sm_scale * LOG2E,
        q.stride(0),
        q.stride(1),
        req_to_token.stride(0),
        **constexprs,
        num_warps=config.num_warps,
        num_stages=config.num_stages,
    )
    stage2_constexprs = dict(
        NUM_Q_HEADS=num_q_heads,
        V_HEAD_DIM=v_head_dim,
        MAX_KV_SPLITS=max_kv_splits,
        SPLIT_ALIGN=config.split_align,
        BLOCK_DV=constexprs['BLOCK_DV'],
    )
    stage2 = _decode_stage2_kernel[(batch_size, num_q_heads)](
        attn_logits,
        attn_lse,
        seq_lens,
        num_kv_splits,
        out,
        out.stride(0),
        out.stride(1),
        **stage2_constexprs,
        num_warps=STAGE2_WARPS,
        num_stages=STAGE2_STAGES,
    )
    if q.device.type == 'cuda':
        dtype = str(q.dtype).removeprefix('torch.')
        variant = dict(constexprs, dtype=dtype, num_stages=config.num_stages)
        record_launch('decode_stage1', variant, stage1, q.device)
        variant = dict(stage2_constexprs, dtype=dtype, num_stages=STAGE2_STAGES)
        record_launch('decode_stage2', variant, stage2, q.device)
