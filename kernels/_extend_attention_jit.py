"""Triton kernel behind :func:`vla_sched.kernels.extend_attention.extend_attention`.

Imported on the first launch, not with the package, so that the 'torch' backend imports
without Triton and ``TRITON_INTERPRET`` only has to be set before the first launch.
Inputs are validated by the public launcher; this module only launches.

One program per (block of new tokens, group of query heads, request). Its BLOCK_M rows are
HEADS_PER_PROGRAM query heads of one KV head (the whole GQA group, or one head) times
BLOCK_M // HEADS_PER_PROGRAM tokens, token-major, so a packed program streams its KV head's
prefix once for the whole group. The grid's fastest axis is the token block and the next
the head group, so the programs that read one request's KV head run side by side and share
its tiles in L2. Stage 1 streams the request's cached prefix through the slot table (every
prefix key is visible); stage 2 streams the request's new K/V from the contiguous
``k``/``v`` up to the last key any row of the block may see (causal end, or the image span's
end when the block overlaps the span). Both stages feed one online softmax kept in base 2.
"""

# Triton spells compile-time constants in upper case, and a constexpr branch is clearer as
# an if/else block than as a ternary.
# ruff: noqa: SIM108

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vla_sched.kernels._validate import check_interpreter_numpy
from vla_sched.kernels.attention_configs import ExtendConfig
from vla_sched.kernels.residency import record_launch

LOG2E = 1.4426950408889634


@triton.jit
def _online_softmax_step(qk, v, m_i, l_i, acc, DOT_FP32: tl.constexpr):
    """Folds one tile of base-2 scores ``qk`` [M, N] (-inf where masked) and its values
    ``v`` [N, Dv] into the running max, sum and accumulator."""
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    # A row with no visible key so far keeps max -inf; shift by 0 instead to avoid NaN.
    m_shift = tl.where(m_new == float('-inf'), 0.0, m_new)
    alpha = tl.exp2(m_i - m_shift)
    p = tl.exp2(qk - m_shift[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    if DOT_FP32:
        pv = tl.dot(p, v.to(tl.float32), input_precision='ieee')
    else:
        pv = tl.dot(p.to(v.dtype), v)
    return m_new, l_i, acc * alpha[:, None] + pv


@triton.jit
def _scores(q, k, sm_scale_log2, DOT_FP32: tl.constexpr):
    if DOT_FP32:
        qk = tl.dot(q, k.to(tl.float32), input_precision='ieee')
    else:
        qk = tl.dot(q, k)
    return qk * sm_scale_log2


@triton.jit
def _extend_kernel(
    q_ptr,  # [T, Hq, D], unit stride in D
    k_ptr,  # [T, Hkv, D]
    v_ptr,  # [T, Hkv, Dv]
    k_cache_ptr,  # [num_slots, Hkv, D], contiguous
    v_cache_ptr,  # [num_slots, Hkv, Dv], contiguous
    req_to_token_ptr,  # [num_rows, max_context_len], contiguous
    req_pool_indices_ptr,  # [B]
    prefix_lens_ptr,  # [B]
    extend_lens_ptr,  # [B]
    extend_start_loc_ptr,  # [B]
    image_spans_ptr,  # [B, 2] absolute [start, end); unused unless HAS_IMAGE_SPANS
    out_ptr,  # [T, Hq, Dv], unit stride in Dv
    sm_scale_log2,  # sm_scale * log2(e)
    stride_q_token,
    stride_q_head,
    stride_k_token,
    stride_k_head,
    stride_v_token,
    stride_v_head,
    stride_out_token,
    stride_out_head,
    stride_req_row,
    NUM_KV_HEADS: tl.constexpr,
    GROUP: tl.constexpr,  # query heads per KV head
    HEADS_PER_PROGRAM: tl.constexpr,  # GROUP (packed) or 1
    HEAD_DIM: tl.constexpr,
    V_HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,  # rows: HEADS_PER_PROGRAM heads x TOKENS tokens, token-major
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    HAS_IMAGE_SPANS: tl.constexpr,
    DOT_FP32: tl.constexpr,
):
    TOKENS: tl.constexpr = BLOCK_M // HEADS_PER_PROGRAM
    block_m = tl.program_id(0)
    head_group = tl.program_id(1)
    batch = tl.program_id(2)
    extend_len = tl.load(extend_lens_ptr + batch).to(tl.int32)
    if block_m * TOKENS < extend_len:
        kv_head = head_group * HEADS_PER_PROGRAM // GROUP
        prefix_len = tl.load(prefix_lens_ptr + batch).to(tl.int32)
        first_token = tl.load(extend_start_loc_ptr + batch).to(tl.int64)
        rows = tl.arange(0, BLOCK_M)
        # Each row's token (relative to the extend start) and query head.
        offs_m = block_m * TOKENS + rows // HEADS_PER_PROGRAM
        heads_m = head_group * HEADS_PER_PROGRAM + rows % HEADS_PER_PROGRAM
        mask_m = (offs_m < extend_len) & (rows < TOKENS * HEADS_PER_PROGRAM)
        offs_d = tl.arange(0, BLOCK_D)
        mask_d = offs_d < HEAD_DIM
        offs_dv = tl.arange(0, BLOCK_DV)
        mask_dv = offs_dv < V_HEAD_DIM
        tokens_m = first_token + offs_m

        q_rows = tokens_m * stride_q_token + heads_m * stride_q_head
        q = tl.load(
            q_ptr + q_rows[:, None] + offs_d[None, :],
            mask=mask_m[:, None] & mask_d[None, :],
            other=0.0,
        )
        if DOT_FP32:
            q = q.to(tl.float32)
        m_i = tl.full([BLOCK_M], float('-inf'), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)

        # Stage 1: the cached prefix, gathered through the slot table.
        row = tl.load(req_pool_indices_ptr + batch).to(tl.int64)
        slot_row_ptr = req_to_token_ptr + row * stride_req_row
        for start in range(0, prefix_len, BLOCK_N):
            offs_n = start + tl.arange(0, BLOCK_N)
            mask_n = offs_n < prefix_len
            slots = tl.load(slot_row_ptr + offs_n, mask=mask_n, other=0).to(tl.int64)
            k = tl.load(
                k_cache_ptr
                + (slots[None, :] * NUM_KV_HEADS + kv_head) * HEAD_DIM
                + offs_d[:, None],
                mask=mask_n[None, :] & mask_d[:, None],
                other=0.0,
            )
            qk = _scores(q, k, sm_scale_log2, DOT_FP32)
            qk = tl.where(mask_n[None, :], qk, float('-inf'))
            v = tl.load(
                v_cache_ptr
                + (slots[:, None] * NUM_KV_HEADS + kv_head) * V_HEAD_DIM
                + offs_dv[None, :],
                mask=mask_n[:, None] & mask_dv[None, :],
                other=0.0,
            )
            m_i, l_i, acc = _online_softmax_step(qk, v, m_i, l_i, acc, DOT_FP32)

        # Stage 2: the new tokens, causal (and bidirectional inside the image span).
        kv_end = tl.minimum((block_m + 1) * TOKENS, extend_len)
        if HAS_IMAGE_SPANS:
            span_start = tl.load(image_spans_ptr + batch * 2).to(tl.int32) - prefix_len
            span_end = tl.load(image_spans_ptr + batch * 2 + 1).to(tl.int32) - prefix_len
            overlaps = (block_m * TOKENS < span_end) & (span_start < kv_end)
            overlaps = overlaps & (span_start < span_end)
            kv_end = tl.where(
                overlaps, tl.maximum(kv_end, tl.minimum(span_end, extend_len)), kv_end
            )
            in_span_m = (offs_m >= span_start) & (offs_m < span_end)
        for start in range(0, kv_end, BLOCK_N):
            offs_n = start + tl.arange(0, BLOCK_N)
            mask_n = offs_n < extend_len
            tokens_n = first_token + offs_n
            k = tl.load(
                k_ptr
                + tokens_n[None, :] * stride_k_token
                + kv_head * stride_k_head
                + offs_d[:, None],
                mask=mask_n[None, :] & mask_d[:, None],
                other=0.0,
            )
            visible = offs_m[:, None] >= offs_n[None, :]
            if HAS_IMAGE_SPANS:
                in_span_n = (offs_n >= span_start) & (offs_n < span_end)
                visible = visible | (in_span_m[:, None] & in_span_n[None, :])
            visible = visible & mask_n[None, :]
            qk = _scores(q, k, sm_scale_log2, DOT_FP32)
            qk = tl.where(visible, qk, float('-inf'))
            v = tl.load(
                v_ptr
                + tokens_n[:, None] * stride_v_token
                + kv_head * stride_v_head
                + offs_dv[None, :],
                mask=mask_n[:, None] & mask_dv[None, :],
                other=0.0,
            )
            m_i, l_i, acc = _online_softmax_step(qk, v, m_i, l_i, acc, DOT_FP32)

        result = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
        out_rows = tokens_m * stride_out_token + heads_m * stride_out_head
        tl.store(
            out_ptr + out_rows[:, None] + offs_dv[None, :],
            result.to(out_ptr.dtype.element_ty),
            mask=mask_m[:, None] & mask_dv[None, :],
        )


def launch_extend_attention(
    *,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    prefix_lens: torch.Tensor,
    extend_lens: torch.Tensor,
    extend_start_loc: torch.Tensor,
    max_extend_len: int,
    out: torch.Tensor,
    sm_scale: float,
    image_spans: torch.Tensor | None,
    config: ExtendConfig,
) -> None:
    """Launches the kernel with ``config``; every argument was validated by the caller."""
    if q.device.type != 'cuda':
        check_interpreter_numpy()
    _, num_q_heads, head_dim = q.shape
    num_kv_heads, v_head_dim = v_cache.shape[1], v_cache.shape[2]
    group = num_q_heads // num_kv_heads
    heads = config.heads_per_program
    if heads not in (1, group):
        raise ValueError(f'heads_per_program must be 1 or the GQA group {group}, got {heads}')
    num_token_blocks = triton.cdiv(max_extend_len, config.tokens_per_program)
    grid = (num_token_blocks, num_q_heads // heads, req_pool_indices.shape[0])
    constexprs = dict(
        NUM_KV_HEADS=num_kv_heads,
        GROUP=group,
        HEADS_PER_PROGRAM=heads,
        HEAD_DIM=head_dim,
        V_HEAD_DIM=v_head_dim,
        BLOCK_M=config.block_m,
        BLOCK_N=config.block_n,
        BLOCK_D=triton.next_power_of_2(head_dim),
        BLOCK_DV=triton.next_power_of_2(v_head_dim),
        HAS_IMAGE_SPANS=image_spans is not None,
        DOT_FP32=q.dtype == torch.float32 or q.device.type != 'cuda',
    )
    compiled = _extend_kernel[grid](
        q,
        k,
        v,
        k_cache,
        v_cache,
        req_to_token,
        req_pool_indices,
        prefix_lens,
        extend_lens,
        extend_start_loc,
        image_spans if image_spans is not None else extend_lens,
        out,
        sm_scale * LOG2E,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        out.stride(0),
        out.stride(1),
        req_to_token.stride(0),
        **constexprs,
        num_warps=config.num_warps,
        num_stages=config.num_stages,
    )
    if q.device.type == 'cuda':
        dtype = str(q.dtype).removeprefix('torch.')
        variant = dict(constexprs, dtype=dtype, num_stages=config.num_stages)
        record_launch('extend', variant, compiled, q.device)
